// The fused (FlashAttention-2 style) attention kernels on CUDA against the CPU reference: the CPU op runs
// in double on the same bf16/f16 inputs (converted exactly to f64), and the fused results (out, lse, dq,
// dk, dv) must agree within a tolerance derived from the shared table. Cases: odd lengths (partial tiles),
// T != S under the causal alignment (T < S, and T > S with empty rows and whole empty query blocks), long
// causal sequences (many query blocks per key block), D 64 and 128, grouped kv heads, a negative custom
// scale, a non-contiguous q. Every case asserts that the fused kernels ran (kernels::flash_attention_counts),
// so a silent fallback fails the test. The backward cases of head dim 64 run the lean kernel, those of head dim
// 128 the split-tile kernel (Note [Backward variants] in cuda/kernels/flash_attention.cu). The forward kernel
// (Note [Forward kernel]) also runs on its own set of cases around its tile edges: out and lse against the
// reference, bitwise repeatable, and the backward through its lse.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/autograd/grad_mode.h"
#include "cuda/glue/flash_attention_glue.h"
#include "support/catch.h"
#include "support/gpu_testing.h"

using namespace ht;

namespace {

using test::leaf;

struct FlashCase {
  const char* name;
  int64_t B, Hq, Hkv, T, S, D;
  AttentionOptions opts;
  bool permuted_q;  // the op gets q as a (B, Hq, T, D) view of a (B, T, Hq, D) tensor
};

// Fused-vs-reference tolerance for results of dtype dt: the kernels round P and dS to dt before their
// tensor-core products (as FlashAttention does), so the error is a few units in the last place of dt
// relative to the tensor's magnitude, not one ulp per element: |a - e| <= 2 r max(max|e|, 0.01) + 2 r |e|
// with r the table's rtol (bf16: 8e-3, f16: 1e-3). A wrong layout, mask or scale gives errors of order max|e|.
std::string close_to(const Tensor& actual, const Tensor& expected, DType dt) {
  if (!actual.is_cuda()) return "the fused result is not on CUDA: " + actual.describe();
  if (actual.dtype() != dt) return "the fused result has dtype " + actual.describe();
  if (!(actual.shape() == expected.shape()))
    return "shape mismatch: " + actual.describe() + " vs " + expected.describe();
  const std::vector<double> a = actual.to(Device::cpu()).to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double emax = 0;
  for (double x : e) emax = std::max(emax, std::abs(x));
  const double r = test::tolerance(dt).rtol;
  // the 1e-2 floor: a reference that is exactly 0 (one query, one key: dS = 0) against fp32 rounding noise
  const double atol = 2 * r * std::max(emax, 1e-2), rtol = 2 * r;
  int bad = 0;
  std::string msg;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i])) continue;  // NaN fails here too
    if (++bad <= 5) msg += fmt::format("[{}] fused {} reference {}; ", i, a[i], e[i]);
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements differ (max |ref| {}): {}", bad, a.size(), emax, msg);
}

// lse[b, h, t] = log sum over visible keys of exp(scale q . k) in double; -inf for rows that see no key.
std::vector<double> reference_lse(const Tensor& q, const Tensor& k, const FlashCase& c, double scale) {
  const std::vector<double> qv = q.contiguous().to_vector<double>(), kv = k.contiguous().to_vector<double>();
  std::vector<double> out;
  const int64_t group = c.Hq / c.Hkv;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const int64_t n = c.opts.mask == AttnMask::causal ? std::clamp<int64_t>(t + c.S - c.T + 1, 0, c.S) : c.S;
        std::vector<double> sc(static_cast<std::size_t>(n));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < n; ++s) {
          double acc = 0;
          for (int64_t e = 0; e < c.D; ++e)
            acc += qv[static_cast<std::size_t>(((b * c.Hq + h) * c.T + t) * c.D + e)] *
                   kv[static_cast<std::size_t>(((b * c.Hkv + h / group) * c.S + s) * c.D + e)];
          sc[static_cast<std::size_t>(s)] = scale * acc;
          mx = std::max(mx, scale * acc);
        }
        if (n == 0) {
          out.push_back(-std::numeric_limits<double>::infinity());
          continue;
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        out.push_back(mx + std::log(sum));
      }
  return out;
}

std::string lse_close(const Tensor& actual, const std::vector<double>& expected) {
  if (!actual.is_cuda() || actual.dtype() != DType::f32) return "lse is not a CUDA f32 tensor: " + actual.describe();
  const std::vector<double> a = actual.to(Device::cpu()).to_vector<double>();
  if (a.size() != expected.size()) return fmt::format("lse has {} elements, expected {}", a.size(), expected.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = expected[i];
    if (std::isinf(e) ? a[i] == e : std::abs(a[i] - e) <= 1e-4 + 1e-5 * std::abs(e)) continue;
    return fmt::format("lse[{}]: fused {} reference {}", i, a[i], e);
  }
  return {};
}

// The op on the CUDA leaves qg, kg, vg in poisoned memory (an element the kernel forgets to write is NaN), q
// through a non-contiguous (B, Hq, T, D) view of a (B, T, Hq, D) tensor when the case asks for one.
Tensor fused_sdpa(const FlashCase& c, const Tensor& qg, const Tensor& kg, const Tensor& vg) {
  test::PoisonGuard poison;
  const Tensor qin = c.permuted_q ? qg.permute({0, 2, 1, 3}).contiguous().permute({0, 2, 1, 3}) : qg;
  if (c.permuted_q) REQUIRE_FALSE(qin.is_contiguous());
  return scaled_dot_product_attention(qin, kg, vg, c.opts);
}

// "" when the fused dq, dk, dv agree with the reference gradients (close_to), else the first disagreement.
std::string grads_close(const std::array<Tensor, 3>& fused, const Tensor& qc, const Tensor& kc, const Tensor& vc,
                        DType dt) {
  const Tensor* ref[3] = {&qc, &kc, &vc};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i)
    if (std::string e = close_to(fused[static_cast<std::size_t>(i)], *ref[i], dt); !e.empty())
      return std::string(names[i]) + ": " + e;
  return {};
}

}  // namespace

TEST_CASE("flash_attention_applies picks the fused kernels only where they apply", "[gpu][attention][flash]") {
  const kernels::AttnShape ok{2, 4, 2, 77, 77, 64, 64, 0.125, 1};
  CHECK(cuda_ops::flash_attention_applies(DType::bf16, ok));
  CHECK(cuda_ops::flash_attention_applies(DType::f16, ok));
  CHECK_FALSE(cuda_ops::flash_attention_applies(DType::f32, ok));
  CHECK_FALSE(cuda_ops::flash_attention_applies(DType::f64, ok));
  kernels::AttnShape s = ok;
  s.D = s.Dv = 96;
  CHECK_FALSE(cuda_ops::flash_attention_applies(DType::bf16, s));
  s = ok;
  s.Dv = 128;
  CHECK_FALSE(cuda_ops::flash_attention_applies(DType::bf16, s));
  s = ok;
  s.D = s.Dv = 128;
  CHECK(cuda_ops::flash_attention_applies(DType::bf16, s));
  // the forward's grid holds at most 65535 query blocks of 128 rows
  s = ok;
  s.B = s.Hq = s.Hkv = 1;
  s.T = s.S = 65535 * 128;
  CHECK(kernels::flash_attention_supported(DType::bf16, s));
  s.T = s.S = 65535 * 128 + 1;
  CHECK_FALSE(kernels::flash_attention_supported(DType::bf16, s));

  // D = 32 runs the fallback: the fused counters do not move, and the result is still right
  const auto before = kernels::flash_attention_counts();
  const Tensor q = test::random_input({1, 2, 9, 32}, 1, DType::bf16), k = test::random_input({1, 2, 9, 32}, 2, DType::bf16);
  const Tensor v = test::random_input({1, 2, 9, 32}, 3, DType::bf16);
  const Tensor og = scaled_dot_product_attention(q.to(test::kCuda), k.to(test::kCuda), v.to(test::kCuda), {});
  const Tensor oc = scaled_dot_product_attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), {});
  CHECK(close_to(og, oc, DType::bf16) == "");
  CHECK(kernels::flash_attention_counts().forward == before.forward);
}

TEST_CASE("the fused backward runs the lean kernel at head dim 64 and the split kernel at 128",
          "[gpu][attention][flash]") {
  // the backward cases below cover both kernels through their head dims
  CHECK(kernels::flash_backward_kernel_for(64) == kernels::FlashBackwardKernel::lean);
  CHECK(kernels::flash_backward_kernel_for(128) == kernels::FlashBackwardKernel::split);
}

TEST_CASE("the fused forward matches the f64 CPU reference around its tile edges: out, lse, the backward from its lse",
          "[gpu][attention][flash]") {
  struct FwdCase {
    FlashCase c;
    bool backward;  // also run the backward from this forward's out and lse
  };
  // Key tiles are 128 (D 64) or 64 (D 128) keys, query blocks 128 rows, warps 32 rows: lengths around and
  // across those (and the 32-, 48- and 96-key tiles of the removed forward variants), the
  // causal diagonal inside and at the edge of tiles, tiles with no mask at all (S = 384, a multiple of every
  // tile, no causal mask), empty rows (causal T > S), negative scales (q negated in shared memory) with and
  // without the mask.
  const std::vector<FwdCase> cases = {
      {{"causal T = S = 77, D 64, 2 q heads per kv head", 1, 4, 2, 77, 77, 64, {AttnMask::causal, 0.0}, false}, true},
      {{"no mask T = S = 130, D 128, non-contiguous q", 2, 2, 2, 130, 130, 128, {AttnMask::none, 0.0}, true}, true},
      {{"causal T = S = 257, D 128", 1, 2, 1, 257, 257, 128, {AttnMask::causal, 0.0}, false}, false},
      {{"no mask T = S = 257, D 64", 1, 2, 2, 257, 257, 64, {AttnMask::none, 0.0}, false}, false},
      {{"causal T = 100 < S = 257 (aligned to the end), D 64", 2, 2, 1, 100, 257, 64, {AttnMask::causal, 0.0}, true},
       false},
      {{"causal T = 300 > S = 40 (empty rows and query blocks), D 128", 1, 2, 2, 300, 40, 128,
        {AttnMask::causal, 0.0}, false},
       true},
      {{"no mask T = 65, S = 131, negative custom scale, D 128", 1, 2, 1, 65, 131, 128, {AttnMask::none, -0.07}, false},
       true},
      {{"causal T = S = 384, negative custom scale, D 64", 1, 2, 2, 384, 384, 64, {AttnMask::causal, -0.1}, false},
       false},
      {{"causal one row one key, D 64", 1, 2, 2, 1, 1, 64, {AttnMask::causal, 0.0}, false}, false},
      {{"no mask T = 200, S = 384 (no masked key tile), D 64", 1, 2, 2, 200, 384, 64, {AttnMask::none, 0.0}, false},
       false},
      {{"no mask T = 129, S = 384 (no masked key tile), D 128", 1, 2, 2, 129, 384, 128, {AttnMask::none, 0.0}, false},
       false},
      {{"causal T = S = 1024, D 64", 1, 2, 1, 1024, 1024, 64, {AttnMask::causal, 0.0}, false}, true},
      {{"causal T = S = 640, D 128", 1, 2, 2, 640, 640, 128, {AttnMask::causal, 0.0}, false}, false},
      {{"causal T = 129 < S = 700, D 128", 1, 2, 2, 129, 700, 128, {AttnMask::causal, 0.0}, false}, false},
      {{"causal T = 700 > S = 450, D 64", 1, 2, 2, 700, 450, 64, {AttnMask::causal, 0.0}, false}, false},
      {{"no mask T = S = 513, D 128", 1, 2, 2, 513, 513, 128, {AttnMask::none, 0.0}, false}, false},
  };
  uint64_t seed = 9300;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const FlashCase& c = cases[ci].c;
      if (dt == DType::f16 && ci % 2 == 1) continue;  // f16 on half of the cases keeps the test short
      INFO(dtype_name(dt) << ": " << c.name);
      const Tensor q = test::random_input({c.B, c.Hq, c.T, c.D}, ++seed, dt);
      const Tensor k = test::random_input({c.B, c.Hkv, c.S, c.D}, ++seed, dt);
      const Tensor v = test::random_input({c.B, c.Hkv, c.S, c.D}, ++seed, dt);
      const double scale = c.opts.scale != 0.0 ? c.opts.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
      const kernels::AttnShape s{c.B, c.Hq, c.Hkv, c.T, c.S, c.D, c.D, scale, c.opts.mask == AttnMask::causal};
      REQUIRE(cuda_ops::flash_attention_applies(dt, s));

      // reference: the CPU op in double on the same values (with gradients only where the case asks)
      Tensor qc = leaf(q.to(DType::f64), Device::cpu()), kc = leaf(k.to(DType::f64), Device::cpu()),
             vc = leaf(v.to(DType::f64), Device::cpu());
      Tensor oc, go;
      if (cases[ci].backward) {
        oc = scaled_dot_product_attention(qc, kc, vc, c.opts);
        go = test::random_input(oc.shape(), ++seed, dt);
        oc.backward(go.to(DType::f64));
      } else {
        NoGradGuard no_grad;
        oc = scaled_dot_product_attention(qc, kc, vc, c.opts);
      }
      const std::vector<double> lse_ref = reference_lse(q.to(DType::f64), k.to(DType::f64), c, scale);

      {
        Tensor qg = leaf(q, test::kCuda), kg = leaf(k, test::kCuda), vg = leaf(v, test::kCuda);
        const auto before = kernels::flash_attention_counts();
        const Tensor og = fused_sdpa(c, qg, kg, vg);
        CHECK(kernels::flash_attention_counts().forward == before.forward + 1);
        CHECK(close_to(og, oc, dt) == "");

        // lse through the glue; the same out bit for bit (the forward is deterministic)
        const auto [out2, lse] = cuda_ops::flash_attention_forward(q.to(test::kCuda), k.to(test::kCuda),
                                                                   v.to(test::kCuda), s);
        CHECK(lse_close(lse, lse_ref) == "");
        CHECK(test::compare_bits(out2, og.detach().to(Device::cpu())) == "");

        if (cases[ci].backward) {  // the backward recomputes P from this forward's lse
          {
            test::PoisonGuard poison;
            og.backward(go.to(test::kCuda));
          }
          CHECK(kernels::flash_attention_counts().backward == before.backward + 1);
          const std::array<Tensor, 3> fused{qg.grad(), kg.grad(), vg.grad()};
          CHECK(grads_close(fused, qc.grad(), kc.grad(), vc.grad(), dt) == "");
          // the backward through the glue from the same out and lse
          {
            std::array<Tensor, 3> grads;
            {
              test::PoisonGuard poison;
              grads = cuda_ops::flash_attention_backward(q.to(test::kCuda), k.to(test::kCuda), v.to(test::kCuda),
                                                         out2, lse, go.to(test::kCuda), s);
            }
            CHECK(grads_close(grads, qc.grad(), kc.grad(), vc.grad(), dt) == "");
          }
        }
      }
    }
  }
}

TEST_CASE("fused attention on CUDA matches the f64 CPU reference: out, lse, dq, dk, dv", "[gpu][attention][flash]") {
  const std::vector<FlashCase> cases = {
      {"causal T = S = 77, D 64, 2 q heads per kv head", 1, 4, 2, 77, 77, 64, {AttnMask::causal, 0.0}, false},
      {"no mask T = S = 130, D 128, non-contiguous q", 2, 4, 2, 130, 130, 128, {AttnMask::none, 0.0}, true},
      {"causal T = S = 257, D 128", 1, 4, 2, 257, 257, 128, {AttnMask::causal, 0.0}, false},
      {"no mask T = S = 257, D 64", 1, 4, 2, 257, 257, 64, {AttnMask::none, 0.0}, false},
      {"causal T = 100 < S = 257 (aligned to the end), D 64", 2, 4, 2, 100, 257, 64, {AttnMask::causal, 0.0}, true},
      {"causal T = 300 > S = 40 (empty rows and query blocks), D 128", 1, 4, 2, 300, 40, 128,
       {AttnMask::causal, 0.0}, false},
      {"no mask T = 65, S = 131, negative custom scale, D 128", 1, 2, 1, 65, 131, 128, {AttnMask::none, -0.07}, false},
      {"causal one row one key, D 64", 1, 2, 2, 1, 1, 64, {AttnMask::causal, 0.0}, false},
      // long enough for many iterations per key block (both parities of every double buffer, many key blocks)
      {"causal T = S = 1024, D 64, 2 q heads per kv head", 1, 2, 1, 1024, 1024, 64, {AttnMask::causal, 0.0}, false},
      {"causal T = S = 640, D 128", 1, 2, 2, 640, 640, 128, {AttnMask::causal, 0.0}, false},
      // T < S by more than a key block: whole key blocks every row sees next to the diagonal ones
      {"causal T = 200 < S = 600, D 128, 2 q heads per kv head", 1, 4, 2, 200, 600, 128, {AttnMask::causal, 0.0},
       false},
      {"causal T = 160 < S = 700, D 64", 1, 2, 2, 160, 700, 64, {AttnMask::causal, 0.0}, false},
      // the split-tile backward's edges (64-query blocks, 32 x 32 warp tiles, 128-key blocks): whole tiles
      // without mask code, a diagonal through odd positions with 3 q heads per kv head, T just past a block
      {"no mask T = 64, S = 256 (no ragged tile), D 128", 1, 2, 2, 64, 256, 128, {AttnMask::none, 0.0}, false},
      {"causal T = S = 191, D 128, 3 q heads per kv head", 1, 3, 1, 191, 191, 128, {AttnMask::causal, 0.0}, false},
      {"causal T = 65 < S = 333, D 64", 1, 2, 1, 65, 333, 64, {AttnMask::causal, 0.0}, false},
      {"causal T = S = 97, D 128", 2, 2, 2, 97, 97, 128, {AttnMask::causal, 0.0}, false},
  };
  uint64_t seed = 9100;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const FlashCase& c = cases[ci];
      if (dt == DType::f16 && ci % 2 == 1) continue;  // f16 on half of the cases keeps the test short
      INFO(dtype_name(dt) << ": " << c.name);
      const Tensor q = test::random_input({c.B, c.Hq, c.T, c.D}, ++seed, dt);
      const Tensor k = test::random_input({c.B, c.Hkv, c.S, c.D}, ++seed, dt);
      const Tensor v = test::random_input({c.B, c.Hkv, c.S, c.D}, ++seed, dt);
      const double scale = c.opts.scale != 0.0 ? c.opts.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
      REQUIRE(cuda_ops::flash_attention_applies(
          dt, kernels::AttnShape{c.B, c.Hq, c.Hkv, c.T, c.S, c.D, c.D, scale, c.opts.mask == AttnMask::causal}));

      // reference: the CPU op in double on the same values
      Tensor qc = leaf(q.to(DType::f64), Device::cpu()), kc = leaf(k.to(DType::f64), Device::cpu()),
             vc = leaf(v.to(DType::f64), Device::cpu());
      const Tensor oc = scaled_dot_product_attention(qc, kc, vc, c.opts);
      const Tensor go = test::random_input(oc.shape(), ++seed, dt);
      oc.backward(go.to(DType::f64));

      const std::vector<double> lse_ref = reference_lse(q.to(DType::f64), k.to(DType::f64), c, scale);

      {  // the backward kernel of the case's head dim (Note [Backward variants])
        Tensor qg = leaf(q, test::kCuda), kg = leaf(k, test::kCuda), vg = leaf(v, test::kCuda);
        const auto before = kernels::flash_attention_counts();
        const Tensor og = fused_sdpa(c, qg, kg, vg);
        CHECK(kernels::flash_attention_counts().forward == before.forward + 1);
        CHECK(close_to(og, oc, dt) == "");
        {
          test::PoisonGuard poison;
          og.backward(go.to(test::kCuda));
        }
        CHECK(kernels::flash_attention_counts().backward == before.backward + 1);
        const std::array<Tensor, 3> fused{qg.grad(), kg.grad(), vg.grad()};
        CHECK(grads_close(fused, qc.grad(), kc.grad(), vc.grad(), dt) == "");

        // lse through the glue (the op keeps it inside its backward node)
        const kernels::AttnShape s{c.B, c.Hq, c.Hkv, c.T, c.S, c.D, c.D, scale, c.opts.mask == AttnMask::causal};
        const auto [out2, lse] = cuda_ops::flash_attention_forward(q.to(test::kCuda), k.to(test::kCuda),
                                                                   v.to(test::kCuda), s);
        CHECK(lse_close(lse, lse_ref) == "");
        CHECK(test::compare_bits(out2, og.detach().to(Device::cpu())) == "");  // deterministic forward
      }
    }
  }
}

// ---- strided operands and the packed op (attention_qkv_packed) ----

namespace {

// The three (B, N, dim) slots [q | k | v] of a (B, N, 3 dim) tensor (views; close_to reads them strided).
std::array<Tensor, 3> slots(const Tensor& t) {
  const int64_t dim = t.size(2) / 3;
  return {narrow(t, 2, 0, dim), narrow(t, 2, dim, dim), narrow(t, 2, 2 * dim, dim)};
}

struct PackedCase {
  const char* name;
  int64_t B, N, H, D;
  AttentionOptions opts;
};

}  // namespace

TEST_CASE("packed attention on CUDA matches the f64 CPU reference, forward and backward",
          "[gpu][attention][flash][packed]") {
  const std::vector<PackedCase> cases = {
      {"ViT-S/4 shape: N = 65, 6 heads of 64", 2, 65, 6, 64, {AttnMask::none, 0.0}},
      {"ViT-B/16 shape: N = 197, 3 heads of 64", 1, 197, 3, 64, {AttnMask::none, 0.0}},
      {"causal N = 130, 2 heads of 128", 2, 130, 2, 128, {AttnMask::causal, 0.0}},
      {"N = 33, 1 head of 128, custom scale", 3, 33, 1, 128, {AttnMask::none, 0.05}},
  };
  uint64_t seed = 9500;
  for (DType dt : {DType::bf16, DType::f16}) {
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      const PackedCase& c = cases[ci];
      if (dt == DType::f16 && ci % 2 == 1) continue;
      INFO(dtype_name(dt) << ": " << c.name);
      const int64_t dim = c.H * c.D;
      const Tensor qkv = test::random_input({c.B, c.N, 3 * dim}, ++seed, dt);

      Tensor xc = leaf(qkv.to(DType::f64), Device::cpu());
      const Tensor oc = attention_qkv_packed(xc, c.H, c.opts);
      const Tensor go = test::random_input(oc.shape(), ++seed, dt);
      oc.backward(go.to(DType::f64));

      {  // the backward kernel of the case's head dim (Note [Backward variants])
        Tensor xg = leaf(qkv, test::kCuda);
        const auto before = kernels::flash_attention_counts();
        Tensor og;
        {
          test::PoisonGuard poison;  // an element the kernels forget to write is NaN
          og = attention_qkv_packed(xg, c.H, c.opts);
        }
        CHECK(kernels::flash_attention_counts().forward == before.forward + 1);
        CHECK(og.shape() == Shape{c.B, c.N, dim});
        CHECK(og.is_contiguous());
        CHECK(close_to(og, oc, dt) == "");
        {
          test::PoisonGuard poison;
          og.backward(go.to(test::kCuda));
        }
        CHECK(kernels::flash_attention_counts().backward == before.backward + 1);
        REQUIRE(xg.grad().defined());
        CHECK(xg.grad().shape() == qkv.shape());
        const auto gg = slots(xg.grad()), gc = slots(xc.grad());
        CHECK(close_to(gg[0], gc[0], dt) == "");  // dq
        CHECK(close_to(gg[1], gc[1], dt) == "");  // dk
        CHECK(close_to(gg[2], gc[2], dt) == "");  // dv
      }
    }
  }
}

TEST_CASE("packed attention without fused kernels on CUDA takes the generic path", "[gpu][attention][packed]") {
  // f32 and D = 32: the composition of views and the straightforward kernels; the fused counters stay put
  const std::tuple<DType, int64_t, int64_t> cases[] = {{DType::f32, 2, 64}, {DType::bf16, 3, 32}};
  for (const auto& [dt, H, D] : cases) {
    INFO(dtype_name(dt) << " D " << D);
    const Tensor qkv = test::random_input({2, 17, 3 * H * D}, 9600 + static_cast<uint64_t>(D), dt);
    Tensor xc = leaf(qkv.to(DType::f64), Device::cpu());
    const Tensor oc = attention_qkv_packed(xc, H, {AttnMask::causal});
    const Tensor go = test::random_input(oc.shape(), 9610, dt);
    oc.backward(go.to(DType::f64));
    Tensor xg = leaf(qkv, test::kCuda);
    const auto before = kernels::flash_attention_counts();
    const Tensor og = attention_qkv_packed(xg, H, {AttnMask::causal});
    og.backward(go.to(test::kCuda));
    CHECK(kernels::flash_attention_counts().forward == before.forward);
    CHECK(close_to(og, oc, dt) == "");
    CHECK(close_to(xg.grad(), xc.grad(), dt) == "");
  }
}

TEST_CASE("strided scaled_dot_product_attention inputs are read in place and give the contiguous results",
          "[gpu][attention][flash]") {
  const int64_t B = 2, T = 97, H = 4;
  // both backward kernels (lean at head dim 64, split at 128): dk, dv bit-identical between the two layouts
  for (const int64_t D : {int64_t{64}, int64_t{128}}) {
    INFO("head dim " << D);
    for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
      INFO("causal " << (mask == AttnMask::causal));
      // projections laid out (B, T, H, D), attended as (B, H, T, D) views
      const Tensor qb = test::random_input({B, T, H, D}, 9700, DType::bf16).to(test::kCuda);
      const Tensor kb = test::random_input({B, T, H, D}, 9701, DType::bf16).to(test::kCuda);
      const Tensor vb = test::random_input({B, T, H, D}, 9702, DType::bf16).to(test::kCuda);
      Tensor qs = leaf(qb, test::kCuda), ks = leaf(kb, test::kCuda), vs = leaf(vb, test::kCuda);
      const Tensor qv = qs.transpose(1, 2), kv = ks.transpose(1, 2), vv = vs.transpose(1, 2);
      REQUIRE_FALSE(qv.is_contiguous());
      CHECK(cuda_ops::flash_strides(qv.detach()).has_value());  // no copy needed
      Tensor qc = leaf(qv.contiguous(), test::kCuda), kc = leaf(kv.contiguous(), test::kCuda),
             vc = leaf(vv.contiguous(), test::kCuda);
      const Tensor go = test::random_input({B, H, T, D}, 9703, DType::bf16).to(test::kCuda);

      const auto before = kernels::flash_attention_counts();
      const Tensor os = scaled_dot_product_attention(qv, kv, vv, {mask});
      const Tensor oc = scaled_dot_product_attention(qc, kc, vc, {mask});
      CHECK(kernels::flash_attention_counts().forward == before.forward + 2);
      CHECK(test::compare_bits(os, oc.to(Device::cpu())) == "");  // same values, same order: same bits
      os.backward(go);
      oc.backward(go);
      CHECK(kernels::flash_attention_counts().backward == before.backward + 2);
      // dk, dv are deterministic; dq goes through fp32 atomics (the order of the adds varies)
      CHECK(test::compare_bits(ks.grad().transpose(1, 2).contiguous(), kc.grad().to(Device::cpu())) == "");
      CHECK(test::compare_bits(vs.grad().transpose(1, 2).contiguous(), vc.grad().to(Device::cpu())) == "");
      CHECK(close_to(qs.grad().transpose(1, 2), qc.grad().to(Device::cpu()), DType::bf16) == "");
    }
  }

  // A view whose rows are not 16-byte aligned (offset of 4 elements) is copied first: same results.
  const Tensor buf = test::random_input({1, 2, 40, 72}, 9710, DType::bf16).to(test::kCuda);
  const Tensor q = narrow(buf, 3, 4, 64);  // (1, 2, 40, 64), row stride 72, starts 8 bytes into a row
  CHECK_FALSE(cuda_ops::flash_strides(q).has_value());
  const Tensor k = test::random_input({1, 2, 40, 64}, 9711, DType::bf16).to(test::kCuda);
  const auto before = kernels::flash_attention_counts();
  const Tensor o1 = scaled_dot_product_attention(q, k, k, {});
  CHECK(kernels::flash_attention_counts().forward == before.forward + 1);
  CHECK(test::compare_bits(o1, scaled_dot_product_attention(q.contiguous(), k, k, {}).to(Device::cpu())) == "");
}
