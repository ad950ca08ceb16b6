// HALO (grad/pipeline_halo.h) on the CPU: the Hadamard matrices and rotations, the quantiser's definition, the
// scaled products, the pipeline's three products exact with quantisation off, against an f64 oracle built from
// the quantiser's own codes and scales with quantisation on, and its error against the exact products.
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <limits>
#include <optional>
#include <vector>

#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/grad/halo_paley.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/registry.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/scalar_types.h"
#include "hadatrain/train/inspect.h"

using namespace ht;
using namespace ht::grad;

namespace {

// (R, C) f64 copy of a 2-D tensor as nested vectors.
std::vector<std::vector<double>> rows_of(const Tensor& t) {
  const Tensor f = t.to(DType::f64).contiguous();
  std::vector<std::vector<double>> out(static_cast<std::size_t>(t.size(0)));
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t c = 0; c < t.size(1); ++c) out[static_cast<std::size_t>(r)].push_back(f.data<double>()[r * t.size(1) + c]);
  return out;
}
using Mat = std::vector<std::vector<double>>;

Mat matmul_nt(const Mat& a, const Mat& b) {  // a (M, K) · b (N, K)ᵀ
  Mat out(a.size(), std::vector<double>(b.size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < b.size(); ++j) {
      double s = 0;
      for (std::size_t k = 0; k < a[i].size(); ++k) s += a[i][k] * b[j][k];
      out[i][j] = s;
    }
  return out;
}
Mat transpose(const Mat& a) {
  Mat out(a[0].size(), std::vector<double>(a.size()));
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j) out[j][i] = a[i][j];
  return out;
}
// Columns [0, cols) of a (R, n), a padded with zero columns to n first.
Mat resize_cols(const Mat& a, std::size_t cols) {
  Mat out = a;
  for (auto& r : out) r.resize(cols, 0.0);
  return out;
}
Mat scaled(const Mat& a, double s) {
  Mat out = a;
  for (auto& r : out)
    for (double& v : r) v *= s;
  return out;
}

// H̃_n as a dense matrix: the forward rotation of the identity's rows (row i of I·H̃ is row i of H̃).
Mat dense_rotation(HaloRotation rot) {
  std::vector<float> eye(static_cast<std::size_t>(rot.n * rot.n), 0.0f);
  for (int64_t i = 0; i < rot.n; ++i) eye[static_cast<std::size_t>(i * rot.n + i)] = 1.0f;
  return rows_of(halo_rotate(from_vector(eye, {rot.n, rot.n}), {rot, HaloDirection::forward, rot.n, 1.0f, DType::f32}));
}

double rel_err(const Mat& got, const Mat& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    for (std::size_t j = 0; j < want[i].size(); ++j) {
      num += (got[i][j] - want[i][j]) * (got[i][j] - want[i][j]);
      den += want[i][j] * want[i][j];
    }
  return std::sqrt(num / den);
}

Mat deq(const HaloQuantized& q) { return rows_of(halo_dequantize(q)); }

HaloOptions opts(int level, Carrier carrier, bool quantize = true) {
  HaloOptions o;
  o.level = level;
  o.carrier = carrier;
  o.quantize = quantize;
  return o;
}

struct Products {
  Mat y, gx, gw;
};
// The pipeline's y, g_x, g_w for x (B, L, I), w (O, I), g (B, L, O) (f32).
Products run(const HaloOptions& o, const Tensor& x, const Tensor& w, const Tensor& g) {
  auto p = make_halo_pipeline(o);
  ForwardResult f = p->forward(x, w, ProductInfo{}, NoiseKey{}, SaveForBackward::yes);
  Grads gr = p->backward(*f.saved, g, {true, true});
  const int64_t T = x.size(0) * x.size(1);
  return {rows_of(reshape(f.y, {T, w.size(0)})), rows_of(reshape(gr.x, {T, x.size(2)})), rows_of(gr.w)};
}

}  // namespace

TEST_CASE("halo: every Paley order is a Hadamard matrix and rotation sizes are the smallest K·2^j", "[halo]") {
  for (int k : kHaloPaleyOrders) {
    const auto s = halo_hadamard_signs(k);
    REQUIRE(static_cast<int>(s.size()) == k);
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) {
        int dot = 0;
        for (int c = 0; c < k; ++c) dot += (((s[i] >> c) & 1U) ? -1 : 1) * (((s[j] >> c) & 1U) ? -1 : 1);
        INFO("order " << k << " rows " << i << ", " << j);
        CHECK(dot == (i == j ? k : 0));
      }
  }
  CHECK(halo_hadamard_signs(1) == std::vector<uint64_t>{0});
  for (int k : {0, 13, 24, 61}) {
    INFO("order " << k);
    CHECK(test::error_of([&] { halo_hadamard_signs(k); }).find("no Hadamard matrix of order " + std::to_string(k)) !=
          std::string::npos);
  }
  CHECK(halo_rotation_size(4096).n == 4096);
  CHECK(halo_rotation_size(4096).k == 1);
  CHECK(halo_rotation_size(14336).k == 28);  // Llama-3-8B intermediate: 28·512
  CHECK(halo_rotation_size(14336).n == 14336);
  CHECK(halo_rotation_size(5632).k == 44);   // TinyLlama: 44·128
  CHECK(halo_rotation_size(11008).n == 11264);  // Llama-2-7B's 172·64 is not built: padded to 44·256
  CHECK(halo_rotation_size(10).n == 12);
  CHECK_THROWS(halo_rotation_size(40000));
}

TEST_CASE("halo: the K×K stage multiplies by H_K, in the paired order for 28 and 36", "[halo]") {
  // A rotation of size K (no power-of-two part) is the K×K stage alone: the identity's rows rotate to H_K's rows
  // (forward, v·H_K) or columns (inverse, v·H_Kᵀ), exactly; a random row matches the f64 product. The orders 28 and
  // 36 take Note [HALO paired K×K stage] (grad/halo_paley.h), the others the dense sum: the same matrix either way.
  Generator gen(3);
  for (int k : kHaloPaleyOrders) {
    INFO("order " << k << (paley::pair_form(k) ? " (paired)" : ""));
    const HaloRotation rot = halo_rotation_size(k);
    REQUIRE(rot.n == k);
    REQUIRE(rot.k == k);
    const auto s = halo_hadamard_signs(k);
    const auto h = [&](int r, int c) { return ((s[static_cast<std::size_t>(r)] >> c) & 1U) != 0 ? -1.0 : 1.0; };
    std::vector<float> eye(static_cast<std::size_t>(k * k), 0.0f);
    for (int i = 0; i < k; ++i) eye[static_cast<std::size_t>(i * k + i)] = 1.0f;
    const Tensor id = from_vector(eye, {k, k});
    const Mat fwd = rows_of(halo_rotate(id, {rot, HaloDirection::forward, k, 1.0f, DType::f32}));
    const Mat inv = rows_of(halo_rotate(id, {rot, HaloDirection::inverse, k, 1.0f, DType::f32}));
    int wrong = 0;
    for (int r = 0; r < k; ++r)
      for (int c = 0; c < k; ++c)
        wrong += (fwd[r][c] != h(r, c)) + (inv[r][c] != h(c, r));
    CHECK(wrong == 0);
    const Tensor x = randn({4, k}, gen);
    const Mat xr = rows_of(x), got = rows_of(halo_rotate(x, {rot, HaloDirection::forward, k, 1.0f, DType::f32}));
    Mat want(4, std::vector<double>(static_cast<std::size_t>(k), 0.0));
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < k; ++c)
        for (int r = 0; r < k; ++r) want[i][c] += xr[i][r] * h(r, c);
    CHECK(rel_err(got, want) < 1e-6);
  }
}

TEST_CASE("halo: a NaN out of a rotation or into the quantiser is the canonical NaN, whatever its sign", "[halo]") {
  // Note [HALO rotations], NaN: CUDA's additions return 0x7FFFFFFF for any NaN operand; x86 keeps the sign of a
  // NaN operand (a negated one in the paired K×K stage's first term too) and makes 0xFFC00000 of Inf − Inf.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {16, 28, 56, 36, 12}) {
    const HaloRotation rot = halo_rotation_size(n);
    std::vector<float> rows(static_cast<std::size_t>(3 * n), 1.0f);
    rows[0] = -nan;                                                                   // a negative NaN
    rows[static_cast<std::size_t>(n + 1)] = nan;                                      // a positive one
    rows[static_cast<std::size_t>(2 * n)] = inf;                                      // Inf − Inf in the butterfly
    rows[static_cast<std::size_t>(2 * n + (rot.k == 1 ? 1 : n / rot.k))] = -inf;     // or in the K×K stage
    const Tensor x = from_vector(rows, {3, n});
    for (HaloDirection d : {HaloDirection::forward, HaloDirection::inverse}) {
      INFO("n " << n << " K " << rot.k << (d == HaloDirection::forward ? " forward" : " inverse"));
      const Tensor r = halo_rotate(x, {rot, d, n, 0.5f, DType::f32});
      const Tensor b = halo_rotate(x, {rot, d, n, 0.5f, DType::bf16});
      std::array<int, 3> nans{};
      int not_canonical = 0;
      for (int64_t i = 0; i < 3 * n; ++i) {
        const float e = r.data<float>()[i];
        if (e != e) {
          ++nans[static_cast<std::size_t>(i / n)];
          not_canonical += detail::f32_bits(e) != 0x7FFFFFFFu || b.data<bf16>()[i].bits != 0x7FC0u;
        }
      }
      // every output sums all of its row's inputs: rows 0 and 1 are all NaN; in row 2 the outputs where Inf and
      // −Inf meet with the same sign are NaN, the others ±Inf
      CHECK(nans[0] == n);
      CHECK(nans[1] == n);
      CHECK(nans[2] > 0);
      CHECK(nans[2] < n);
      CHECK(not_canonical == 0);
    }
    // the quantiser: rotated, and unrotated (CUDA multiplies the value by r): a NaN's e4m3 code is sign | 0x7F
    for (HaloRotation q : {rot, HaloRotation{}}) {
      const HaloQuantized c = halo_quantize(x, Carrier::fp8, q);
      CHECK(static_cast<const uint8_t*>(c.codes.data_ptr())[0] == 0x7Fu);
    }
  }
}

TEST_CASE("halo: a rotation and its inverse give n times the row, for padded and K·2^j sizes", "[halo]") {
  Generator gen(1);
  for (int64_t c : {16, 10, 24, 56, 80, 60, 88, 120}) {
    const HaloRotation rot = halo_rotation_size(c);
    const Tensor x = randn({3, c}, gen);
    const Tensor r = halo_rotate(x, {rot, HaloDirection::forward, rot.n, 1.0f, DType::f32});
    const Tensor back = halo_rotate(r, {rot, HaloDirection::inverse, c, 1.0f / static_cast<float>(rot.n), DType::f32});
    INFO("C " << c << " rotated at " << rot.n << " (K " << rot.k << ")");
    CHECK(rel_err(rows_of(back), rows_of(x)) < 1e-6);
    // orthogonality of H̃: ‖x·H̃‖² = n·‖x‖²
    const double nx = sum(mul(x, x)).item(), nr = sum(mul(r, r)).item();
    CHECK(std::abs(nr / (static_cast<double>(rot.n) * nx) - 1.0) < 1e-5);
  }
}

TEST_CASE("halo: the quantiser follows its definition (int8 and e4m3, rotated or not, zeros)", "[halo]") {
  Generator gen(2);
  const Tensor x = mul(randn({5, 24}, gen), 3.0);
  for (Carrier c : {Carrier::int8, Carrier::fp8}) {
    for (HaloRotation rot : {HaloRotation{}, halo_rotation_size(24)}) {
      const HaloQuantized q = halo_quantize(x, c, rot);
      const Tensor v = rot.n > 1 ? halo_rotate(x, {rot, HaloDirection::forward, rot.n, 1.0f, DType::f32}) : x;
      const float m = static_cast<float>(max(abs(v)).item());
      const float qmax = c == Carrier::int8 ? 127.0f : 448.0f;
      REQUIRE(q.scale.item() == static_cast<double>(m / qmax));
      const float r = qmax / m;
      const Tensor vc = v.contiguous();
      for (int64_t i = 0; i < v.numel(); ++i) {
        const float t = vc.data<float>()[i] * r;
        if (c == Carrier::int8) {
          REQUIRE(q.codes.data<int8_t>()[i] == static_cast<int8_t>(std::nearbyint(std::fmin(std::fmax(t, -127.0f), 127.0f))));
        } else {
          REQUIRE(static_cast<const uint8_t*>(q.codes.data_ptr())[i] == detail::float_to_e4m3_bits(t));
        }
      }
      // the element of largest magnitude maps to ±qmax exactly; dequantised error within half a step (int8) or
      // e4m3's relative half-ulp 2^-4 plus its subnormal step
      CHECK(max(abs(q.codes.to(DType::f32))).item() == qmax);
      const Mat d = deq(q), want = rows_of(v);
      const double s = q.scale.item();
      for (std::size_t i = 0; i < d.size(); ++i)
        for (std::size_t j = 0; j < d[i].size(); ++j) {
          const double bound = c == Carrier::int8 ? s * (0.5 + 1e-4)
                                                  : (std::abs(want[i][j]) / 16 + s * std::ldexp(1.0, -10)) * (1 + 1e-5);
          REQUIRE(std::abs(d[i][j] - want[i][j]) <= bound);
        }
    }
    const HaloQuantized z = halo_quantize(zeros({3, 7}), c);
    CHECK(z.scale.item() == 0.0);
    CHECK(max(abs(z.codes.to(DType::f32))).item() == 0.0);
  }
}

TEST_CASE("halo: the scaled int8 and fp8 products against f64", "[halo]") {
  Generator gen(3);
  for (Carrier c : {Carrier::int8, Carrier::fp8}) {
    const HaloQuantized a = halo_quantize(randn({6, 40}, gen), c), b = halo_quantize(randn({5, 40}, gen), c);
    const Tensor y = halo_product(a.codes, b.codes, a.scale, b.scale, {0.25f, DType::f32});
    const Mat want = scaled(matmul_nt(deq(a), deq(b)), 0.25);
    CHECK(rel_err(rows_of(y), want) < 1e-6);
  }
}

TEST_CASE("halo: with quantisation off every level gives the exact products (padded in and token dims)", "[halo]") {
  Generator gen(4);
  // I = 20 (a K·2^j size), O = 12, T = 2·5 = 10 tokens (level 2 pads them to 12); I = 13 padded to 16
  for (int64_t I : {20, 13}) {
    const Tensor x = randn({2, 5, I}, gen), w = randn({12, I}, gen), g = randn({2, 5, 12}, gen);
    const Mat X = rows_of(reshape(x, {10, I})), W = rows_of(w), G = rows_of(reshape(g, {10, 12}));
    const Mat y = matmul_nt(X, W), gx = matmul_nt(G, transpose(W)), gw = matmul_nt(transpose(G), transpose(X));
    for (int level : {0, 1, 2}) {
      const Products p = run(opts(level, Carrier::int8, false), x, w, g);
      INFO("I " << I << ", level " << level);
      CHECK(rel_err(p.y, y) < 1e-6);
      CHECK(rel_err(p.gx, gx) < 1e-6);
      CHECK(rel_err(p.gw, gw) < 1e-6);
    }
  }
}

TEST_CASE("halo: each product equals the f64 product of the quantiser's own codes and scales", "[halo]") {
  Generator gen(5);
  const int64_t B = 2, L = 5, I = 20, O = 12, T = B * L;
  const Tensor x = randn({B, L, I}, gen), w = randn({O, I}, gen), g = mul(randn({B, L, O}, gen), 0.1);
  const HaloRotation ri = halo_rotation_size(I), rt = halo_rotation_size(T);
  const Mat Hi = dense_rotation(ri), Ht = dense_rotation(rt);
  const double ni = static_cast<double>(ri.n), nt = static_cast<double>(rt.n);
  for (Carrier c : {Carrier::int8, Carrier::fp8}) {
    for (int level : {0, 1, 2}) {
      const Products p = run(opts(level, c), x, w, g);
      const Tensor x2 = reshape(x, {T, I}), g2 = reshape(g, {T, O});
      const HaloRotation rot = level == 0 ? HaloRotation{} : ri;
      const Mat qx = deq(halo_quantize(x2, c, rot)), qw = deq(halo_quantize(w, c, rot)), qe = deq(halo_quantize(g2, c));
      Mat y = matmul_nt(qx, qw), gw = matmul_nt(transpose(qe), transpose(qx)), gx;
      if (level == 0) {
        gx = matmul_nt(qe, transpose(qw));
      } else {
        y = scaled(y, 1 / ni);
        gw = resize_cols(scaled(matmul_nt(gw, Hi), 1 / ni), I);  // ·H̃ᵀ: rows of H̃
        if (level == 1) {
          gx = resize_cols(scaled(matmul_nt(matmul_nt(qe, transpose(qw)), Hi), 1 / ni), I);
        } else {  // Q(H̃_Tᵀ·g) from the quantiser of g's transpose rotated along T
          const Mat qr = transpose(deq(halo_quantize(g2.transpose(0, 1), c, rt)));  // (n_T, O)
          const Mat m = matmul_nt(qr, transpose(qw));                                // (n_T, n_I)
          const Mat left = matmul_nt(Ht, transpose(m));  // H̃_T·m: (n_T, n_I)
          gx = resize_cols(scaled(matmul_nt(left, Hi), 1 / (ni * nt)), I);
          gx.resize(static_cast<std::size_t>(T));
        }
      }
      INFO((c == Carrier::int8 ? "int8" : "fp8") << " level " << level);
      CHECK(rel_err(p.y, y) < 1e-6);
      CHECK(rel_err(p.gw, gw) < 1e-5);
      CHECK(rel_err(p.gx, gx) < 1e-5);
    }
  }
}

TEST_CASE("halo: quantised products stay near the exact ones, and rotations tame outlier channels", "[halo]") {
  Generator gen(6);
  const int64_t B = 4, L = 16, I = 64, O = 48, T = B * L;
  Tensor x = randn({B, L, I}, gen);
  // three outlier input channels 100x larger (LLM activations have a few such channels)
  std::vector<float> boost(static_cast<std::size_t>(I), 1.0f);
  boost[3] = boost[17] = boost[40] = 100.0f;
  x = mul(x, from_vector(boost, {I}));
  const Tensor w = mul(randn({O, I}, gen), 0.1), g = mul(randn({B, L, O}, gen), 0.01);
  const Products exact = run(opts(1, Carrier::int8, false), x, w, g);
  double err_y[3][2];
  for (int level : {0, 1, 2}) {
    for (Carrier c : {Carrier::int8, Carrier::fp8}) {
      const Products p = run(opts(level, c), x, w, g);
      INFO("level " << level << (c == Carrier::int8 ? " int8" : " fp8"));
      err_y[level][c == Carrier::int8 ? 0 : 1] = rel_err(p.y, exact.y);
      CHECK(rel_err(p.y, exact.y) < 0.1);
      CHECK(rel_err(p.gx, exact.gx) < 0.1);
      CHECK(rel_err(p.gw, exact.gw) < 0.1);
    }
  }
  // int8 without rotation loses the small channels to the outliers' scale; the rotation spreads the outliers
  CHECK(err_y[1][0] < 0.5 * err_y[0][0]);
  CHECK(err_y[2][0] == err_y[1][0]);  // levels 1 and 2 share the forward
  (void)T;
}

TEST_CASE("halo: inspect-grads' crest factor is max |v| / rms(v); outlier channels raise it, the rotation lowers it",
          "[halo]") {
  CHECK(train::crest_factor(from_vector(std::vector<float>{3, -4, 0, 0}, {4})) == Approx(1.6));  // 4 / 2.5
  CHECK(train::crest_factor(zeros({3, 2})) == 0.0);
  Generator gen(7);
  const int64_t R = 256, C = 64;
  Tensor x = randn({R, C}, gen);
  const double plain = train::crest_factor(x);
  CHECK(plain > 2.5);  // a Gaussian's max over 16k values is near 4
  CHECK(plain < 6.0);
  std::vector<float> boost(static_cast<std::size_t>(C), 1.0f);
  boost[5] = 30.0f;  // one outlier channel
  x = mul(x, from_vector(boost, {C}));
  const double outlier = train::crest_factor(x);
  CHECK(outlier > 12.0);  // the channel dominates: rms ≈ 30 / √64, max ≈ 30 · 2.8, so about 22
  const HaloRotation rot = halo_rotation_size(C);
  const double rotated = train::crest_factor(halo_rotate(x, {rot, HaloDirection::forward, C, 1.0f, DType::f32}));
  CHECK(rotated < 0.25 * outlier);  // the rotation spreads the channel over all 64: about a Gaussian's again
}

TEST_CASE("halo: registered with its options and description", "[halo]") {
  PipelineSpec spec;
  spec.name = "halo";
  HaloOptions& o = spec.options_as<HaloOptions>();
  o.level = 1;
  o.carrier = Carrier::fp8;
  CHECK(o.fp8_accumulation == Fp8Accumulation::fast);  // the default (Note [HALO's fp8 accumulation])
  CHECK(describe(spec) == "halo (level 1, fp8 e4m3; forward quantised)");
  o.fp8_accumulation = Fp8Accumulation::precise;
  CHECK(describe(spec) == "halo (level 1, fp8 e4m3, precise accumulation; forward quantised)");
  o.carrier = Carrier::int8;  // int8 products sum in int32: the field does not apply
  o.fp8_accumulation = Fp8Accumulation::fast;
  CHECK(describe(spec) == "halo (level 1, int8; forward quantised)");
  o.cache_frozen_weight = false;
  CHECK(describe(spec) == "halo (level 1, int8, frozen weights quantised every forward; forward quantised)");
  o.cache_frozen_weight = true;
  CHECK_NOTHROW(make_pipeline(spec));
  o.carrier = Carrier::fp8;
  auto p = make_pipeline(spec);
  CHECK(p->name() == "halo");
  CHECK_FALSE(p->exact_forward());
  CHECK_FALSE(p->draws_noise());
  bool found = false;
  for (const auto& n : registered_pipelines()) found = found || n == "halo";
  CHECK(found);
}

TEST_CASE("halo: the phase hook sees each level's phases in order, and nothing once removed", "[halo]") {
  Generator gen(9);
  const Tensor x = randn({2, 6, 16}, gen), w = randn({8, 16}, gen), g = randn({2, 6, 8}, gen);
  std::vector<std::string> seen;
  set_halo_phase_hook([&](const char* phase) { seen.emplace_back(phase); });
  const std::vector<std::string> fwd = {"fwd Q(x·H)", "fwd Q(W·H)", "fwd y GEMM", "int8 epilogue (i32 -> scaled output)",
                                        "fwd save Q(x·H)ᵀ, Q(W·H)ᵀ (transposes)", "end"};
  const std::string epi = "int8 epilogue (i32 -> scaled output)";
  // levels 0 and 1 quantise g_y with its transposed codes in one phase (halo_quantize_transposed)
  const std::vector<std::string> bwd01 = {"bwd Q(g_y) and Q(g_y)ᵀ", "bwd g_x GEMM", epi, "bwd g_x rotate back",
                                          "bwd g_w GEMM", epi, "bwd g_w rotate back", "end"};
  const std::vector<std::string> bwd2 = {"bwd g_yᵀ (bf16 transpose)", "bwd Q(g_yᵀ) and Q(g_yᵀ·H_T) (paired)",
                                         "bwd g_w GEMM", epi, "bwd g_w rotate back", "bwd Q(g_yᵀ·H_T)ᵀ (transpose)",
                                         "bwd g_x GEMM", epi, "bwd g_x rotate back along T", "bwd g_x transpose",
                                         "bwd g_x rotate back along in", "end"};
  for (int level : {0, 1, 2}) {
    INFO("level " << level);
    seen.clear();
    (void)run(opts(level, Carrier::int8, true), x, w, g);
    std::vector<std::string> want = fwd;
    for (const std::string& p : level < 2 ? bwd01 : bwd2) want.push_back(p);
    CHECK(seen == want);
  }
  set_halo_phase_hook({});
  seen.clear();
  (void)run(opts(2, Carrier::fp8, true), x, w, g);
  CHECK(seen.empty());
}

TEST_CASE("halo: products that read one x inside a SharedInputScope quantise it once and keep one Q(x·H)ᵀ, the same bits",
          "[halo]") {
  // Note [Shared product inputs] (grad/pipeline.h): q, k and v projections of one input, each its own pipeline.
  Generator gen(21);
  const Tensor x = randn({2, 6, 24}, gen);  // I = 24: rotated at 24 = 12·2 at levels 1 and 2
  std::vector<Tensor> ws, gs;
  for (int64_t o : {16, 8, 8}) {
    ws.push_back(randn({o, 24}, gen));
    gs.push_back(randn({2, 6, o}, gen));
  }
  struct Run {
    std::vector<Products> p;
    int64_t bytes = 0;
    int quantised = 0, shared = 0;
  };
  // The three products on x (`first_w_grad`: whether the first one is asked to keep x's form for g_w, as a LoRA
  // base is not), then, when `scope` is set, inside one scope.
  auto run3 = [&](const HaloOptions& o, bool scope, bool first_w_grad) {
    Run r;
    set_halo_phase_hook([&](const char* phase) {
      r.quantised += std::string(phase) == "fwd Q(x·H)";
      r.shared += std::string(phase) == "fwd Q(x·H) shared";
    });
    std::vector<std::shared_ptr<Pipeline>> ps;
    std::vector<ForwardResult> fs;
    {
      std::optional<SharedInputScope> s;
      if (scope) s.emplace();
      for (std::size_t i = 0; i < ws.size(); ++i) {
        ProductInfo info;
        info.w_grad = i > 0 || first_w_grad;
        ps.push_back(make_halo_pipeline(o));
        fs.push_back(ps.back()->forward(x, ws[i], info, NoiseKey{}, SaveForBackward::yes));
        r.bytes += fs.back().saved->bytes;
      }
    }
    set_halo_phase_hook({});
    for (std::size_t i = ws.size(); i-- > 0;) {  // backward in reverse, as autograd runs it
      const bool w_grad = i > 0 || first_w_grad;
      Grads g = ps[i]->backward(*fs[i].saved, gs[i], {true, w_grad});
      const int64_t T = x.size(0) * x.size(1);
      r.p.push_back({rows_of(reshape(fs[i].y, {T, ws[i].size(0)})), rows_of(reshape(g.x, {T, x.size(2)})),
                     w_grad ? rows_of(g.w) : Mat{}});
    }
    return r;
  };
  for (int level : {0, 1, 2})
    for (Carrier c : {Carrier::int8, Carrier::fp8})
      for (bool first_w_grad : {true, false}) {
        INFO("level " << level << (c == Carrier::int8 ? " int8" : " fp8") << (first_w_grad ? "" : ", first frozen"));
        const Run alone = run3(opts(level, c), false, first_w_grad), shared = run3(opts(level, c), true, first_w_grad);
        CHECK(alone.quantised == 3);
        CHECK(alone.shared == 0);
        CHECK(shared.quantised == 1);
        CHECK(shared.shared == 2);
        for (std::size_t i = 0; i < alone.p.size(); ++i) {
          CHECK(shared.p[i].y == alone.p[i].y);
          CHECK(shared.p[i].gx == alone.p[i].gx);
          CHECK(shared.p[i].gw == alone.p[i].gw);
        }
        // one Q(x·H)ᵀ (T, n_I) of one-byte codes instead of one per product that keeps it
        const int64_t one = 12 * (level == 0 ? 24 : halo_rotation_size(24).n);
        CHECK(alone.bytes == (first_w_grad ? 3 : 2) * one);
        CHECK(shared.bytes == one);
      }

  // Not shared: another carrier, another tensor holding the same values, or after the scope closed.
  int quantised = 0;
  set_halo_phase_hook([&](const char* phase) { quantised += std::string(phase) == "fwd Q(x·H)"; });
  {
    const SharedInputScope s;
    const HaloOptions o8 = opts(2, Carrier::int8), f8 = opts(2, Carrier::fp8);
    (void)make_halo_pipeline(o8)->forward(x, ws[0], ProductInfo{}, NoiseKey{}, SaveForBackward::no);
    (void)make_halo_pipeline(f8)->forward(x, ws[1], ProductInfo{}, NoiseKey{}, SaveForBackward::no);
    (void)make_halo_pipeline(o8)->forward(x.clone(), ws[2], ProductInfo{}, NoiseKey{}, SaveForBackward::no);
    CHECK(quantised == 3);
    (void)make_halo_pipeline(f8)->forward(x, ws[2], ProductInfo{}, NoiseKey{}, SaveForBackward::no);
    CHECK(quantised == 3);  // fp8 of x was made above
  }
  (void)make_halo_pipeline(opts(2, Carrier::int8))->forward(x, ws[0], ProductInfo{}, NoiseKey{}, SaveForBackward::no);
  CHECK(quantised == 4);
  set_halo_phase_hook({});
  CHECK(shared_input_slot(x, "anything") == nullptr);  // outside a scope

  // Nested scopes: an entry made inside the inner one lives until the outermost closes.
  {
    const SharedInputScope outer;
    {
      const SharedInputScope inner;
      *shared_input_slot(x, "k") = std::make_shared<int>(7);
    }
    std::shared_ptr<void>* slot = shared_input_slot(x, "k");
    REQUIRE(slot != nullptr);
    REQUIRE(*slot != nullptr);
    CHECK(*std::static_pointer_cast<int>(*slot) == 7);
    CHECK(*shared_input_slot(x, "other") == nullptr);                            // another key
    CHECK(*shared_input_slot(reshape(x, {12, 24}), "k") == nullptr);             // another shape of x
    CHECK(*shared_input_slot(narrow(x, 2, 1, 8).contiguous(), "k") == nullptr);  // another storage
  }
  {
    const SharedInputScope again;
    CHECK(*shared_input_slot(x, "k") == nullptr);  // dropped when the outermost scope closed
  }
}

TEST_CASE("halo: a frozen weight is quantised once and its codes reused until it is written, the same bits", "[halo]") {
  // Note [HALO's frozen weight codes] (src/grad/pipeline_halo.cpp), Note [Storage versions] (tensor/allocator.h)
  Generator gen(23);
  const Tensor x = randn({2, 6, 24}, gen), g = randn({2, 6, 16}, gen);
  int quantised = 0, cached = 0;
  set_halo_phase_hook([&](const char* phase) {
    quantised += std::string(phase) == "fwd Q(W·H)";
    cached += std::string(phase) == "fwd Q(W·H) cached";
  });
  // One forward + backward (g_x only, as LoRA's base asks) of pipeline p on w: y and g_x.
  auto step = [&](Pipeline& p, const Tensor& w, bool w_grad = false) {
    ProductInfo info;
    info.w_grad = w_grad;
    ForwardResult f = p.forward(x, w, info, NoiseKey{}, SaveForBackward::yes);
    Grads gr = p.backward(*f.saved, g, {true, w_grad});
    return Products{rows_of(reshape(f.y, {12, 16})), rows_of(reshape(gr.x, {12, 24})), {}};
  };
  auto same = [](const Products& a, const Products& b) { return a.y == b.y && a.gx == b.gx; };
  for (int level : {0, 1, 2})
    for (Carrier c : {Carrier::int8, Carrier::fp8}) {
      INFO("level " << level << (c == Carrier::int8 ? " int8" : " fp8"));
      const HaloOptions o = opts(level, c);
      Tensor w = randn({16, 24}, gen);
      auto p = make_halo_pipeline(o);
      quantised = cached = 0;
      // kept from the second forward that sees w unchanged on (a weight refilled before every forward is not kept)
      const Products first = step(*p, w);
      CHECK(p->kept_bytes() == 0);  // seen once: nothing kept yet
      const Products second = step(*p, w), third = step(*p, w), fourth = step(*p, w);
      // kept: the codes (16, n_I) and their transpose, one byte an element, and the f32 scale they share
      const int64_t n_i = level == 0 ? 24 : halo_rotation_size(24).n;
      CHECK(p->kept_bytes() == 2 * 16 * n_i + 4);
      CHECK(quantised == 2);
      CHECK(cached == 2);
      CHECK(same(second, first));
      CHECK(same(third, first));
      CHECK(same(fourth, first));
      const int64_t uses = frozen_weight_uses();
      (void)step(*p, reshape(w, {16, 24}));  // a view of the same storage, offset, shape and strides
      CHECK(frozen_weight_uses() == uses + 1);

      // Written in place (a checkpoint load, a LoRA merge): quantised again, as a new pipeline quantises the new values.
      for (int write = 0; write < 3; ++write) {
        INFO("write " << write);
        if (write == 0) mul_(w, 0.5);
        if (write == 1) add_(w, randn({16, 24}, gen));
        if (write == 2) copy_(w, randn({16, 24}, gen));
        quantised = cached = 0;
        const Products after = step(*p, w);
        CHECK(quantised == 1);
        CHECK(cached == 0);
        CHECK_FALSE(same(after, first));
        CHECK(same(after, step(*make_halo_pipeline(o), w)));
      }
      // Not reused: another storage with the same values, a view at another offset, a weight that requires grad,
      // a product asked for g_w, the option off.
      quantised = cached = 0;
      (void)step(*p, w.clone());
      (void)step(*p, w);  // the clone replaced w's entry
      CHECK(quantised == 2);
      const Tensor both = cat({randn({1, 24}, gen), w}, 0);
      for (int i = 0; i < 3; ++i) (void)step(*p, narrow(both, 0, 1, 16));
      CHECK(quantised == 4);
      CHECK(cached == 1);
      quantised = cached = 0;
      Tensor trained = w.clone();
      trained.set_requires_grad(true);
      (void)step(*p, trained, true);
      (void)step(*p, trained, true);
      (void)step(*p, w, true);
      (void)step(*p, w, true);
      CHECK(quantised == 4);
      CHECK(cached == 0);
      HaloOptions off = o;
      off.cache_frozen_weight = false;
      auto p_off = make_halo_pipeline(off);
      (void)step(*p_off, w);
      CHECK(same(step(*p_off, w), step(*p, w)));
      CHECK(quantised == 7);  // p's too: the weight that requires grad dropped its entry
      CHECK(cached == 0);
      CHECK(p_off->kept_bytes() == 0);
    }
  set_halo_phase_hook({});
}
