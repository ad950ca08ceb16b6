// The fused SwiGLU kernels against the f64 CPU reference (aligned 16-byte packs, the element tail, unaligned
// buffers; every floating dtype; outputs poisoned so unwritten elements fail) and bit for bit against CUDA's own
// silu-then-mul composition (Note [SwiGLU bits]).
#include "support/catch.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {

using test::leaf;

}  // namespace

TEST_CASE("fused swiglu on CUDA matches the CPU and CUDA's silu-then-mul bit for bit", "[gpu][swiglu]") {
  uint64_t seed = 1000;
  for (DType dt : test::kFloatDTypes)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{8 * 1000 + 3}, int64_t{70001}})
      for (int64_t start : {int64_t{0}, int64_t{1}}) {  // start 1: unaligned buffers, the element path
        INFO(dtype_name(dt) << " n " << n << " start " << start);
        const Tensor graw = test::random_input({n + start}, ++seed, dt, -6.0, 6.0);
        const Tensor uraw = test::random_input({n + start}, ++seed, dt);
        const Tensor dy = test::random_input({n}, ++seed, dt);
        // The reference: the same values in f64 on the CPU, rounded once to dt (the kernels round silu(g) and dy * u
        // to dt on the way, as the separate ops do: at most three half-ulps apart, within the dtype's tolerance).
        Tensor gc = leaf(graw.to(DType::f64), Device::cpu()), uc = leaf(uraw.to(DType::f64), Device::cpu());
        Tensor gg = leaf(graw, test::kCuda), ug = leaf(uraw, test::kCuda);
        const Tensor g1c = narrow(gc, 0, start, n), u1c = narrow(uc, 0, start, n);
        const Tensor g1g = narrow(gg, 0, start, n), u1g = narrow(ug, 0, start, n);
        const Tensor yc = swiglu(g1c, u1c);
        const auto grads_c = grad({yc}, {g1c, u1c}, {dy.to(DType::f64)});
        Tensor yg;
        std::vector<Tensor> grads_g;
        {
          test::PoisonGuard poison;
          yg = swiglu(g1g, u1g);
          grads_g = grad({yg}, {g1g, u1g}, {dy.to(test::kCuda)});
        }
        CHECK(test::compare_to_cpu(yg, yc.to(dt)) == "");
        CHECK(test::compare_to_cpu(grads_g[0], grads_c[0].to(dt)) == "");
        CHECK(test::compare_to_cpu(grads_g[1], grads_c[1].to(dt)) == "");
        // CUDA's composition of the two ops (Note [SwiGLU bits]). Unaligned bf16 / f16 operands make the separate
        // ops take their generic kernels, which use the library silu rather than the fast form: no bit match.
        const bool narrow16 = dt == DType::bf16 || dt == DType::f16;
        if (start != 0 && narrow16) continue;
        const Tensor yu = mul(silu(g1g), u1g);
        const auto grads_u = grad({yu}, {g1g, u1g}, {dy.to(test::kCuda)});
        CHECK(test::compare_bits(yg, yu.to(Device::cpu())) == "");
        CHECK(test::compare_bits(grads_g[0], grads_u[0].to(Device::cpu())) == "");
        CHECK(test::compare_bits(grads_g[1], grads_u[1].to(Device::cpu())) == "");
      }
}
