// unfold2d / fold2d on CUDA against the CPU reference, forward and backward (each is the other's backward):
// unfold is a copy and fold sums in the same order in fp32 (fp64 for f64) on both sides, so results are
// compared bit for bit. Odd sizes, stride, padding, dilation, non-square kernels, f32 / bf16 / f16 / f64 / fp8,
// non-contiguous inputs, poisoned CUDA allocations. The cases reach every fold kernel (cuda/kernels/unfold.cuh:
// gather, tiles, tiles with halo) and every unfold kernel (gather, staged, vec); the launch counters check which
// one ran.
#include <algorithm>

#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

#include "hadatrain/ops/shape_ops.h"  // is_channels_last
#include "hadatrain/ops/unfold.h"
#include "cuda/kernels/unfold.cuh"  // fold_tiles_launches, fold_tiles2_launches, unfold_staged_launches, unfold_vec_launches

using namespace ht;

namespace {

using Case = test::UnfoldCase;
using test::window;

const std::vector<Case> kCases = {
    {3, 5, 13, 11, window(3, 3, 1, 1, 1, 1, 1, 1)},  {2, 3, 17, 15, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {1, 7, 9, 10, window(3, 3, 1, 1, 2, 2, 2, 2)},   {3, 2, 8, 13, window(2, 5, 1, 2, 0, 2, 1, 1)},
    {5, 3, 7, 7, window(1, 1, 1, 1, 0, 0, 1, 1)},    {2, 4, 11, 9, window(3, 2, 3, 2, 1, 0, 2, 1)},
    {2, 3, 32, 32, window(7, 7, 2, 2, 3, 3, 1, 1)},  // stem-like
    // the fold tiles kernel's tiling: partial channel groups and w tiles (halo between tiles), > 256 staged
    // entries per position, ResNet / ViT-like windows, and a dilation whose stage does not fit (fold's gather
    // kernel runs)
    {2, 70, 12, 37, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 64, 5, 2, window(5, 5, 1, 1, 2, 2, 1, 1)},
    {2, 64, 16, 16, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 32, 16, 16, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {3, 16, 9, 9, window(1, 1, 2, 2, 0, 0, 1, 1)},   {2, 3, 32, 32, window(4, 4, 4, 4, 0, 0, 1, 1)},
    {1, 5, 20, 45, window(7, 7, 1, 1, 3, 3, 1, 1)},  {1, 9, 14, 40, window(3, 5, 2, 3, 2, 1, 2, 3)},
    {1, 2, 64, 64, window(3, 3, 1, 1, 30, 30, 30, 30)},
    // a dilation whose unfold patch does not fit either (161 x 161 elements: both gather kernels run)
    {1, 2, 64, 64, window(3, 3, 1, 1, 80, 80, 80, 80)},
    // the halo tiling: a partial last row chunk (R 4), row chunks under stride 2 (odd H and W), row
    // dilation with a w stride, 1x1 s2 with 64-channel groups (16-byte units of 2-byte columns)
    {2, 24, 23, 20, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 16, 29, 35, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {1, 12, 26, 19, window(5, 3, 1, 2, 4, 1, 2, 1)}, {2, 136, 10, 10, window(1, 1, 2, 2, 0, 0, 1, 1)},
    // the unfold vec kernel with partial channel groups: the patch of 216 channels does not fit 48 KB, so the channel
    // group is halved (bf16 108) and rounded down to a 16-byte run (104: groups 104, 104, 8)
    {1, 216, 6, 33, window(3, 3, 1, 1, 1, 1, 1, 1)},
};

// Whether fold takes the halo form of its tiles kernel (Note [Fold, tiles2]): 3x3 windows at stride and
// dilation 1, not f64.
bool fold_halo_fits(const Case& cs, DType dt) {
  const Unfold2dParams& p = cs.p;
  return p.kernel_h == 3 && p.kernel_w == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && dt != DType::f64;
}

// Whether fold's tiles kernel fits its stage in 48 KB: every case but the dilated ones (30 and 80), which take
// fold's gather kernel.
bool fold_tiles_fit(const Case& cs) { return cs.p.dilation_h < 30; }

// Whether unfold's staged kernel fits its patch in 48 KB: every case but the dilation-80 one, which takes
// unfold's gather kernel.
bool unfold_patch_fits(const Case& cs) { return cs.p.dilation_h < 80; }

// Whether unfold takes its vec kernel (Note [Unfold, vec kernel]): the columns' rows and channel groups are whole
// 16-byte packs (K·itemsize % 16 == 0; on these cases a fitting channel group then exists but for the dilated
// cases, whose f64 group is one channel).
bool unfold_vec_fits(const Case& cs, DType dt) {
  const int64_t K = cs.C * cs.p.kernel_h * cs.p.kernel_w;
  return K * static_cast<int64_t>(itemsize(dt)) % 16 == 0 && cs.p.dilation_h < 30;
}

}  // namespace

TEST_CASE("unfold2d and fold2d on CUDA equal the CPU, forward and backward", "[gpu][unfold]") {
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8e4m3}) {
    for (const Case& cs : kCases) {
      INFO(dtype_name(dt) << " " << test::describe(cs));
      test::PoisonGuard poison;
      const Fold2dParams fp{cs.C, cs.H, cs.W, cs.p};
      const bool grads = dt != DType::f8e4m3;  // fp8: forward only (the loss ops are not the subject here)
      // Forward unfold on a channels-last leaf viewed as NCHW (non-contiguous).
      const Tensor nhwc = test::random_input({cs.N, cs.H, cs.W, cs.C}, seed++, dt);
      Tensor lc = nhwc.detach(), lg = nhwc.to(test::kCuda).detach();
      lc.set_requires_grad(grads);
      lg.set_requires_grad(grads);
      const Tensor cols_c = unfold2d(lc.permute({0, 3, 1, 2}), cs.p);
      const Tensor cols_g = unfold2d(lg.permute({0, 3, 1, 2}), cs.p);
      CHECK(test::compare_bits(cols_g, cols_c) == "");
      if (grads) {  // backward of unfold = fold of a random (N, L, K) gradient
        const Tensor gc = test::random_input(cols_c.shape(), seed++, dt);
        sum(mul(cols_c, gc)).backward();
        sum(mul(cols_g, gc.to(test::kCuda))).backward();
        REQUIRE(lg.grad().defined());
        CHECK(test::compare_bits(lg.grad(), lc.grad()) == "");
      }
      // Forward fold on a strided cols view ((N, K, L) transposed); backward = unfold.
      const Tensor ct = test::random_input({cols_c.size(0), cols_c.size(2), cols_c.size(1)}, seed++, dt);
      Tensor kc = ct.detach(), kg = ct.to(test::kCuda).detach();
      kc.set_requires_grad(grads);
      kg.set_requires_grad(grads);
      const Tensor img_c = fold2d(kc.transpose(1, 2), fp), img_g = fold2d(kg.transpose(1, 2), fp);
      CHECK(test::compare_bits(img_g, img_c) == "");
      if (grads) {
        const Tensor gi = test::random_input(img_c.shape(), seed++, dt);
        sum(mul(img_c, gi)).backward();
        sum(mul(img_g, gi.to(test::kCuda))).backward();
        REQUIRE(kg.grad().defined());
        CHECK(test::compare_bits(kg.grad(), kc.grad()) == "");
      }
    }
  }
}

// fold2d of contiguous columns (the layout the im2col convolutions' backward folds) and of channels-last-like
// strided columns against the CPU bit for bit; the tiles kernel runs except where its stage does not fit (the
// dilated cases: the gather kernel), in its halo form on 3x3 stride-1 windows (fold_halo_fits).
TEST_CASE("fold2d kernels (gather, tiles, tiles with halo) equal the CPU bit for bit", "[gpu][unfold]") {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Case& cs : kCases) {
      INFO(dtype_name(dt) << " " << test::describe(cs));
      test::PoisonGuard poison;
      const Fold2dParams fp{cs.C, cs.H, cs.W, cs.p};
      const Tensor probe = unfold2d(test::random_input({1, cs.C, cs.H, cs.W}, seed, DType::f32), cs.p);
      const int64_t L = probe.size(1), K = probe.size(2);
      // contiguous (N, L, K) columns, and (L, N, K) storage viewed as (N, L, K) (strided rows)
      const Tensor cont = test::random_input({cs.N, L, K}, seed++, dt);
      const Tensor lnk = test::random_input({L, cs.N, K}, seed++, dt);
      for (int layout = 0; layout < 2; ++layout) {
        const Tensor cols = layout == 0 ? cont : lnk.transpose(0, 1);
        const Tensor ref = fold2d(cols, fp);
        // the same view of the device copy of the storage
        const Tensor cg = layout == 0 ? cont.to(test::kCuda) : lnk.to(test::kCuda).transpose(0, 1);
        INFO((layout == 0 ? "contiguous" : "strided") << " columns");
        const int64_t tiles0 = kernels::fold_tiles_launches(), halo0 = kernels::fold_tiles2_launches();
        const Tensor out = fold2d(cg, fp);
        CHECK(kernels::fold_tiles_launches() == tiles0 + (fold_tiles_fit(cs) ? 1 : 0));
        CHECK(kernels::fold_tiles2_launches() == halo0 + (fold_halo_fits(cs, dt) ? 1 : 0));
        CHECK(test::compare_bits(out, ref) == "");
        // Note [Fold, channels-last output]: the same kernel, its elements taken c fastest and written (N, H, W, C);
        // the same bits as the CPU's contiguous fold, and the CPU's channels-last fold
        Fold2dParams fp_cl = fp;
        fp_cl.channels_last = true;
        const int64_t tiles1 = kernels::fold_tiles_launches(), halo1 = kernels::fold_tiles2_launches();
        const Tensor out_cl = fold2d(cg, fp_cl);
        CHECK(kernels::fold_tiles_launches() == tiles1 + (fold_tiles_fit(cs) ? 1 : 0));
        CHECK(kernels::fold_tiles2_launches() == halo1 + (fold_halo_fits(cs, dt) ? 1 : 0));
        CHECK((cs.C == 1 || is_channels_last(out_cl)));
        CHECK(test::compare_bits(out_cl, ref) == "");
        CHECK(test::compare_bits(out_cl, fold2d(cols, fp_cl)) == "");
      }
    }
  }
}

// unfold2d of contiguous NCHW images, channels-last images viewed as NCHW (the HLQ convolutions' layout) and
// strided slices against the CPU bit for bit (a copy): the vec kernel where its packs fit (unfold_vec_fits), else
// the staged kernel where its patch fits in 48 KB, else (the dilation-80 case) the gather kernel. Channels-last
// images whose channel units are 16-byte aligned (C·itemsize % 16 == 0, a fresh allocation) take the vec
// kernel's 16-byte staging loads; the channel slice (offset by one element) does not.
TEST_CASE("unfold2d kernels (gather, staged, vec) equal the CPU bit for bit", "[gpu][unfold]") {
  uint64_t seed = 200;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const Case& cs : kCases) {
      INFO(dtype_name(dt) << " " << test::describe(cs));
      test::PoisonGuard poison;
      const Tensor nchw = test::random_input({cs.N, cs.C, cs.H, cs.W}, seed++, dt);
      const Tensor nhwc = test::random_input({cs.N, cs.H, cs.W, cs.C}, seed++, dt);
      const Tensor wide = test::random_input({cs.N, cs.C, cs.H, cs.W + 3}, seed++, dt);
      const Tensor nhwc_wide = test::random_input({cs.N, cs.H, cs.W, cs.C + 1}, seed++, dt);
      const char* const layouts[] = {"nchw", "nhwc view", "w slice", "nhwc channel slice"};
      const std::vector<Tensor> images = {nchw, nhwc.permute({0, 3, 1, 2}), wide.narrow(3, 1, cs.W),
                                          nhwc_wide.narrow(3, 1, cs.C).permute({0, 3, 1, 2})};
      for (std::size_t li = 0; li < images.size(); ++li) {
        const Tensor ref = unfold2d(images[li], cs.p);
        // the same view of the device copy of the storage
        Tensor xg;
        if (li == 0) xg = nchw.to(test::kCuda);
        else if (li == 1) xg = nhwc.to(test::kCuda).permute({0, 3, 1, 2});
        else if (li == 2) xg = wide.to(test::kCuda).narrow(3, 1, cs.W);
        else xg = nhwc_wide.to(test::kCuda).narrow(3, 1, cs.C).permute({0, 3, 1, 2});
        INFO(layouts[li]);
        const int64_t staged0 = kernels::unfold_staged_launches(), vec0 = kernels::unfold_vec_launches();
        const Tensor out = unfold2d(xg, cs.p);
        const bool vec = unfold_vec_fits(cs, dt);
        CHECK(kernels::unfold_vec_launches() == vec0 + (vec ? 1 : 0));
        CHECK(kernels::unfold_staged_launches() == staged0 + (!vec && unfold_patch_fits(cs) ? 1 : 0));
        CHECK(test::compare_bits(out, ref) == "");
      }
    }
  }
}
