// scaled_dot_product_attention and attention_qkv_packed: a naive reference built from plain loops, causal
// masks with T != S (including rows that see no key), grouped KV heads, Dv != D, non-contiguous inputs, bf16,
// gradients and errors; the packed op against the reference and against the unpacked composition.
#include <cmath>
#include <limits>

#include "hadatrain/autograd/engine.h"
#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

// Reference: full score matrix per (b, h), -inf where masked, softmax, times V. Rows with no visible key
// give 0. q (B, Hq, T, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv).
std::vector<double> reference_attention(const Tensor& qt, const Tensor& kt, const Tensor& vt, AttnMask mask,
                                        double scale = 0.0) {
  const int64_t B = qt.size(0), Hq = qt.size(1), T = qt.size(2), D = qt.size(3);
  const int64_t Hkv = kt.size(1), S = kt.size(2), Dv = vt.size(3);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(D));
  const auto q = qt.to_vector<double>(), k = kt.to_vector<double>(), v = vt.to_vector<double>();
  std::vector<double> out(static_cast<std::size_t>(B * Hq * T * Dv), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h * Hkv / Hq;  // kv head of query head h
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(static_cast<std::size_t>(S));
        double mx = -inf;
        for (int64_t s = 0; s < S; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += q[((b * Hq + h) * T + t) * D + e] * k[((b * Hkv + g) * S + s) * D + e];
          const bool masked = mask == AttnMask::causal && s > t + (S - T);
          w[s] = masked ? -inf : scale * dot;
          mx = std::max(mx, w[s]);
        }
        if (mx == -inf) continue;  // no visible key: output 0
        double z = 0;
        for (auto& x : w) z += (x = std::exp(x - mx));
        for (int64_t s = 0; s < S; ++s)
          for (int64_t e = 0; e < Dv; ++e)
            out[((b * Hq + h) * T + t) * Dv + e] += w[s] / z * v[((b * Hkv + g) * S + s) * Dv + e];
      }
    }
  return out;
}

struct Case {
  int64_t B, Hq, Hkv, T, S, D, Dv;
};

std::vector<Tensor> make_qkv(const Case& c, uint64_t seed, double range = 1.0) {
  return {test::random_tensor({c.B, c.Hq, c.T, c.D}, seed, DType::f64, -range, range),
          test::random_tensor({c.B, c.Hkv, c.S, c.D}, seed + 1, DType::f64, -range, range),
          test::random_tensor({c.B, c.Hkv, c.S, c.Dv}, seed + 2, DType::f64, -range, range)};
}

}  // namespace

TEST_CASE("attention matches the naive reference", "[attention]") {
  const Case cases[] = {
      {1, 1, 1, 1, 1, 1, 1},  // single key: output is v
      {2, 3, 3, 5, 7, 3, 4},  // odd sizes, T < S, Dv != D
      {1, 4, 2, 6, 6, 8, 5},  // grouped KV (Hq = 4, Hkv = 2)
      {2, 6, 2, 4, 9, 5, 3},  // groups of 3, odd D
      {1, 4, 1, 3, 2, 4, 6},  // multi-query (Hkv = 1), T > S
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    const auto in = make_qkv(c, seed += 10, 2.0);
    for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
      INFO("B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S << " D " << c.D
                << " Dv " << c.Dv << " causal " << (mask == AttnMask::causal));
      Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], {mask});
      CHECK(out.shape() == Shape{c.B, c.Hq, c.T, c.Dv});
      CHECK(test::compare(out, reference_attention(in[0], in[1], in[2], mask), 1e-12, 1e-13) == "");
    }
  }
}

TEST_CASE("attention with an explicit scale and a single key returns v", "[attention]") {
  const auto in = make_qkv({2, 2, 2, 3, 4, 5, 3}, 7);
  Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], {AttnMask::none, 0.37});
  CHECK(test::compare(out, reference_attention(in[0], in[1], in[2], AttnMask::none, 0.37), 1e-12, 1e-13) == "");
  CHECK(test::compare(out, scaled_dot_product_attention(in[0], in[1], in[2]), 1e-6, 1e-6) != "");
  // Causal with T = S: query 0 sees only key 0, so its output is v[0].
  Tensor q = test::random_tensor({1, 1, 3, 2}, 8), k = test::random_tensor({1, 1, 3, 2}, 9);
  Tensor v = test::random_tensor({1, 1, 3, 4}, 10);
  Tensor o = scaled_dot_product_attention(q, k, v, {AttnMask::causal});
  CHECK(test::compare(narrow(o, 2, 0, 1), narrow(v, 2, 0, 1), 0, 1e-15) == "");
}

TEST_CASE("causal attention with S < T outputs 0 for queries that see no key", "[attention]") {
  // T = 5, S = 3: query t sees keys s <= t - 2, so queries 0 and 1 see nothing.
  const auto in = make_qkv({1, 2, 1, 5, 3, 4, 4}, 20);
  Tensor out = scaled_dot_product_attention(in[0], in[1], in[2], {AttnMask::causal});
  const auto ov = out.to_vector<double>();
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 2 * 4; ++i) CHECK(ov[h * 20 + i] == 0.0);
  CHECK(std::abs(ov[2 * 4]) > 0);  // query 2 sees key 0: output v[0]
  CHECK(test::compare(out, reference_attention(in[0], in[1], in[2], AttnMask::causal), 1e-12, 1e-13) == "");
}

TEST_CASE("attention reads non-contiguous q, k, v", "[attention]") {
  // Projections laid out (B, T, H, D) and viewed as (B, H, T, D); v sliced along its last dim.
  Tensor qb = test::random_tensor({2, 5, 4, 3}, 30), kb = test::random_tensor({2, 6, 2, 3}, 31);
  Tensor vb = test::random_tensor({2, 6, 2, 7}, 32);
  Tensor q = qb.transpose(1, 2), k = kb.transpose(1, 2), v = slice(vb.transpose(1, 2), 3, 1, 7, 2);
  REQUIRE_FALSE(v.is_contiguous());
  for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
    Tensor out = scaled_dot_product_attention(q, k, v, {mask});
    CHECK(test::compare(out, scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), {mask}), 0,
                        0) == "");
    CHECK(test::compare(out, reference_attention(q, k, v, mask), 1e-12, 1e-13) == "");
  }
}

TEST_CASE("attention in bf16 and f32 is close to f64, and so are its gradients", "[attention]") {
  const Case c{2, 4, 2, 6, 8, 16, 8};
  const auto in = make_qkv(c, 40);
  const AttentionOptions opts{AttnMask::causal};
  Tensor ref = scaled_dot_product_attention(in[0], in[1], in[2], opts);
  Tensor o16 = scaled_dot_product_attention(in[0].to(DType::bf16), in[1].to(DType::bf16), in[2].to(DType::bf16), opts);
  CHECK(o16.dtype() == DType::bf16);
  CHECK(test::compare(o16, ref, 2e-2, 2e-2) == "");

  std::vector<Tensor> in32;
  for (const Tensor& t : in) in32.push_back(t.to(DType::f32).set_requires_grad(true));
  std::vector<Tensor> in64;
  for (const Tensor& t : in) in64.push_back(t.clone().set_requires_grad(true));
  Tensor w = test::random_tensor(ref.shape(), 41);
  const auto g32 = grad({sum(mul(scaled_dot_product_attention(in32[0], in32[1], in32[2], opts), w.to(DType::f32)))},
                        in32);
  const auto g64 = grad({sum(mul(scaled_dot_product_attention(in64[0], in64[1], in64[2], opts), w))}, in64);
  for (int i = 0; i < 3; ++i) {
    CHECK(g32[i].dtype() == DType::f32);
    CHECK(test::compare(g32[i], g64[i], 1e-5, 1e-6) == "");
  }
}

TEST_CASE("attention gradients pass the finite-difference check", "[attention][gradcheck]") {
  const Case cases[] = {
      {2, 2, 2, 3, 5, 3, 2},  // plain, T < S, Dv != D
      {1, 4, 2, 4, 4, 3, 3},  // grouped KV: dK, dV sum over the query heads of a group
      {1, 2, 1, 5, 3, 2, 3},  // T > S: causal rows 0, 1 see no key
  };
  uint64_t seed = 200;
  for (const Case& c : cases) {
    auto in = make_qkv(c, seed += 10, 1.5);
    for (auto& t : in) t.set_requires_grad(true);
    for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
      INFO("Hq " << c.Hq << " Hkv " << c.Hkv << " T " << c.T << " S " << c.S << " causal "
                 << (mask == AttnMask::causal));
      CHECK(test::gradcheck(
                [mask](const std::vector<Tensor>& x) {
                  return scaled_dot_product_attention(x[0], x[1], x[2], {mask});
                },
                in) == "");
    }
  }
  // Through non-contiguous views and with an explicit scale; only k needs a gradient here.
  Tensor q = test::random_tensor({1, 3, 2, 4}, 300);  // (B, T, H, D) storage
  Tensor k = test::random_tensor({1, 4, 2, 4}, 301).set_requires_grad(true);
  Tensor v = test::random_tensor({1, 2, 4, 3}, 302).set_requires_grad(true);
  CHECK(test::gradcheck(
            [&q](const std::vector<Tensor>& x) {
              return scaled_dot_product_attention(q.transpose(1, 2), x[0].transpose(1, 2), x[1],
                                                  {AttnMask::causal, 0.8});
            },
            {k, v}) == "");
}

TEST_CASE("attention backward skips inputs that need no gradient", "[attention]") {
  const auto in = make_qkv({1, 2, 2, 3, 3, 2, 2}, 50);
  Tensor q = in[0].clone().set_requires_grad(true);
  Tensor out = scaled_dot_product_attention(q, in[1], in[2]);
  sum(out).backward();
  REQUIRE(q.grad().defined());
  CHECK(q.grad().shape() == q.shape());
  CHECK_FALSE(in[1].grad().defined());
}

TEST_CASE("attention rejects mismatched shapes, dtypes and head counts", "[attention]") {
  Tensor q = zeros({1, 4, 3, 8}), k = zeros({1, 2, 5, 8}), v = zeros({1, 2, 5, 6});
  CHECK(scaled_dot_product_attention(q, k, v).shape() == Shape{1, 4, 3, 6});
  CHECK_THROWS_WITH(scaled_dot_product_attention(zeros({4, 3, 8}), k, v), HasSubstr("(B, Hq, T, D)"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, zeros({1, 3, 5, 8}), zeros({1, 3, 5, 6})),
                    HasSubstr("multiple of the number of kv heads"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, zeros({1, 2, 5, 7}), v), HasSubstr("head dim D"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, zeros({1, 2, 4, 6})), HasSubstr("agree on Hkv and S"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, zeros({2, 2, 5, 8}), zeros({2, 2, 5, 6})),
                    HasSubstr("batch sizes differ"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k.to(DType::f64), v), HasSubstr("share a dtype"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q.to(DType::i32), k.to(DType::i32), v.to(DType::i32)),
                    HasSubstr("floating"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, {AttnMask::none, std::nan("")}),
                    HasSubstr("scale must be finite"));
}

// ---- attention_qkv_packed: qkv (B, N, 3 dim) laid out [q | k | v], each (H, D) -> (B, N, dim) as (B, N, H, D)

namespace {

// Reference: gathers q, k, v (B, H, N, D) from the packed layout with plain index arithmetic, runs
// reference_attention, and scatters the result to (B, N, H, D).
std::vector<double> reference_packed(const Tensor& qkv, int64_t H, AttnMask mask, double scale = 0.0) {
  const int64_t B = qkv.size(0), N = qkv.size(1), dim = qkv.size(2) / 3, D = dim / H;
  const auto x = qkv.to_vector<double>();
  std::vector<double> part[3];
  for (int64_t j = 0; j < 3; ++j) {
    part[j].resize(static_cast<std::size_t>(B * H * N * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t d = 0; d < D; ++d)
            part[j][static_cast<std::size_t>(((b * H + h) * N + n) * D + d)] =
                x[static_cast<std::size_t>((b * N + n) * 3 * dim + j * dim + h * D + d)];
  }
  const Shape s{B, H, N, D};
  const auto o = reference_attention(from_vector(part[0], s), from_vector(part[1], s), from_vector(part[2], s), mask,
                                     scale);  // (B, H, N, D)
  std::vector<double> out(o.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t d = 0; d < D; ++d)
          out[static_cast<std::size_t>((b * N + n) * dim + h * D + d)] =
              o[static_cast<std::size_t>(((b * H + h) * N + n) * D + d)];
  return out;
}

// The computation SelfAttention ran before the packed op existed.
Tensor unpacked(const Tensor& qkv, int64_t H, const AttentionOptions& opts) {
  const int64_t B = qkv.size(0), N = qkv.size(1), dim = qkv.size(2) / 3;
  const Tensor t = qkv.reshape({B, N, 3, H, dim / H}).permute({2, 0, 3, 1, 4});
  return scaled_dot_product_attention(select(t, 0, 0), select(t, 0, 1), select(t, 0, 2), opts)
      .transpose(1, 2)
      .reshape({B, N, dim});
}

struct PackedCase {
  int64_t B, N, H, D;
};

}  // namespace

TEST_CASE("attention_qkv_packed matches the reference and the unpacked computation", "[attention][packed]") {
  const PackedCase cases[] = {{1, 1, 1, 1}, {2, 5, 2, 3}, {1, 7, 3, 4}, {3, 4, 1, 6}};
  uint64_t seed = 500;
  for (const PackedCase& c : cases) {
    const Tensor qkv = test::random_tensor({c.B, c.N, 3 * c.H * c.D}, ++seed, DType::f64, -2.0, 2.0);
    for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
      INFO("B " << c.B << " N " << c.N << " H " << c.H << " D " << c.D << " causal " << (mask == AttnMask::causal));
      const Tensor out = attention_qkv_packed(qkv, c.H, {mask});
      CHECK(out.shape() == Shape{c.B, c.N, c.H * c.D});
      CHECK(test::compare(out, reference_packed(qkv, c.H, mask), 1e-12, 1e-13) == "");
      // SelfAttention's numerics are unchanged: the same values as the composition it used before
      CHECK(test::compare(out, unpacked(qkv, c.H, {mask}), 0, 0) == "");
    }
  }
  // explicit scale, and a non-contiguous qkv (a transposed (B, 3 dim, N) buffer)
  const Tensor qkv_t = test::random_tensor({2, 12, 5}, 520).transpose(1, 2);  // (2, 5, 12), H 2, D 2
  REQUIRE_FALSE(qkv_t.is_contiguous());
  const Tensor out = attention_qkv_packed(qkv_t, 2, {AttnMask::causal, 0.6});
  CHECK(test::compare(out, reference_packed(qkv_t, 2, AttnMask::causal, 0.6), 1e-12, 1e-13) == "");
}

TEST_CASE("attention_qkv_packed gradients: finite differences and the unpacked gradient",
          "[attention][packed][gradcheck]") {
  uint64_t seed = 600;
  for (const PackedCase& c : {PackedCase{2, 3, 2, 2}, PackedCase{1, 5, 3, 3}}) {
    Tensor qkv = test::random_tensor({c.B, c.N, 3 * c.H * c.D}, ++seed, DType::f64, -1.5, 1.5).set_requires_grad(true);
    for (AttnMask mask : {AttnMask::none, AttnMask::causal}) {
      INFO("N " << c.N << " H " << c.H << " D " << c.D << " causal " << (mask == AttnMask::causal));
      const int64_t H = c.H;
      CHECK(test::gradcheck([H, mask](const std::vector<Tensor>& x) { return attention_qkv_packed(x[0], H, {mask}); },
                            {qkv}) == "");
      // the gradient equals the unpacked computation's
      Tensor a = qkv.detach().clone().set_requires_grad(true), b = qkv.detach().clone().set_requires_grad(true);
      const Tensor w = test::random_tensor({c.B, c.N, c.H * c.D}, ++seed);
      sum(mul(attention_qkv_packed(a, H, {mask}), w)).backward();
      sum(mul(unpacked(b, H, {mask}), w)).backward();
      REQUIRE(a.grad().defined());
      CHECK(a.grad().shape() == qkv.shape());
      CHECK(test::compare(a.grad(), b.grad(), 1e-12, 1e-13) == "");
    }
  }
  // through a non-contiguous view, with an explicit scale
  Tensor base = test::random_tensor({1, 12, 4}, 650).set_requires_grad(true);  // (B, 3 dim, N) storage
  CHECK(test::gradcheck(
            [](const std::vector<Tensor>& x) {
              return attention_qkv_packed(x[0].transpose(1, 2), 2, {AttnMask::none, 0.9});
            },
            {base}) == "");
}

TEST_CASE("attention_qkv_packed in bf16 is close to f64", "[attention][packed]") {
  const Tensor qkv = test::random_tensor({2, 9, 3 * 2 * 8}, 700);
  const Tensor ref = attention_qkv_packed(qkv, 2, {AttnMask::causal});
  const Tensor o16 = attention_qkv_packed(qkv.to(DType::bf16), 2, {AttnMask::causal});
  CHECK(o16.dtype() == DType::bf16);
  CHECK(test::compare(o16, ref, 2e-2, 2e-2) == "");
}

TEST_CASE("attention_qkv_packed rejects bad shapes, head counts and dtypes", "[attention][packed]") {
  CHECK(attention_qkv_packed(zeros({2, 3, 12}), 2).shape() == Shape{2, 3, 4});
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({3, 12}), 2), HasSubstr("expected qkv (B, N, 3 dim)"));
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({2, 3, 10}), 2), HasSubstr("multiple of 3"));
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({2, 3, 12}), 3), HasSubstr("heads (3) must divide dim"));
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({2, 3, 12}), 0), HasSubstr("heads must be positive"));
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({2, 3, 12}).to(DType::i32), 2), HasSubstr("floating"));
  CHECK_THROWS_WITH(attention_qkv_packed(zeros({2, 3, 12}), 2, {AttnMask::none, std::nan("")}),
                    HasSubstr("scale must be finite"));
}
