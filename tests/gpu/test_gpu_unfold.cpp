// unfold2d / fold2d on CUDA against the CPU reference, forward and backward (each is the other's backward):
// unfold is a copy and fold sums in the same order in fp32 (fp64 for f64) on both sides, so results are
// compared bit for bit. Odd sizes, stride, padding, dilation, non-square kernels, f32 / bf16 / f16 / f64 / fp8,
// non-contiguous inputs, poisoned CUDA allocations. Every fold kernel variant (cuda/kernels/unfold.cuh: 1 old, 2 tiles,
// 3 tiles2) and unfold kernel variant (1 old, 2 staged, 3 vec) runs against the CPU, and the variants are
// compared bit for bit with each other.
#include <algorithm>
#include <cstdlib>

#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

#include "hadatrain/ops/unfold.h"
#include "cuda/kernels/unfold.cuh"  // set_fold_variant, fold_tiles_launches, fold_tiles2_launches, unfold_vec_launches

using namespace ht;

namespace {

using Case = test::UnfoldCase;
using test::window;

const std::vector<Case> kCases = {
    {3, 5, 13, 11, window(3, 3, 1, 1, 1, 1, 1, 1)},  {2, 3, 17, 15, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {1, 7, 9, 10, window(3, 3, 1, 1, 2, 2, 2, 2)},   {3, 2, 8, 13, window(2, 5, 1, 2, 0, 2, 1, 1)},
    {5, 3, 7, 7, window(1, 1, 1, 1, 0, 0, 1, 1)},    {2, 4, 11, 9, window(3, 2, 3, 2, 1, 0, 2, 1)},
    {2, 3, 32, 32, window(7, 7, 2, 2, 3, 3, 1, 1)},  // stem-like
    // fold variant 2's tiling: partial channel groups and w tiles (halo between tiles), > 256 staged entries
    // per position, ResNet / ViT-like windows, and a dilation whose ring does not fit (variant 1 runs)
    {2, 70, 12, 37, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 64, 5, 2, window(5, 5, 1, 1, 2, 2, 1, 1)},
    {2, 64, 16, 16, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 32, 16, 16, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {3, 16, 9, 9, window(1, 1, 2, 2, 0, 0, 1, 1)},   {2, 3, 32, 32, window(4, 4, 4, 4, 0, 0, 1, 1)},
    {1, 5, 20, 45, window(7, 7, 1, 1, 3, 3, 1, 1)},  {1, 9, 14, 40, window(3, 5, 2, 3, 2, 1, 2, 3)},
    {1, 2, 64, 64, window(3, 3, 1, 1, 30, 30, 30, 30)},
    // fold variant 3's tiling: a partial last row chunk (R 4), row chunks under stride 2 (odd H and W), row
    // dilation with a w stride, 1x1 s2 with 64-channel groups (16-byte units of 2-byte columns)
    {2, 24, 23, 20, window(3, 3, 1, 1, 1, 1, 1, 1)}, {2, 16, 29, 35, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {1, 12, 26, 19, window(5, 3, 1, 2, 4, 1, 2, 1)}, {2, 136, 10, 10, window(1, 1, 2, 2, 0, 0, 1, 1)},
    // unfold variant 3 with partial channel groups: the patch of 216 channels does not fit 48 KB, so the channel
    // group is halved (bf16 108) and rounded down to a 16-byte run (104: groups 104, 104, 8)
    {1, 216, 6, 33, window(3, 3, 1, 1, 1, 1, 1, 1)},
};

// Whether fold variant 3 takes its halo tiles kernel (Note [Fold, tiles2]): 3x3 windows at stride and dilation 1,
// not f64.
bool fold_halo_fits(const Case& cs, DType dt) {
  const Unfold2dParams& p = cs.p;
  return p.kernel_h == 3 && p.kernel_w == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && dt != DType::f64;
}

// Whether unfold variant 3 takes its vec kernel (Note [Unfold, vec kernel]): the columns' rows and channel groups
// are whole 16-byte packs (K·itemsize % 16 == 0; on these cases a fitting channel group then exists but for the
// dilation-30 case, whose f64 group is one channel).
bool unfold_vec_fits(const Case& cs, DType dt) {
  const int64_t K = cs.C * cs.p.kernel_h * cs.p.kernel_w;
  return K * static_cast<int64_t>(itemsize(dt)) % 16 == 0 && cs.p.dilation_h < 30;
}

// Restores the environment's fold / unfold kernel variants when a test ends.
struct FoldVariantGuard {
  ~FoldVariantGuard() {
    kernels::set_fold_variant(0);
    kernels::set_unfold_variant(0);
  }
};

}  // namespace

TEST_CASE("unfold2d and fold2d on CUDA equal the CPU, forward and backward", "[gpu][unfold]") {
  FoldVariantGuard restore;
  // pass v runs fold variant min(v, kFoldVariants) and unfold variant min(v, kUnfoldVariants)
  for (int variant = 1; variant <= std::max(kernels::kFoldVariants, kernels::kUnfoldVariants); ++variant) {
    kernels::set_fold_variant(std::min(variant, kernels::kFoldVariants));
    kernels::set_unfold_variant(std::min(variant, kernels::kUnfoldVariants));
    uint64_t seed = 1;
    for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8e4m3}) {
      for (const Case& cs : kCases) {
        INFO("fold / unfold variant " << variant << " " << dtype_name(dt) << " " << test::describe(cs));
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
}

// fold2d of contiguous columns (the layout the im2col convolutions' backward folds) and of channels-last-like
// strided columns, every variant against the CPU and against each other bit for bit; variants 2 and 3 take the
// tiles kernel except where its stage does not fit (the 30-dilation case), with and without the variant set;
// variant 3 its halo form on 3x3 stride-1 windows (fold_halo_fits).
TEST_CASE("fold2d kernel variants agree bit for bit with the CPU and each other", "[gpu][unfold]") {
  FoldVariantGuard restore;
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
        Tensor first;
        for (int variant = 1; variant <= kernels::kFoldVariants; ++variant) {
          INFO("fold variant " << variant << (layout == 0 ? " contiguous" : " strided") << " columns");
          kernels::set_fold_variant(variant);
          const int64_t tiles0 = kernels::fold_tiles_launches(), halo0 = kernels::fold_tiles2_launches();
          const Tensor out = fold2d(cg, fp);
          const bool huge = cs.p.dilation_h >= 30;  // the one case whose stage exceeds 48 KB (variant 1 runs)
          CHECK(kernels::fold_tiles_launches() == tiles0 + (variant >= 2 && !huge ? 1 : 0));
          CHECK(kernels::fold_tiles2_launches() == halo0 + (variant == 3 && fold_halo_fits(cs, dt) ? 1 : 0));
          CHECK(test::compare_bits(out, ref) == "");
          if (variant == 1) first = out.to(Device::cpu());
          else CHECK(test::compare_bits(out, first) == "");
        }
        // no variant set: tiles2, the default (tiles where the halo form does not apply)
        const char* env = std::getenv("HADATRAIN_FOLD_KERNEL");
        if (env == nullptr || *env == '\0') {
          INFO("default fold variant" << (layout == 0 ? " contiguous" : " strided") << " columns");
          kernels::set_fold_variant(0);
          const int64_t tiles0 = kernels::fold_tiles_launches(), halo0 = kernels::fold_tiles2_launches();
          const Tensor out = fold2d(cg, fp);
          CHECK(kernels::fold_tiles_launches() == tiles0 + (cs.p.dilation_h >= 30 ? 0 : 1));
          CHECK(kernels::fold_tiles2_launches() == halo0 + (fold_halo_fits(cs, dt) ? 1 : 0));
          CHECK(test::compare_bits(out, ref) == "");
        }
      }
    }
  }
}

// unfold2d of contiguous NCHW images, channels-last images viewed as NCHW (the HLQ convolutions' layout) and
// strided slices, every variant against the CPU and against each other bit for bit (a copy); variant 2 takes its
// staged kernel on every case here (their patches fit in 48 KB); variant 3 its vec kernel where the packs fit
// (unfold_vec_fits), else the staged kernel. Channels-last images whose channel units are 16-byte aligned
// (C·itemsize % 16 == 0, a fresh allocation) take the vec kernel's 16-byte staging loads; the channel slice
// (offset by one element) does not.
TEST_CASE("unfold2d kernel variants agree bit for bit with the CPU and each other", "[gpu][unfold]") {
  FoldVariantGuard restore;
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
        Tensor first;
        for (int variant = 1; variant <= kernels::kUnfoldVariants; ++variant) {
          INFO("unfold variant " << variant << " " << layouts[li]);
          kernels::set_unfold_variant(variant);
          const int64_t staged0 = kernels::unfold_staged_launches(), vec0 = kernels::unfold_vec_launches();
          const Tensor out = unfold2d(xg, cs.p);
          const bool vec = variant == 3 && unfold_vec_fits(cs, dt);
          CHECK(kernels::unfold_vec_launches() == vec0 + (vec ? 1 : 0));
          CHECK(kernels::unfold_staged_launches() == staged0 + (variant == 2 || (variant == 3 && !vec) ? 1 : 0));
          CHECK(test::compare_bits(out, ref) == "");
          if (variant == 1) first = out.to(Device::cpu());
          else CHECK(test::compare_bits(out, first) == "");
        }
        // no variant set: vec, the default (staged where its packs do not fit)
        const char* env = std::getenv("HADATRAIN_UNFOLD_KERNEL");
        if (env == nullptr || *env == '\0') {
          INFO("default unfold variant " << layouts[li]);
          kernels::set_unfold_variant(0);
          const int64_t staged0 = kernels::unfold_staged_launches(), vec0 = kernels::unfold_vec_launches();
          const Tensor out = unfold2d(xg, cs.p);
          const bool vec = unfold_vec_fits(cs, dt);
          CHECK(kernels::unfold_vec_launches() == vec0 + (vec ? 1 : 0));
          CHECK(kernels::unfold_staged_launches() == staged0 + (vec ? 0 : 1));
          CHECK(test::compare_bits(out, ref) == "");
        }
      }
    }
  }
}
