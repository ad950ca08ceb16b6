// unfold2d / fold2d on CUDA against the CPU reference, forward and backward (each is the other's backward):
// unfold is a copy and fold sums in the same order in fp32 (fp64 for f64) on both sides, so results are
// compared bit for bit. Odd sizes, stride, padding, dilation, non-square kernels, f32 / bf16 / f16 / f64 / fp8,
// non-contiguous inputs, poisoned CUDA allocations.
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"
#include "support/unfold_cases.h"

#include "hadatrain/ops/unfold.h"

using namespace ht;

namespace {

using Case = test::UnfoldCase;
using test::window;

const std::vector<Case> kCases = {
    {3, 5, 13, 11, window(3, 3, 1, 1, 1, 1, 1, 1)},  {2, 3, 17, 15, window(3, 3, 2, 2, 1, 1, 1, 1)},
    {1, 7, 9, 10, window(3, 3, 1, 1, 2, 2, 2, 2)},   {3, 2, 8, 13, window(2, 5, 1, 2, 0, 2, 1, 1)},
    {5, 3, 7, 7, window(1, 1, 1, 1, 0, 0, 1, 1)},    {2, 4, 11, 9, window(3, 2, 3, 2, 1, 0, 2, 1)},
    {2, 3, 32, 32, window(7, 7, 2, 2, 3, 3, 1, 1)},  // stem-like
};

}  // namespace

TEST_CASE("unfold2d and fold2d on CUDA equal the CPU, forward and backward", "[gpu][unfold]") {
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::f8e4m3}) {
    for (const Case& cs : kCases) {
      INFO(dtype_name(dt) << " N " << cs.N << " C " << cs.C << " H " << cs.H << " W " << cs.W << " k "
                          << cs.p.kernel_h << "x" << cs.p.kernel_w << " s " << cs.p.stride_h << " d "
                          << cs.p.dilation_h);
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
