// rotary_embedding: both pairings against a naive reference, their relation through a permutation of the
// last dim, norm preservation, position offsets, gradients and errors.
#include <cmath>

#include "support/catch.h"
#include "support/gradcheck.h"
#include "support/testing.h"

#include "hadatrain/autograd/engine.h"

using namespace ht;

namespace {

// Naive RoPE on a contiguous (B, H, T, D) buffer, written directly from the formulas.
std::vector<double> reference_rope(const std::vector<double>& x, int64_t B, int64_t H, int64_t T, int64_t D,
                                   const RopeParams& p) {
  std::vector<double> out(x.size());
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < D / 2; ++j) {
        const double angle = static_cast<double>(p.position_offset + t) * std::pow(p.theta, -2.0 * j / D);
        const int64_t i0 = p.style == RopeStyle::interleaved ? 2 * j : j;
        const int64_t i1 = p.style == RopeStyle::interleaved ? 2 * j + 1 : j + D / 2;
        const std::size_t base = static_cast<std::size_t>((bh * T + t) * D);
        const double a = x[base + i0], b = x[base + i1];
        out[base + i0] = a * std::cos(angle) - b * std::sin(angle);
        out[base + i1] = b * std::cos(angle) + a * std::sin(angle);
      }
  return out;
}

// Gathers the last dim of a (..., D) tensor: out[..., i] = x[..., perm[i]] (f64, contiguous).
Tensor permute_last(const Tensor& x, const std::vector<int64_t>& perm) {
  const auto v = x.to_vector<double>();
  const std::size_t D = perm.size();
  std::vector<double> out(v.size());
  for (std::size_t r = 0; r < v.size() / D; ++r)
    for (std::size_t i = 0; i < D; ++i) out[r * D + i] = v[r * D + static_cast<std::size_t>(perm[i])];
  return from_vector(out, x.shape(), {DType::f64});
}

}  // namespace

TEST_CASE("rotary_embedding matches a naive reference in both styles", "[rotary]") {
  const int64_t B = 2, H = 3, T = 5, D = 6;
  Tensor x = test::random_tensor({B, H, T, D}, 31);
  for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved})
    for (int64_t offset : {0, 7}) {
      const RopeParams p{10000.0, offset, style};
      CHECK(test::compare(rotary_embedding(x, p), reference_rope(x.to_vector<double>(), B, H, T, D, p), 1e-12,
                          1e-14) == "");
    }
  // A small theta gives large angles: still matches.
  const RopeParams p{3.0, 2, RopeStyle::rotate_half};
  CHECK(test::compare(rotary_embedding(x, p), reference_rope(x.to_vector<double>(), B, H, T, D, p), 1e-12, 1e-14) ==
        "");
}

TEST_CASE("rotary_embedding rotates hand-picked pairs by the expected angles", "[rotary]") {
  // D = 4, theta = 100: inv_freq = (1, 0.1); position 2 -> angles (2, 0.2).
  Tensor x = from_vector(std::vector<double>{1, 0, 0, 0, 0, 1, 0, 0}, {1, 1, 2, 4}, {DType::f64});
  const double c2 = std::cos(2.0), s2 = std::sin(2.0), c02 = std::cos(0.2), s02 = std::sin(0.2);
  // rotate_half pairs (0, 2) and (1, 3). Row 0 at position 1 (angle 1) of e0; row 1 at position 2 of e1.
  CHECK(test::compare(rotary_embedding(x, {100.0, 1, RopeStyle::rotate_half}),
                      std::vector<double>{std::cos(1.0), 0, std::sin(1.0), 0, 0, c02, 0, s02}, 1e-15, 1e-15) == "");
  // interleaved pairs (0, 1) and (2, 3): e1 is the second channel of pair 0 and turns by angle 2.
  CHECK(test::compare(rotary_embedding(x, {100.0, 1, RopeStyle::interleaved}),
                      std::vector<double>{std::cos(1.0), std::sin(1.0), 0, 0, -s2, c2, 0, 0}, 1e-15, 1e-15) == "");
}

TEST_CASE("rotary_embedding works on non-contiguous input", "[rotary]") {
  // (B, T, H, D) storage viewed as (B, H, T, D), as after splitting heads out of a projection.
  Tensor base = test::random_tensor({2, 7, 3, 8}, 32);
  Tensor x = base.transpose(1, 2);
  REQUIRE_FALSE(x.is_contiguous());
  for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved}) {
    const RopeParams p{500.0, 3, style};
    CHECK(test::compare(rotary_embedding(x, p), rotary_embedding(x.contiguous(), p), 0, 0) == "");
    CHECK(test::compare(rotary_embedding(x, p), reference_rope(x.to_vector<double>(), 2, 3, 7, 8, p), 1e-12,
                        1e-14) == "");
  }
}

TEST_CASE("interleaved RoPE is rotate-half RoPE conjugated by a permutation of the last dim", "[rotary]") {
  const int64_t D = 10;
  Tensor x = test::random_tensor({1, 2, 4, D}, 33);
  // perm moves channel 2j to position j and 2j+1 to position j + D/2.
  std::vector<int64_t> perm(D), inv(D);
  for (int64_t j = 0; j < D / 2; ++j) {
    perm[j] = 2 * j;
    perm[j + D / 2] = 2 * j + 1;
  }
  for (int64_t i = 0; i < D; ++i) inv[perm[i]] = i;
  const RopeParams half{10000.0, 1, RopeStyle::rotate_half}, inter{10000.0, 1, RopeStyle::interleaved};
  Tensor via_half = permute_last(rotary_embedding(permute_last(x, perm), half), inv);
  CHECK(test::compare(rotary_embedding(x, inter), via_half, 1e-13, 1e-14) == "");
  // The two styles really differ on the same input.
  CHECK(test::compare(rotary_embedding(x, inter), rotary_embedding(x, half), 1e-6, 1e-6) != "");
}

TEST_CASE("rotary_embedding preserves the norm of every pair and uses positions offset + t", "[rotary]") {
  Tensor x = test::random_tensor({2, 2, 6, 8}, 34);
  Tensor y = rotary_embedding(x);
  CHECK(test::compare(sum(mul(y, y), {3}), sum(mul(x, x), {3}), 1e-12, 1e-14) == "");
  // Position 0 is the identity.
  Tensor first = narrow(x, 2, 0, 1);
  CHECK(test::compare(rotary_embedding(first), first, 0, 1e-15) == "");
  // Rows t..T-1 at offset 0 equal rows 0.. at offset t.
  const RopeParams shifted{10000.0, 2, RopeStyle::rotate_half};
  CHECK(test::compare(rotary_embedding(narrow(x, 2, 2, 4), shifted), narrow(y, 2, 2, 4), 1e-13, 1e-14) == "");
  // Relative property: <R(m) q, R(n) k> depends only on m - n.
  Tensor q = test::random_tensor({1, 1, 1, 8}, 35), k = test::random_tensor({1, 1, 1, 8}, 36);
  auto dot = [&](int64_t m, int64_t n) {
    return sum(mul(rotary_embedding(q, {10000.0, m}), rotary_embedding(k, {10000.0, n}))).item();
  };
  CHECK(dot(5, 2) == Approx(dot(13, 10)).epsilon(1e-12));
  CHECK(std::abs(dot(5, 2) - dot(5, 3)) > 1e-6);
}

TEST_CASE("rotary_embedding in bf16 and f32 is close to f64", "[rotary]") {
  Tensor x = test::random_tensor({2, 4, 9, 16}, 37);
  const RopeParams p{10000.0, 100, RopeStyle::interleaved};
  Tensor ref = rotary_embedding(x, p);
  Tensor y16 = rotary_embedding(x.to(DType::bf16), p);
  CHECK(y16.dtype() == DType::bf16);
  CHECK(test::compare(y16, ref, 2e-2, 2e-2) == "");
  CHECK(test::compare(rotary_embedding(x.to(DType::f32), p), ref, 1e-6, 1e-6) == "");
}

TEST_CASE("rotary_embedding gradients pass the finite-difference check", "[rotary][gradcheck]") {
  Tensor x = test::random_tensor({2, 3, 4, 6}, 38).set_requires_grad(true);
  for (RopeStyle style : {RopeStyle::rotate_half, RopeStyle::interleaved}) {
    const RopeParams p{100.0, 3, style};
    CHECK(test::gradcheck([p](const std::vector<Tensor>& in) { return rotary_embedding(in[0], p); }, {x}) == "");
    // Through a non-contiguous view: x read as (B, T, H, D) -> (B, H, T, D).
    CHECK(test::gradcheck(
              [p](const std::vector<Tensor>& in) {
                return rotary_embedding(in[0].reshape({2, 4, 3, 6}).transpose(1, 2), p);
              },
              {x}) == "");
  }
}

TEST_CASE("rotary_embedding's input gradient is laid out like its input when that is a dense permutation",
          "[rotary]") {
  // The transpose(1, 2) view of a (B, T, H, D) projection gets its gradient in that layout, so the gradient
  // reaches the projection's (B, T, H*D) output through views only; other layouts get a contiguous gradient.
  const RopeParams p{500.0, 0, RopeStyle::rotate_half};
  Tensor base = test::random_tensor({2, 5, 3, 8}, 39).set_requires_grad(true);
  Tensor x = transpose(base, 1, 2);  // (B, H, T, D) view of (B, T, H, D) storage
  Tensor y = rotary_embedding(x, p);
  CHECK(y.is_contiguous());
  const Tensor gy = test::random_tensor(y.shape(), 40);
  const Tensor gx = grad({y}, {x}, {gy})[0];
  CHECK(gx.strides() == x.strides());
  // The inverse rotation: gx = R(-angle) gy, compared through its values (any layout).
  Tensor back = rotary_embedding(gx.contiguous(), p);
  CHECK(test::compare(back, gy.to_vector<double>(), 1e-12, 1e-14) == "");
  // A strided view with gaps (every other position) gets a contiguous gradient.
  Tensor wide = test::random_tensor({1, 2, 8, 4}, 41).set_requires_grad(true);
  Tensor gapped = slice(wide, 2, 0, 8, 2);
  REQUIRE_FALSE(gapped.is_contiguous());
  Tensor yg = rotary_embedding(gapped, p);
  CHECK(grad({yg}, {gapped}, {test::random_tensor(yg.shape(), 42)})[0].is_contiguous());
}

TEST_CASE("rotary_embedding rejects bad shapes and parameters", "[rotary]") {
  CHECK_THROWS_WITH(rotary_embedding(zeros({2, 3, 5})), HasSubstr("(B, H, T, D)"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({1, 2, 3, 5})), HasSubstr("must be even"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({1, 2, 3, 4}), {0.0}), HasSubstr("theta"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({1, 2, 3, 4}), {10000.0, -1}), HasSubstr("position_offset"));
  CHECK_THROWS_WITH(rotary_embedding(zeros({1, 2, 3, 4}, {DType::i32})), HasSubstr("floating"));
}
