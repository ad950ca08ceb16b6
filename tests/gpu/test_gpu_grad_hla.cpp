// HLA projection on CUDA against the CPU reference, bit for bit (include/hadatrain/grad/hla.h: both sides
// convert to f32 and run the same butterfly with round-to-nearest adds): L in {16, 64, 196 (n 4), 784 (n 16),
// 1024, 197 (n 1), 2048 (n > 1024, large shared memory)}, odd B and C, f32 / bf16 / f16 / f64 / fp8 inputs,
// both layouts, non-contiguous inputs, every rank kind, poisoned CUDA allocations; the reported max |out|; every
// pass count of the butterfly, 1 to 5 (Note [HLA butterfly passes] in cuda/kernels/hla.cu), and partial column tiles;
// the register kernel for n <= 16 (Note [HLA small blocks]) on split_extra's narrowed views; the wide kernel for
// 256 <= n <= 2048 (Note [HLA wide blocks]) and the cases it leaves to the slab kernel.
// grad::hla_project_unfolded on CUDA (the fused im2col kernel) against the CPU composition
// hla_project(unfold2d(...)), bit for bit: NCHW and channels-last images, 3x3 s1/s2 p1, 1x1 s1/s2, 2x2
// dilation 2, 4x4 stride-4 patches, C 3 and 37, maps 32x32 (n 1024), 16x16, 14x14 (n 4) and 7x7 (n 1),
// bf16 / f32 and f16 / f64 / fp8, both layouts, absmax, rank 50 % and full, with no unfold2d launched; a
// flipped (negative-stride) view, which the fused kernel does not index, through the composition fallback.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

#include "hadatrain/grad/hla.h"
#include "hadatrain/ops/ops.h"
#include "cuda/kernels/hla.cuh"     // hla_wide_launches
#include "cuda/kernels/unfold.cuh"  // unfold_staged_launches, unfold_vec_launches

using namespace ht;
using grad::HlaLayout;
using grad::HlaPlan;
using grad::HlaRank;

namespace {

// CUDA and CPU projections of the same values in both layouts; "" when the bits agree.
std::string check_project(const Tensor& x_cpu, const HlaPlan& plan) {
  test::PoisonGuard poison;
  const Tensor x_gpu = x_cpu.to(test::kCuda);
  for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
    Tensor max_cpu, max_gpu;  // max |projection|, reported by the projection (HLQ's 8-bit quantiser uses it)
    const Tensor expected = grad::hla_project(x_cpu, plan, layout, &max_cpu);
    const Tensor actual = grad::hla_project(x_gpu, plan, layout, &max_gpu);
    if (actual.device() != test::kCuda) return "result not on CUDA";
    const std::string err = test::compare_bits(actual, expected);
    if (!err.empty()) return std::string(layout == HlaLayout::rows ? "rows: " : "channels: ") + err;
    const std::string merr = test::compare_bits(max_gpu, max_cpu);
    if (!merr.empty()) return "absmax: " + merr;
  }
  return "";
}

// CUDA unfold2d launches in this process: every one counts here (the vec kernel, or the staged kernel where its
// packs do not fit; these shapes never reach the gather kernel, whose patch would not fit in 48 KB).
int64_t unfold_launches() { return kernels::unfold_staged_launches() + kernels::unfold_vec_launches(); }

}  // namespace

TEST_CASE("hla_project on CUDA equals the CPU bit for bit", "[gpu][hla]") {
  uint64_t seed = 1;
  for (int64_t L : {16, 64, 196, 784, 1024, 197}) {
    for (int64_t C : {37, 67}) {
      for (DType dt : {DType::bf16, DType::f32}) {
        const Tensor x = test::random_input({3, L, C}, seed++, dt, -4, 4);  // (B, L, C)
        for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::of_pct(10), HlaRank::all()}) {
          const HlaPlan plan = grad::hla_plan(L, rank);
          INFO(dtype_name(dt) << " C " << C << " " << plan.describe());
          CHECK(check_project(x, plan) == "");
        }
      }
    }
  }
}

TEST_CASE("hla_project on CUDA reads non-contiguous inputs and every floating dtype", "[gpu][hla]") {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8e4m3}) {
    for (int64_t L : {64, 784}) {
      INFO(dtype_name(dt) << " L " << L);
      // (B, C, L) transposed to (B, L, C): channels are strided, L contiguous.
      const Tensor xt = test::random_input({5, 37, L}, seed++, dt, -3, 3).transpose(1, 2);
      REQUIRE_FALSE(xt.is_contiguous());
      CHECK(check_project(xt, grad::hla_plan(L, HlaRank::of_pct(50))) == "");
      // A slice along C: row stride larger than C.
      const Tensor xs = slice(test::random_input({3, L, 70}, seed++, dt, -3, 3), 2, 1, 68, 1);
      CHECK(check_project(xs, grad::hla_plan(L, HlaRank::of_rows(7))) == "");
    }
  }
}

TEST_CASE("hla_project on CUDA handles blocks beyond 1024, wide tiles and tiny channel counts", "[gpu][hla]") {
  // n = 2048: eight channels per CTA, 73 KiB of shared memory; full rank keeps all 2048 rows.
  const Tensor x = test::random_input({1, 2048, 19}, 7, DType::bf16, -2, 2);
  CHECK(check_project(x, grad::hla_plan(2048, HlaRank::of_pct(50))) == "");
  CHECK(check_project(x, grad::hla_plan(2048, HlaRank::all())) == "");
  // n = 8192 (one or two channels per CTA), C = 1.
  const Tensor y = test::random_input({1, 8192, 3}, 8, DType::f32, -2, 2);
  CHECK(check_project(y, grad::hla_plan(8192, HlaRank::of_pct(25))) == "");
  const Tensor z = test::random_input({3, 96, 1}, 9, DType::f32, -2, 2);
  CHECK(check_project(z, grad::hla_plan(96, HlaRank::of_pct(50))) == "");
  // Small blocks take wide channel tiles (n 4: 256 channels per CTA, n 16: 128): several tiles plus a partial one.
  const Tensor w4 = test::random_input({3, 196, 601}, 10, DType::bf16, -2, 2);
  CHECK(check_project(w4, grad::hla_plan(196, HlaRank::of_pct(50))) == "");
  const Tensor w16 = test::random_input({3, 48, 333}, 11, DType::f32, -2, 2);
  CHECK(check_project(w16, grad::hla_plan(48, HlaRank::all())) == "");
  // Empty batch: nothing to write, right shape.
  const Tensor e =
      grad::hla_project(zeros({0, 64, 5}, {DType::f32, test::kCuda}), grad::hla_plan(64, HlaRank::of_pct(50)));
  CHECK(e.shape() == Shape{0, 36, 5});
}

TEST_CASE("hla_project on CUDA equals the CPU bit for bit for 1 to 5 butterfly passes", "[gpu][hla]") {
  // Butterfly passes of at most 3 stages, the first fused with the load: n 4 (L 196: 2), 16 (L 48: 3 + 1), 32
  // (L 96 and 32: 3 + 2), 64 (3 + 3), 1024 (3 + 3 + 3 + 1), 2048 (3 + 3 + 3 + 2), 8192 (3 + 3 + 3 + 3 + 1); odd C,
  // a partial channel tile, strided (transposed) inputs.
  uint64_t seed = 300;
  struct Case {
    int64_t B, L, C;
    HlaRank rank;
  };
  const Case cases[] = {
      {3, 196, 37, HlaRank::of_pct(50)},  {2, 48, 333, HlaRank::all()},    {3, 64, 67, HlaRank::of_pct(50)},
      {2, 1024, 37, HlaRank::of_pct(50)}, {2, 1024, 19, HlaRank::all()},   {1, 2048, 19, HlaRank::of_pct(50)},
      {1, 8192, 3, HlaRank::of_pct(25)},  {3, 96, 1, HlaRank::of_pct(50)}, {2, 32, 300, HlaRank::all()}};
  for (const Case& c : cases)
    for (DType dt : {DType::bf16, DType::f32}) {
      const Tensor x = test::random_input({c.B, c.L, c.C}, seed++, dt, -4, 4);
      const HlaPlan plan = grad::hla_plan(c.L, c.rank);
      INFO(dtype_name(dt) << " B " << c.B << " C " << c.C << " " << plan.describe());
      CHECK(check_project(x, plan) == "");
    }
  // Channels strided (a transposed (B, C, L) tensor).
  const Tensor xt = test::random_input({2, 37, 1024}, seed++, DType::bf16, -3, 3).transpose(1, 2);
  CHECK(check_project(xt, grad::hla_plan(1024, HlaRank::of_pct(50))) == "");
}

TEST_CASE("hla_project on CUDA: blocks of n <= 16 in registers, split_extra's views", "[gpu][hla]") {
  // Note [HLA small blocks]: n 1, 2, 4, 8, 16 through the register kernel, several blocks per CTA with a partial
  // last group (L 196: 49 blocks, 8 a CTA at 256 channels), narrow tiles (C 5: every block in one CTA), a
  // partial channel tile (C 601), and the leading token left out as split_extra does (x[:, 1:, :] of
  // (B, L + 1, C): sample stride (L + 1)·C).
  uint64_t seed = 500;
  struct Case {
    int64_t B, L, C;
    HlaRank rank;
  };
  const Case cases[] = {{3, 196, 601, HlaRank::of_pct(50)}, {2, 200, 37, HlaRank::of_pct(50)},
                        {2, 98, 300, HlaRank::all()},       {3, 208, 67, HlaRank::of_pct(50)},
                        {2, 48, 5, HlaRank::of_rows(3)},    {2, 196, 5, HlaRank::of_pct(25)},
                        {2, 197, 33, HlaRank::of_pct(50)}};
  for (const Case& c : cases)
    for (DType dt : {DType::bf16, DType::f32}) {
      const Tensor full = test::random_input({c.B, c.L + 1, c.C}, seed++, dt, -4, 4);
      const Tensor x = narrow(full, 1, 1, c.L);  // a view: not contiguous
      const HlaPlan plan = grad::hla_plan(c.L, c.rank);
      INFO(dtype_name(dt) << " B " << c.B << " C " << c.C << " " << plan.describe());
      CHECK(check_project(x, plan) == "");
      CHECK(check_project(full.contiguous().narrow(1, 0, c.L).contiguous(), plan) == "");
    }
}

TEST_CASE("grad::hla_project_unfolded on CUDA equals the CPU composition bit for bit", "[gpu][hla]") {
  struct Window {
    const char* name;
    Unfold2dParams p;
  };
  const Window windows[] = {{"3x3 s1 p1", test::square_window(3, 1, 1)}, {"3x3 s2 p1", test::square_window(3, 2, 1)},
                            {"1x1 s1", test::square_window(1, 1, 0)},    {"1x1 s2", test::square_window(1, 2, 0)},
                            {"2x2 d2", test::square_window(2, 1, 0, 2)}, {"4x4 s4", test::square_window(4, 4, 0)}};
  const int64_t unfolds0 = unfold_launches();
  uint64_t seed = 500;
  for (int64_t side : {32, 16, 14, 7}) {
    for (int64_t C : {3, 37}) {
      for (DType dt : {DType::bf16, DType::f32}) {
        for (bool channels_last : {false, true}) {
          test::PoisonGuard poison;
          // channels-last: an (N, H, W, C) tensor viewed as (N, C, H, W), on both sides
          const Tensor stored = channels_last ? test::random_input({2, side, side, C}, seed++, dt, -4, 4)
                                              : test::random_input({2, C, side, side}, seed++, dt, -4, 4);
          const Tensor image = channels_last ? stored.permute({0, 3, 1, 2}) : stored;
          const Tensor image_gpu =
              channels_last ? stored.to(test::kCuda).permute({0, 3, 1, 2}) : stored.to(test::kCuda);
          REQUIRE(image_gpu.strides() == image.strides());
          for (const Window& w : windows) {
            const Tensor cols = unfold2d(image, w.p);  // (N, L, C·kh·kw) on the CPU
            for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::all()}) {
              const HlaPlan plan = grad::hla_plan(cols.size(1), rank);
              for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
                INFO(side << "x" << side << " C " << C << " " << dtype_name(dt)
                          << (channels_last ? " channels-last " : " NCHW ") << w.name << " " << plan.describe()
                          << (layout == HlaLayout::rows ? " rows" : " channels"));
                Tensor max_cpu, max_gpu;
                const Tensor expected = grad::hla_project(cols, plan, layout, &max_cpu);
                const Tensor actual = grad::hla_project_unfolded(image_gpu, w.p, plan, layout, &max_gpu);
                REQUIRE(actual.device() == test::kCuda);
                CHECK(test::compare_bits(actual, expected) == "");
                CHECK(test::compare_bits(max_gpu, max_cpu) == "");
              }
            }
          }
        }
      }
    }
  }
  CHECK(unfold_launches() == unfolds0);  // the fused kernel read the images: no columns were formed
}

TEST_CASE("grad::hla_project_unfolded on CUDA: every floating dtype, absmax", "[gpu][hla]") {
  uint64_t seed = 900;
  for (DType dt : {DType::f16, DType::f64, DType::f8e4m3, DType::bf16}) {
    test::PoisonGuard poison;
    const Tensor stored = test::random_input({3, 16, 16, 37}, seed++, dt, -3, 3);  // channels-last storage
    const Tensor image = stored.permute({0, 3, 1, 2});
    const Tensor image_gpu = stored.to(test::kCuda).permute({0, 3, 1, 2});
    for (const Unfold2dParams& w : {test::square_window(3, 1, 1), test::square_window(3, 2, 1)}) {
      const HlaPlan plan = grad::hla_plan(unfold2d(image, w).size(1), HlaRank::of_pct(50));
      for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
        INFO(dtype_name(dt) << " k 3 s " << w.stride_h << " " << plan.describe());
        Tensor max_cpu, max_gpu;
        const Tensor expected = grad::hla_project_unfolded(image, w, plan, layout, &max_cpu);
        const Tensor actual = grad::hla_project_unfolded(image_gpu, w, plan, layout, &max_gpu);
        REQUIRE(actual.device() == test::kCuda);
        CHECK(test::compare_bits(actual, expected) == "");
        CHECK(test::compare_bits(max_gpu, max_cpu) == "");
        CHECK(max_cpu.item() > 0);
      }
    }
  }
  // An empty batch: nothing to write, the right shape.
  const Tensor e = grad::hla_project_unfolded(zeros({0, 4, 8, 8}, {DType::f32, test::kCuda}),
                                              test::square_window(3, 1, 1), grad::hla_plan(64, HlaRank::of_pct(50)));
  CHECK(e.shape() == Shape{0, 36, 36});
}

TEST_CASE("grad::hla_project_unfolded on CUDA runs unfold2d + hla_project for a flipped view", "[gpu][hla]") {
  // The fused kernel indexes an image with non-negative int32 offsets (cuda/kernels/hla.cuh); a view with a negative
  // stride (here H flipped, through make_view) takes the composition instead, with the same bits. Offsets
  // beyond int32 would need an image of 2^31 elements (4 GiB in bf16, and the CPU reference as big): untested.
  const int64_t N = 2, C = 37, H = 16, W = 16;
  const Tensor stored = test::random_input({N, H, W, C}, 1000, DType::bf16, -3, 3);  // channels-last storage
  const Tensor stored_gpu = stored.to(test::kCuda);
  // (N, C, H, W) with row h of the view = row H − 1 − h of the storage
  auto flip_h = [&](const Tensor& t) {
    return make_view(t, Shape{N, C, H, W}, Strides{H * W * C, 1, -W * C, C}, t.offset() + (H - 1) * W * C);
  };
  const Unfold2dParams w = test::square_window(3, 1, 1);
  const HlaPlan plan = grad::hla_plan(H * W, HlaRank::of_pct(50));
  for (bool flipped : {true, false}) {
    const Tensor image = flipped ? flip_h(stored) : stored.permute({0, 3, 1, 2});
    const Tensor image_gpu = flipped ? flip_h(stored_gpu) : stored_gpu.permute({0, 3, 1, 2});
    for (HlaLayout layout : {HlaLayout::rows, HlaLayout::channels}) {
      INFO((flipped ? "flipped" : "channels-last") << (layout == HlaLayout::rows ? " rows" : " channels"));
      test::PoisonGuard poison;
      Tensor max_cpu, max_gpu;
      const Tensor expected = grad::hla_project_unfolded(image, w, plan, layout, &max_cpu);
      const int64_t unfolds0 = unfold_launches();
      const Tensor actual = grad::hla_project_unfolded(image_gpu, w, plan, layout, &max_gpu);
      CHECK(unfold_launches() == unfolds0 + (flipped ? 1 : 0));  // the composition only for the flipped view
      REQUIRE(actual.device() == test::kCuda);
      CHECK(test::compare_bits(actual, expected) == "");
      CHECK(test::compare_bits(max_gpu, max_cpu) == "");
    }
  }
  // The flip is real: the flipped view's projection differs from the unflipped one's.
  CHECK(grad::hla_project_unfolded(flip_h(stored), w, plan).to_vector<float>() !=
        grad::hla_project_unfolded(stored.permute({0, 3, 1, 2}), w, plan).to_vector<float>());
}

TEST_CASE("grad::hla_back_project on CUDA equals the CPU bit for bit", "[gpu][hla]") {
  // Note [HLA back-projection]: blocks of 1 to 2048 (one to five butterfly passes, the large-slab launch),
  // partial column tiles (C 37, 67, 3), f32 and bf16 inputs (a strided view among them), every output dtype.
  uint64_t seed = 300;
  for (int64_t L : {16, 64, 196, 1024, 197, 2048}) {
    for (int64_t C : {37, 67, 3}) {
      for (const HlaRank& rank : {HlaRank::of_pct(50), HlaRank::all()}) {
        const HlaPlan plan = grad::hla_plan(L, rank);
        const int64_t R = plan.projected_length();
        const Tensor g = test::random_input({3, R, C}, seed++, DType::f32, -4, 4);
        const Tensor gs = g.transpose(1, 2).contiguous().transpose(1, 2);  // (3, R, C) with channel stride R
        for (DType out : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
          INFO(plan.describe() << " C " << C << " out " << dtype_name(out));
          test::PoisonGuard poison;
          const Tensor want = grad::hla_back_project(g, plan, 1.0 / static_cast<double>(plan.block), out);
          const Tensor got = grad::hla_back_project(g.to(test::kCuda), plan, 1.0 / static_cast<double>(plan.block),
                                                    out);
          CHECK(got.device() == test::kCuda);
          CHECK(test::compare_bits(got, want) == "");
          if (out == DType::bf16) {
            const Tensor gb = gs.to(DType::bf16);
            CHECK(test::compare_bits(grad::hla_back_project(gb.to(test::kCuda), plan, 0.5, out),
                                     grad::hla_back_project(gb, plan, 0.5, out)) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("hla_project on CUDA: blocks of 256 to 2048 rows through the wide kernel", "[gpu][hla]") {
  // Note [HLA wide blocks]: rows layout, n 256 (shuffles only), 512, 1024, 2048 (1 to 3 stages after the exchange
  // through shared memory), several blocks per sample (L 6144, 768), 2- and 4-byte inputs, every rank kind, 8-column
  // runs from a column slice; a slice that breaks the 16-byte alignment takes the slab kernel, n 4096 too.
  uint64_t seed = 900;
  struct Case {
    int64_t B, L, C;
    DType dt;
    HlaRank rank;
  };
  const Case cases[] = {{2, 2048, 64, DType::bf16, HlaRank::of_pct(50)}, {1, 2048, 24, DType::f32, HlaRank::of_pct(10)},
                        {3, 1024, 40, DType::f16, HlaRank::all()},       {2, 512, 16, DType::bf16, HlaRank::of_pct(50)},
                        {2, 256, 8, DType::f32, HlaRank::of_pct(50)},    {1, 6144, 16, DType::bf16, HlaRank::of_pct(50)},
                        {2, 768, 32, DType::bf16, HlaRank::of_rows(7)},  {1, 4096, 8, DType::bf16, HlaRank::of_pct(50)}};
  for (const Case& c : cases) {
    const Tensor x = test::random_input({c.B, c.L, c.C}, seed++, c.dt, -4, 4);
    const HlaPlan plan = grad::hla_plan(c.L, c.rank);
    INFO(dtype_name(c.dt) << " B " << c.B << " C " << c.C << " " << plan.describe());
    const int64_t before = kernels::hla_wide_launches();
    CHECK(check_project(x, plan) == "");
    // one launch for the rows layout (the channels layout takes the slab kernel); n 4096 is beyond the kernel
    CHECK(kernels::hla_wide_launches() - before == (plan.block <= 2048 ? 1 : 0));
  }
  const Tensor wide = test::random_input({2, 1024, 40}, seed++, DType::bf16, -3, 3);
  const Tensor wide_gpu = wide.to(test::kCuda);
  const HlaPlan plan = grad::hla_plan(1024, HlaRank::of_pct(50));
  for (int64_t start : {8, 1}) {  // 16 bytes in: aligned runs; 2 bytes in: the slab kernel
    INFO("columns from " << start);
    const Tensor view = slice(wide_gpu, 2, start, start + 24, 1);  // row stride 40, on the device
    REQUIRE_FALSE(view.is_contiguous());
    const int64_t before = kernels::hla_wide_launches();
    const Tensor actual = grad::hla_project(view, plan, HlaLayout::rows);
    CHECK(kernels::hla_wide_launches() - before == (start == 8 ? 1 : 0));
    CHECK(test::compare_bits(actual, grad::hla_project(slice(wide, 2, start, start + 24, 1), plan, HlaLayout::rows)) ==
          "");
  }
}
