// Gradient pipelines (grad/pipeline.h): exactness with quantisation and rank reduction off, documented
// error bounds on random data, unbiasedness of the stochastic g_x path, saved bytes (ACBP), noise keying,
// the autograd op, module binding and config selection.
#include <cmath>
#include <map>

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/node.h"
#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/capture.h"
#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_halo.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/grad/pipeline_lbp_wht.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/tensor/philox.h"
#include "hadatrain/train/pipeline_config.h"
#include "grad/pipeline_helpers.h"
#include "support/catch.h"
#include "support/model_testing.h"
#include "support/gradcheck.h"
#include "support/testing.h"

using namespace ht;

namespace {

struct Problem {
  Tensor x, w, g_y, g_x, g_w;  // exact g_x (B, L, I), g_w (O, I) in f64
};

// Random x (B, L, I), w (O, I), g_y (B, L, O) in f32 and the exact gradients in f64.
Problem make_problem(int64_t B, int64_t L, int64_t I, int64_t O, uint64_t seed) {
  Problem p;
  p.x = test::random_tensor({B, L, I}, seed, DType::f32);
  p.w = test::random_tensor({O, I}, seed + 1, DType::f32);
  p.g_y = test::random_tensor({B, L, O}, seed + 2, DType::f32);
  const Tensor g64 = p.g_y.to(DType::f64);
  p.g_x = matmul(g64, p.w.to(DType::f64));
  p.g_w = matmul(reshape(g64, {B * L, O}).transpose(0, 1), reshape(p.x.to(DType::f64), {B * L, I}));
  return p;
}

grad::Grads run(grad::Pipeline& p, const Problem& pr, int64_t step = 0, grad::ProductInfo info = {}) {
  grad::ForwardResult f = p.forward(pr.x, pr.w, info, grad::NoiseKey{7, 3, step}, grad::SaveForBackward::yes);
  // The forward product is the plain high-precision one for every pipeline.
  CHECK(test::rel_error(f.y, matmul(pr.x.to(DType::f64), pr.w.to(DType::f64).transpose(0, 1))) < 1e-6);
  return p.backward(*f.saved, pr.g_y, {true, true});
}

grad::PipelineSpec hlq_spec() {
  grad::PipelineSpec s;
  s.name = "hlq";
  return s;
}

grad::PipelineSpec hlq_lossless() {
  grad::PipelineSpec s = hlq_spec();
  s.options_as<grad::HlqOptions>().gx_bits = 0;
  s.options_as<grad::HlqOptions>().gw_bits = 0;
  s.options_as<grad::HlqOptions>().acbp_bits = 0;
  s.options_as<grad::HlqOptions>().rank.kind = grad::HlaRank::Kind::full;
  return s;
}

}  // namespace

TEST_CASE("hlq with quantisation off and full rank reproduces exact gradients", "[grad]") {
  // O = 48 (T 16), 12 (T 4), 7 (T 1); L = 64 (n 64), 48 (n 16), 13 (n 1).
  for (auto [L, O] : {std::pair<int64_t, int64_t>{64, 48}, {48, 12}, {13, 7}}) {
    const Problem pr = make_problem(3, L, 20, O, 100 + L);
    auto p = grad::make_pipeline(hlq_lossless());
    const grad::Grads g = run(*p, pr);
    INFO("L " << L << " O " << O);
    CHECK(test::rel_error(g.x, pr.g_x) < 1e-5);  // checks the 1/T of the rotated product
    CHECK(test::rel_error(g.w, pr.g_w) < 1e-5);  // checks the 1/n of the projection
  }
}

TEST_CASE("hlq fallbacks keep exactness at full rank", "[grad]") {
  const Problem pr = make_problem(2, 17, 12, 16, 5);  // 17 tokens: no power-of-two factor
  for (auto fb : {grad::HlaFallback::ref, grad::HlaFallback::split_extra, grad::HlaFallback::pad}) {
    grad::PipelineSpec s = hlq_lossless();
    s.options_as<grad::HlqOptions>().fallback = fb;
    auto p = grad::make_pipeline(s);
    const grad::Grads g = run(*p, pr);
    CHECK(test::rel_error(g.w, pr.g_w) < 1e-5);
  }
}

TEST_CASE("hlq low rank without quantisation is the projected gradient", "[grad]") {
  // With rank reduction only, g_w = Σ_b g_y[b]ᵀ Π x[b]: exact when x lies in the kept subspace. A
  // constant-along-L x lies in the lowest-sequency row, so g_w stays exact; random x does not.
  grad::PipelineSpec s = hlq_lossless();
  s.options_as<grad::HlqOptions>().rank = grad::HlaRank{};  // percentile 50
  auto p = grad::make_pipeline(s);
  Problem pr = make_problem(2, 64, 8, 16, 9);
  const grad::Grads g_random = run(*p, pr);
  CHECK(test::rel_error(g_random.w, pr.g_w) > 0.05);
  CHECK(test::rel_error(g_random.x, pr.g_x) < 1e-5);  // the g_x path has no rank reduction
  pr.x = expand(test::random_tensor({2, 1, 8}, 10, DType::f32), {2, 64, 8}).contiguous();
  pr.g_w = matmul(reshape(pr.g_y.to(DType::f64), {128, 16}).transpose(0, 1), reshape(pr.x.to(DType::f64), {128, 8}));
  CHECK(test::rel_error(run(*p, pr).w, pr.g_w) < 1e-5);
}

TEST_CASE("hlq explicit rank rows are capped per block size", "[grad]") {
  // rank_rows 36 is the pct-50 rank of n = 64; a 16-position layer (n 16, s² = 16) keeps all 16 rows instead
  // of failing, so one setting serves every stage of a network.
  grad::PipelineSpec s = hlq_lossless();
  s.options_as<grad::HlqOptions>().rank.kind = grad::HlaRank::Kind::rows;
  s.options_as<grad::HlqOptions>().rank.rows = 36;
  auto p = grad::make_pipeline(s);
  const Problem small = make_problem(2, 16, 8, 16, 12);
  CHECK(test::rel_error(run(*p, small).w, small.g_w) < 1e-5);  // 16 of 16 rows: exact
  const Problem big = make_problem(2, 64, 8, 16, 13);
  grad::ForwardResult f = p->forward(big.x, big.w, {}, {}, grad::SaveForBackward::yes);
  CHECK(f.saved->bytes == 2 * 36 * 8 * 4);  // 36 of 64 rows kept, f32
}

TEST_CASE("hlq default options stay within the documented error bound", "[grad]") {
  // docs/gradient_pipelines.md: on uniform random data (B 4, L 64, I 64, O 64) the 4-bit g_x has a relative error
  // below 0.35 with cosine above 0.94; g_w at pct 50 (r/n = 36/64) loses the high-sequency half of a white
  // signal, relative error below 0.8, cosine above 0.6.
  const Problem pr = make_problem(4, 64, 64, 64, 11);
  auto p = grad::make_pipeline(hlq_spec());
  const grad::Grads g = run(*p, pr);
  const double ex = test::rel_error(g.x, pr.g_x), ew = test::rel_error(g.w, pr.g_w);
  INFO("g_x rel err " << ex << ", g_w rel err " << ew);
  CHECK(ex > 0.01);  // it really quantised
  CHECK(ex < 0.35);
  CHECK(ew < 0.8);
}

TEST_CASE("hlq g_x path is unbiased with stochastic rounding on both operands", "[grad]") {
  grad::PipelineSpec s = hlq_spec();
  s.options_as<grad::HlqOptions>().w_quant = grad::WeightQuant::absmax_sr;
  s.options_as<grad::HlqOptions>().gy_scale = grad::ScaleGranularity::tensor;
  auto p = grad::make_pipeline(s);
  const Problem pr = make_problem(1, 16, 16, 32, 21);
  const int runs = 400;
  Tensor mean = zeros({1, 16, 16}, {DType::f64});
  double single = 0;
  for (int k = 0; k < runs; ++k) {
    const grad::Grads g = run(*p, pr, k);
    if (k == 0) single = test::rel_error(g.x, pr.g_x);
    mean = add(mean, g.x.to(DType::f64));
  }
  mean = div(mean, static_cast<double>(runs));
  INFO("single-draw error " << single << ", mean of " << runs << " draws " << test::rel_error(mean, pr.g_x));
  // The mean's error shrinks like 1/sqrt(runs): 20x below a single draw, with margin.
  CHECK(test::rel_error(mean, pr.g_x) < single / 8);
}

TEST_CASE("hlq noise is keyed by (seed, layer, step)", "[grad]") {
  auto p = grad::make_pipeline(hlq_spec());
  const Problem pr = make_problem(2, 16, 8, 16, 31);
  const grad::Grads a = run(*p, pr, 5), b = run(*p, pr, 5), c = run(*p, pr, 6);
  CHECK(test::compare(a.x, b.x, 0.0, 0.0) == "");
  CHECK(test::compare(a.w, b.w, 0.0, 0.0) == "");
  CHECK(test::rel_error(a.x, c.x) > 0);
}

TEST_CASE("hlq overlap: the split backward (Note [HLQ's two chains]) gives one stream's gradients", "[grad]") {
  // On the CPU a side branch runs in place, so this checks the split arrangement's dataflow: L 16 (HLA plan n 16,
  // g_w's whole chain in the branch) and L 15 (identity plan: g_y's quantiser in the branch hands max |g_y| to g_w)
  for (const int64_t L : {int64_t{16}, int64_t{15}}) {
    INFO("L " << L);
    const Problem pr = make_problem(2, L, 8, 16, 41);
    grad::PipelineSpec one = hlq_spec();
    one.options_as<grad::HlqOptions>().overlap = false;
    auto two_streams = grad::make_pipeline(hlq_spec()), one_stream = grad::make_pipeline(one);
    const grad::Grads a = run(*two_streams, pr, 3), b = run(*one_stream, pr, 3);
    REQUIRE(a.x.defined());
    REQUIRE(a.w.defined());
    CHECK(test::compare(a.x, b.x, 0.0, 0.0) == "");
    CHECK(test::compare(a.w, b.w, 0.0, 0.0) == "");
    CHECK(test::rel_error(a.w, pr.g_w) < 0.9);  // a gradient (low-rank g_w loses up to about 0.8), not zeros
    CHECK(test::rel_error(a.x, pr.g_x) < 0.35);
  }
}

TEST_CASE("hlq ACBP saves the projected activation only", "[grad]") {
  const int64_t B = 2, L = 1024, I = 16, O = 16;
  const Problem pr = make_problem(B, L, I, O, 41);
  for (int bits : {8, 4, 0}) {
    grad::PipelineSpec s = hlq_spec();
    s.options_as<grad::HlqOptions>().acbp_bits = bits;
    if (bits == 4) s.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;  // one scale per sample: 4·B bytes
    if (bits == 0) s.options_as<grad::HlqOptions>().gw_bits = 0;
    auto p = grad::make_pipeline(s);
    grad::ForwardResult f = p->forward(pr.x, pr.w, {}, {}, grad::SaveForBackward::yes);
    // n = 1024 keeps r = 528 rows: B·I·528 values, plus one f32 scale (gw_scale tensor) when quantised.
    const int64_t values = B * I * 528;
    const int64_t expected = bits == 8 ? values + 4 : bits == 4 ? values / 2 + 4 * B : values * 4;
    INFO("acbp_bits " << bits);
    CHECK(f.saved->bytes == expected);
    const grad::Grads g = p->backward(*f.saved, pr.g_y, {true, true});
    CHECK(test::rel_error(g.w, pr.g_w) < 0.8);
  }
}

TEST_CASE("lbp_wht with all 64 bases reproduces exact gradients", "[grad]") {
  grad::PipelineSpec s;
  s.name = "lbp_wht";
  s.options_as<grad::LbpWhtOptions>().order = 15;
  auto p = grad::make_pipeline(s);
  for (int64_t L : {64, 65, 36, 256}) {  // 8×8; 8×8 plus a class token; 6×6 (padded); 16×16 (4 patches)
    const Problem pr = make_problem(2, L, 12, 10, 50 + L);
    const grad::Grads g = run(*p, pr);
    INFO("L " << L);
    CHECK(test::rel_error(g.x, pr.g_x) < 1e-5);
    CHECK(test::rel_error(g.w, pr.g_w) < 1e-5);
  }
}

TEST_CASE("lbp_wht order 6 keeps 21 of 64 bases and saves r/64 of x", "[grad]") {
  grad::PipelineSpec s;
  s.name = "lbp_wht";
  auto p = grad::make_pipeline(s);
  const Problem pr = make_problem(2, 256, 12, 10, 60);
  grad::ForwardResult f = p->forward(pr.x, pr.w, {}, {}, grad::SaveForBackward::yes);
  CHECK(f.saved->bytes == 2 * 4 * 21 * 12 * 4);  // B·P·r·I f32
  const grad::Grads g = p->backward(*f.saved, pr.g_y, {true, true});
  CHECK(test::rel_error(g.x, pr.g_x) > 0.1);  // low rank on white noise
  CHECK(test::rel_error(g.x, pr.g_x) < 1.0);
  // A layer without a token grid (2-D input) runs exact.
  grad::ProductInfo rows;
  rows.batch_rows = true;
  const Problem p2 = make_problem(1, 10, 6, 5, 61);
  const grad::Grads g2 = run(*p, p2, 0, rows);
  CHECK(test::rel_error(g2.x, p2.g_x) < 1e-6);
  CHECK(test::rel_error(g2.w, p2.g_w) < 1e-6);
  // It keeps x itself, counted like every tensor kept for backward (Note [Shared saved inputs]).
  grad::ForwardResult f2 = p->forward(p2.x, p2.w, rows, {}, grad::SaveForBackward::yes);
  CHECK(kept_for_backward(p2.x));
  CHECK(f2.saved->bytes == 10 * 6 * 4);
  f2.saved.reset();
  CHECK_FALSE(kept_for_backward(p2.x));
}

TEST_CASE("luq gradients are close to exact and its saved x is packed 4-bit", "[grad]") {
  grad::PipelineSpec s;
  s.name = "luq";
  auto p = grad::make_pipeline(s);
  const Problem pr = make_problem(2, 32, 16, 24, 70);
  grad::ForwardResult f = p->forward(pr.x, pr.w, {}, {}, grad::SaveForBackward::yes);
  CHECK(f.saved->bytes == 2 * 32 * 16 / 2 + 2 * 4);
  const grad::Grads g = p->backward(*f.saved, pr.g_y, {true, true});
  const double ex = test::rel_error(g.x, pr.g_x), ew = test::rel_error(g.w, pr.g_w);
  INFO("luq g_x " << ex << " g_w " << ew);
  CHECK(ex > 0.01);
  CHECK(ex < 0.6);
  CHECK(ew < 0.6);
}

TEST_CASE("matmul_f32 multiplies 16-bit operands into f32 without a 16-bit rounding", "[grad][matmul]") {
  const Tensor a = test::random_tensor({5, 7}, 95, DType::f32).to(DType::bf16);
  const Tensor b = test::random_tensor({9, 7}, 96, DType::f32).to(DType::bf16);
  const Tensor out = matmul_f32(a, b.transpose(0, 1));  // a transposed view
  CHECK(out.dtype() == DType::f32);
  const Tensor ref = matmul(a.to(DType::f64), b.to(DType::f64).transpose(0, 1));
  CHECK(test::rel_error(out, ref) < 1e-6);                                     // f32 accuracy
  CHECK(test::rel_error(matmul(a, b.transpose(0, 1)), ref) > 1e-4);            // bf16 output: rounded
  CHECK_THROWS_WITH(matmul_f32(a, b), HasSubstr("expected a (M, K) and b (K, N)"));
}

TEST_CASE("luq's g_w is its definition, Σ_b α_b·s_x[b]·q_g[b]ᵀ·q_x[b], and g_x's outer scales", "[grad]") {
  // Note [LUQ g_w in one product]: one bf16 product over the split scales instead of one fp8 product per sample.
  // The reference re-quantises g_y and x with the pipeline's specs and noise and sums per sample in f64.
  const int64_t B = 3, L = 8, I = 16, O = 24;
  const Problem pr = make_problem(B, L, I, O, 90);
  grad::PipelineSpec s;
  s.name = "luq";
  auto p = grad::make_pipeline(s);
  const grad::NoiseKey key{7, 3, 5};
  grad::ForwardResult f = p->forward(pr.x, pr.w, {}, key, grad::SaveForBackward::yes);
  const grad::Grads g = p->backward(*f.saved, pr.g_y, {true, true});
  grad::LuqSpec ls;
  ls.noise = key.noise(4);  // role_luq_gy (src/grad/pipeline_helpers.h)
  const grad::Quantized gq = grad::luq_quantize(pr.g_y, ls);
  grad::QuantSpec qx;
  qx.bits = 4;
  qx.granularity = grad::Granularity::sample;
  qx.scale_rule = grad::ScaleRule::sawb;
  qx.rounding = grad::Rounding::nearest;
  const grad::Quantized xq = grad::quantize(pr.x, qx);
  auto scalar = [](const Tensor& t, int64_t i) { return t.to(DType::f64).contiguous().data<double>()[i]; };
  Tensor ref = zeros({O, I}, {DType::f64});
  for (int64_t b = 0; b < B; ++b) {
    const Tensor gb = select(gq.values, 0, b).to(DType::f64), xb = select(xq.values, 0, b).to(DType::f64);
    ref = add(ref, mul(matmul(gb.transpose(0, 1), xb), scalar(gq.scale, b) * scalar(xq.scale, b)));
  }
  // Relative to the largest element (the sums cancel): the split scale (2^-17) and the fp32 sums.
  const double err = scalar(max(abs(sub(g.w.to(DType::f64), ref))), 0) / scalar(max(abs(ref)), 0);
  INFO("g_w error " << err);
  CHECK(std::isfinite(err));
  CHECK(err < 1e-5);  // hi alone would be off by up to 2^-9
  // g_x: α_b·s_w·(q_g · q_wᵀ) rounded once; s_w is W's 4-bit SAWB scale per tensor.
  grad::QuantSpec qw = qx;
  qw.granularity = grad::Granularity::tensor;
  const grad::Quantized wq = grad::quantize(pr.w.transpose(0, 1), qw);  // (I, O)
  const Tensor prod = matmul(gq.values.to(DType::f64), wq.values.to(DType::f64).transpose(0, 1));  // (B, L, I)
  const Tensor gx_ref = mul(mul(prod, reshape(gq.scale.to(DType::f64), {B, 1, 1})), scalar(wq.scale, 0));
  CHECK(test::rel_error(g.x, gx_ref) < 1e-6);
}

TEST_CASE("scaled_code_product is the per-sample scaled sum of int8 code products", "[grad]") {
  // Note [Per-sample scales in one product]: HLQ's per-sample g_w (8-bit codes up to ±127) as one bf16 product over
  // the split scaled codes, against the per-sample sum in f64.
  const int64_t B = 4, K = 12, M = 20, N = 9;
  grad::QuantSpec q8;
  q8.bits = 8;
  q8.granularity = grad::Granularity::sample;
  q8.rounding = grad::Rounding::nearest;
  const grad::Quantized qa = grad::quantize(test::random_tensor({B, K, M}, 97, DType::f32), q8);
  const grad::Quantized qb = grad::quantize(test::random_tensor({B, K, N}, 98, DType::f32), q8);
  REQUIRE(qa.values.dtype() == DType::i8);
  const Tensor scale = mul(mul(qa.scale, qb.scale), 3.7e-3);  // (B) f32, 24 significant bits
  const Tensor out = grad::scaled_code_product(qa.values, qb.values, scale);
  REQUIRE(out.shape() == Shape{M, N});
  CHECK(out.dtype() == DType::f32);
  const std::vector<double> c = scale.to_vector<double>();
  Tensor ref = zeros({M, N}, {DType::f64});
  for (int64_t b = 0; b < B; ++b) {
    const Tensor ab = select(qa.values, 0, b).to(DType::f64), bb = select(qb.values, 0, b).to(DType::f64);
    ref = add(ref, mul(matmul(ab.transpose(0, 1), bb), c[static_cast<std::size_t>(b)]));
  }
  const double err = test::rel_error(out, ref);
  INFO("error " << err);
  CHECK(err < 1e-5);
  // hi alone (t rounded to bf16 once) is off by about 2^-9 per term: the lo half is what makes it accurate.
  const Tensor t = mul(qa.values.to(DType::f32), reshape(scale, {B, 1, 1})).to(DType::bf16).to(DType::f64);
  const Tensor hi_only = matmul(reshape(t, {B * K, M}).transpose(0, 1), reshape(qb.values.to(DType::f64), {B * K, N}));
  CHECK(test::rel_error(hi_only, ref) > 1e-4);
  CHECK_THROWS_WITH(grad::scaled_code_product(qa.values, qb.values, ones({B + 1})), HasSubstr("scale (B)"));
}

TEST_CASE("grad::product routes autograd through the pipeline", "[grad]") {
  grad::ProductCall call;
  call.pipeline = grad::make_pipeline({});  // exact
  Tensor x = test::random_tensor({2, 3, 4}, 1, DType::f64);
  Tensor w = test::random_tensor({5, 4}, 2, DType::f64);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return grad::product(in[0], in[1], call); }, {x, w}) ==
        "");
  CHECK_THROWS_WITH(grad::product(reshape(x, {6, 4}), w, call), HasSubstr("x must be (B, L, I)"));
  // With a bias: added in the forward product's epilogue, its gradient the row sum of g_y (from the product op).
  Tensor b = test::random_tensor({5}, 3, DType::f64);
  b.set_requires_grad(true);
  CHECK(test::gradcheck([&](const std::vector<Tensor>& in) { return grad::product(in[0], in[1], call, in[2]); },
                        {x, w, b}) == "");
  CHECK_THROWS_WITH(grad::product(x, w, call, test::random_tensor({4}, 3, DType::f64)), HasSubstr("bias must be (5)"));
  CHECK_THROWS_WITH(grad::product(x, w, call, test::random_tensor({5}, 3, DType::f32)), HasSubstr("bias must be (5)"));
}

TEST_CASE("every pipeline adds a product's bias in its forward and leaves its gradient to the product op", "[grad]") {
  for (const char* name : {"exact", "hlq", "lbp_wht", "luq"}) {
    INFO(name);
    grad::PipelineSpec spec;
    spec.name = name;
    grad::ProductCall call{grad::make_pipeline(spec), {}, grad::NoiseKey{3, 1, 4}, nullptr};
    Tensor x = test::random_tensor({2, 64, 16}, 4, DType::f32);
    Tensor w = test::random_tensor({8, 16}, 5, DType::f32);
    Tensor b = test::random_tensor({8}, 6, DType::f32);
    for (Tensor* t : {&x, &w, &b}) t->set_requires_grad(true);
    const Tensor g = test::random_tensor({2, 64, 8}, 7, DType::f32);
    const Tensor y = grad::product(x, w, call, b);
    sum(mul(y, g)).backward();
    const Tensor gx = x.grad(), gw = w.grad(), gb = b.grad();
    // The same product without the bias, the bias added by hand: the same gradients (same noise key), y within
    // one f32 rounding of the separate add.
    Tensor x2 = x.detach(), w2 = w.detach(), b2 = b.detach();
    for (Tensor* t : {&x2, &w2, &b2}) t->set_requires_grad(true);
    const Tensor y2 = add(grad::product(x2, w2, call), b2);
    sum(mul(y2, g)).backward();
    CHECK(test::compare(y, y2, 1e-6, 1e-6) == "");
    CHECK(test::compare(gx, x2.grad(), 0.0, 0.0) == "");
    CHECK(test::compare(gw, w2.grad(), 0.0, 0.0) == "");
    CHECK(test::compare(gb, b2.grad(), 1e-6, 1e-6) == "");
    CHECK(test::compare(gb, sum(g, {0, 1}), 1e-6, 1e-6) == "");
  }
}

TEST_CASE("a product keeps only what the gradients it can be asked for read (Note [What a product keeps])", "[grad]") {
  const Tensor x0 = test::random_tensor({2, 64, 16}, 4, DType::f32);
  const Tensor w0 = test::random_tensor({8, 16}, 5, DType::f32);
  const Tensor g = test::random_tensor({2, 64, 8}, 7, DType::f32);
  for (const char* name : {"exact", "hlq", "lbp_wht", "luq", "halo"}) {
    INFO(name);
    grad::PipelineSpec spec;
    spec.name = name;
    int64_t bytes = -1;
    grad::ProductCall call{grad::make_pipeline(spec), {}, grad::NoiseKey{3, 1, 4}, &bytes};
    // (x trainable, w trainable) -> y, g_x, g_w and the saved bytes
    auto run = [&](bool x_grad, bool w_grad) {
      Tensor x = x0.detach(), w = w0.detach();
      x.set_requires_grad(x_grad);
      w.set_requires_grad(w_grad);
      const Tensor y = grad::product(x, w, call);
      sum(mul(y, g)).backward();
      return std::tuple{y, x.grad(), w.grad(), bytes};
    };
    const auto [y, gx, gw, both_bytes] = run(true, true);
    REQUIRE(both_bytes > 0);  // every pipeline keeps some form of x for g_w
    // A frozen weight (LoRA's base): the same y and g_x, bit for bit, and no activation kept.
    const auto [y_fw, gx_fw, gw_fw, fw_bytes] = run(true, false);
    CHECK(test::compare(y_fw, y, 0.0, 0.0) == "");
    CHECK(test::compare(gx_fw, gx, 0.0, 0.0) == "");
    CHECK(!gw_fw.defined());
    CHECK(fw_bytes == 0);
    // An input that needs no gradient: the same g_w, x's form kept as before.
    const auto [y_fx, gx_fx, gw_fx, fx_bytes] = run(false, true);
    CHECK(test::compare(gw_fx, gw, 0.0, 0.0) == "");
    CHECK(!gx_fx.defined());
    CHECK(fx_bytes == both_bytes);
  }
}

TEST_CASE("linear keeps x only for g_W and W only for g_x", "[grad][autograd]") {
  const Tensor x0 = test::random_tensor({3, 5, 6}, 1, DType::f32), w0 = test::random_tensor({4, 6}, 2, DType::f32);
  const Tensor g = test::random_tensor({3, 5, 4}, 3, DType::f32);
  auto run = [&](bool x_grad, bool w_grad) {
    Tensor x = x0.detach(), w = w0.detach();
    x.set_requires_grad(x_grad);
    w.set_requires_grad(w_grad);
    const Tensor y = linear(x, w, Tensor());
    const std::size_t kept = y.grad_fn()->saved_bytes();
    sum(mul(y, g)).backward();
    return std::tuple{x.grad(), w.grad(), kept};
  };
  const auto [gx, gw, both] = run(true, true);
  CHECK(both == x0.nbytes() + w0.nbytes());
  const auto [gx_fw, gw_fw, kept_fw] = run(true, false);  // frozen weight: W only
  CHECK(kept_fw == w0.nbytes());
  CHECK(test::compare(gx_fw, gx, 0.0, 0.0) == "");
  CHECK(!gw_fw.defined());
  const auto [gx_fx, gw_fx, kept_fx] = run(false, true);  // an input without a gradient: x only
  CHECK(kept_fx == x0.nbytes());
  CHECK(test::compare(gw_fx, gw, 0.0, 0.0) == "");
  CHECK(!gx_fx.defined());
}

TEST_CASE("Linear with a bound pipeline matches the plain layer when lossless", "[grad]") {
  Generator gen(3);
  auto lin = std::make_shared<nn::Linear>(12, 16, nn::Bias::yes, gen);
  const Tensor x = test::random_tensor({2, 64, 12}, 4, DType::f32);
  const Tensor gy = test::random_tensor({2, 64, 16}, 5, DType::f32);
  lin->zero_grad();
  const Tensor y0 = lin->forward(x);
  sum(mul(y0, gy)).backward();
  const Tensor gw0 = lin->weight.grad().clone(), gb0 = lin->bias.grad().clone();

  grad::PipelineConfig cfg;
  cfg.default_spec = hlq_lossless();
  const auto bound = nn::bind_pipelines(*lin, cfg, std::make_shared<grad::StepClock>());
  REQUIRE(bound.size() == 1);
  CHECK(bound[0].type == "Linear");
  lin->zero_grad();
  const Tensor y1 = lin->forward(x);
  sum(mul(y1, gy)).backward();
  CHECK(test::compare(y1, y0, 1e-6, 1e-6) == "");
  CHECK(test::rel_error(lin->weight.grad(), gw0) < 1e-5);
  CHECK(test::compare(lin->bias.grad(), gb0, 1e-5, 1e-5) == "");
  CHECK(lin->grad_pipeline.saved_bytes == 2 * 64 * 12 * 4);  // full rank, f32 projection

  // Without a gradient (evaluation) the layer takes its plain op: same output, nothing saved or projected.
  lin->grad_pipeline.saved_bytes = -1;
  {
    NoGradGuard no_grad;
    CHECK(test::compare(lin->forward(x), y0, 0.0, 0.0) == "");
  }
  CHECK(lin->grad_pipeline.saved_bytes == -1);
}

TEST_CASE("pipeline selection by module-name globs, first match wins", "[grad]") {
  CHECK(grad::glob_match("fc", "fc"));
  CHECK_FALSE(grad::glob_match("fc", "fc2"));
  CHECK(grad::glob_match("layer4.*", "layer4.1.conv2"));
  CHECK(grad::glob_match("*.attn.qkv", "blocks.3.attn.qkv"));
  CHECK_FALSE(grad::glob_match("*.attn.qkv", "blocks.3.attn.proj"));
  CHECK(grad::glob_match("blocks.?.mlp.*", "blocks.7.mlp.fc1"));
  CHECK_FALSE(grad::glob_match("blocks.?.mlp.*", "blocks.10.mlp.fc1"));

  auto r = ConfigReader::from_string(R"(
grad_pipeline:
  default: {name: hlq, gy_scale: sample, rank_pct: 25, acbp_bits: 4}
  layers:
    head: {name: exact}
    "blocks.*": {name: lbp_wht, order: 4}
    "*": {name: luq}
)",
                                            "test.yaml");
  const grad::PipelineConfig c = train::read_grad_pipeline(r.child("grad_pipeline"), 9);
  r.finish();
  CHECK(c.default_spec.name == "hlq");
  CHECK(c.default_spec.options_as<grad::HlqOptions>().gy_scale == grad::ScaleGranularity::sample);
  CHECK(c.default_spec.options_as<grad::HlqOptions>().rank.pct == 25.0);
  CHECK(c.default_spec.options_as<grad::HlqOptions>().acbp_bits == 4);
  CHECK(grad::select_spec(c, "head").name == "exact");
  CHECK(grad::select_spec(c, "blocks.0.attn.qkv").name == "lbp_wht");
  CHECK(grad::select_spec(c, "blocks.0.attn.qkv").options_as<grad::LbpWhtOptions>().order == 4);
  CHECK(grad::select_spec(c, "patch_embed").name == "luq");
}

TEST_CASE("bind_pipelines rejects a layer pattern that selects no layer, naming it and the layers", "[grad]") {
  Generator gen(2);
  nn::Sequential net;  // layers "0" and "1"
  net.push_back(std::make_shared<nn::Linear>(8, 6, nn::Bias::yes, gen));
  net.push_back(std::make_shared<nn::Linear>(6, 4, nn::Bias::yes, gen));
  auto bind = [&](std::vector<std::string> patterns) {
    grad::PipelineConfig cfg;
    for (const std::string& p : patterns) cfg.overrides.emplace_back(p, grad::PipelineSpec{});
    return nn::bind_pipelines(net, cfg, std::make_shared<grad::StepClock>());
  };
  CHECK(bind({"1"}).size() == 2);
  CHECK(bind({"0", "*"}).size() == 2);
  CHECK_THROWS_WITH(bind({"1", "fc"}), HasSubstr("grad_pipeline.layers: pattern 'fc' matches no Linear or Conv2d of "
                                                 "the model; the Linear / Conv2d layers are: 0, 1"));
  CHECK_THROWS_WITH(bind({"*", "1"}),
                    HasSubstr("pattern '1' matches only layers that an earlier pattern already selects"));
}

TEST_CASE("grad_pipeline config errors name the key", "[grad]") {
  const auto parse = test::parse_grad_pipeline;
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, rank_pct: 75}}"),
                    HasSubstr("grad_pipeline.default.rank_pct"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, order: 4}}"), HasSubstr("unknown key"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: halo9}}"), HasSubstr("grad_pipeline.default.name"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: halo, level: 3}}"), HasSubstr("grad_pipeline.default.level"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: halo, carrier: fp16}}"),
                    HasSubstr("grad_pipeline.default.carrier"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: halo, fp8_accumulation: fast}}"),  // carrier int8
                    HasSubstr("grad_pipeline.default.fp8_accumulation"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: halo, carrier: fp8, fp8_accumulation: fp32}}"),
                    HasSubstr("grad_pipeline.default.fp8_accumulation"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, carrier: int8, fp8_accumulation: fast}}"),
                    HasSubstr("grad_pipeline.default.fp8_accumulation"));
  CHECK_NOTHROW(parse("grad_pipeline: {default: {name: hlq, fp8_accumulation: fast}}"));
  CHECK_NOTHROW(parse("grad_pipeline: {default: {name: hlq, fp8_accumulation: precise}}"));
  // HLQ's fp8 g_x product and HALO's fp8 products sum fast unless asked otherwise (Notes [Fast accumulation of
  // integer codes], [HALO's fp8 accumulation]); the int8 carrier reads as precise.
  auto accumulation = [&](const std::string& opts) {
    const auto pc = parse("grad_pipeline: {default: {" + opts + "}}");
    return pc.default_spec.name == "hlq" ? pc.default_spec.options_as<grad::HlqOptions>().fp8_accumulation
                                         : pc.default_spec.options_as<grad::HaloOptions>().fp8_accumulation;
  };
  CHECK(accumulation("name: hlq") == Fp8Accumulation::fast);
  CHECK(accumulation("name: hlq, fp8_accumulation: precise") == Fp8Accumulation::precise);
  CHECK(accumulation("name: hlq, carrier: int8") == Fp8Accumulation::precise);
  CHECK(accumulation("name: halo, carrier: fp8") == Fp8Accumulation::fast);
  CHECK(accumulation("name: halo, carrier: fp8, fp8_accumulation: precise") == Fp8Accumulation::precise);
  CHECK(accumulation("name: halo") == Fp8Accumulation::precise);  // carrier int8
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, gw_bits: 0, acbp_bits: 8}}"),
                    HasSubstr("acbp_bits"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {layers: {fc: {name: luq, bits: 9}}}"),
                    HasSubstr("grad_pipeline.layers.fc.bits"));
}

TEST_CASE("Conv2d with a bound lossless pipeline matches the plain convolution", "[grad]") {
  Generator gen(5);
  nn::Conv2dOptions o;
  o.in_channels = 3;
  o.out_channels = 16;
  o.kernel = 3;
  o.stride = 2;
  o.padding = 1;
  auto conv = std::make_shared<nn::Conv2d>(o, gen);
  const Tensor x = test::random_tensor({2, 3, 16, 16}, 6, DType::f32);  // output 8×8: L = 64
  const Tensor gy = test::random_tensor({2, 16, 8, 8}, 7, DType::f32);
  auto run_conv = [&] {
    Tensor xg = x.clone();
    xg.set_requires_grad(true);
    conv->zero_grad();
    const Tensor y = conv->forward(xg);
    sum(mul(y, gy)).backward();
    return std::make_tuple(y, xg.grad().clone(), conv->weight.grad().clone(), conv->bias.grad().clone());
  };
  const auto [y0, gx0, gw0, gb0] = run_conv();
  // halo on a Conv2d multiplies the im2col columns (I = 3·3·3 = 27, rotated at levels 1 and 2 zero-padded to 28
  // along I and, at level 2, along the 128 tokens): without quantisation its rotations cancel.
  for (const std::string name : {"hlq", "lbp_wht", "halo0", "halo1", "halo2"}) {
    grad::PipelineConfig cfg;
    if (name == "hlq") {
      cfg.default_spec = hlq_lossless();
    } else if (name.rfind("halo", 0) == 0) {
      cfg.default_spec.name = "halo";
      auto& h = cfg.default_spec.options_as<grad::HaloOptions>();
      h.level = name.back() - '0';
      h.quantize = false;
    } else {
      cfg.default_spec.name = name;
      cfg.default_spec.options_as<grad::LbpWhtOptions>().order = 15;
    }
    const auto bound = nn::bind_pipelines(*conv, cfg, std::make_shared<grad::StepClock>());
    REQUIRE(bound.size() == 1);
    CHECK(bound[0].type == "Conv2d");
    const auto [y1, gx1, gw1, gb1] = run_conv();
    INFO(name);
    CHECK(test::rel_error(y1, y0) < 1e-6);
    CHECK(test::rel_error(gx1, gx0) < 1e-5);
    CHECK(test::rel_error(gw1, gw0) < 1e-5);
    CHECK(test::rel_error(gb1, gb0) < 1e-6);
  }
}

TEST_CASE("Linear and Conv2d under every pipeline stay within the documented error bounds of exact", "[grad]") {
  // docs/gradient_pipelines.md, "Tests": weight-gradient relative error of a module whose backward runs through
  // the pipeline with default options, against the plain module, on uniform random (white) data, where
  // low-rank projections lose the most: keeping r of n orthogonal rows leaves a relative error near
  // sqrt(1 − r/n) — 0.69 for HLA on a 16×16 map (136 of 256 rows), 0.82 for LBP-WHT (21 of 64 bases) — plus
  // quantisation noise. Measured (deterministic seeds): HLQ conv 0.73 / linear 0.66, LBP-WHT 0.84 / 0.77,
  // LUQ 0.45 / 0.30 (full rank, 4-bit only).
  const std::map<std::string, double> bound{{"hlq", 0.8}, {"lbp_wht", 0.95}, {"luq", 0.6}};
  for (const auto& [name, max_err] : bound) {
    Generator gen(8);
    nn::Conv2dOptions o;
    o.in_channels = 4;
    o.out_channels = 16;
    o.padding = 1;
    auto conv = std::make_shared<nn::Conv2d>(o, gen);
    auto lin = std::make_shared<nn::Linear>(16, 32, nn::Bias::yes, gen);
    const Tensor x = test::random_tensor({2, 4, 16, 16}, 9, DType::f32);
    const Tensor gy = test::random_tensor({2, 16, 16, 32}, 10, DType::f32);
    auto grads = [&] {
      conv->zero_grad();
      lin->zero_grad();
      const Tensor h = conv->forward(x);                      // (2, 16, 16, 16)
      const Tensor y = lin->forward(permute(h, {0, 2, 3, 1}));  // (2, 16, 16, 32): 256 tokens per sample
      sum(mul(y, gy)).backward();
      return std::make_pair(conv->weight.grad().clone(), lin->weight.grad().clone());
    };
    const auto [cw0, lw0] = grads();
    grad::PipelineConfig cfg;
    cfg.default_spec.name = name;
    auto clock = std::make_shared<grad::StepClock>();
    nn::bind_pipelines(*conv, cfg, clock);
    nn::bind_pipelines(*lin, cfg, clock);
    const auto [cw1, lw1] = grads();
    INFO(name << ": conv g_w error " << test::rel_error(cw1, cw0) << ", linear g_w error "
              << test::rel_error(lw1, lw0));
    CHECK(test::rel_error(cw1, cw0) > 1e-3);  // the pipeline really ran
    CHECK(test::rel_error(cw1, cw0) < max_err);
    CHECK(test::rel_error(lw1, lw0) < max_err);
  }
}

TEST_CASE("noise keys: a host step is baked into the stream and stops a step recording; a device word is not",
          "[grad]") {
  // Note [Pipeline noise]: with a step word the key hands the kernels the step-0 stream and the word.
  const int64_t word = 0;  // stands for StepClock::word's device pointer (never dereferenced here)
  const grad::NoiseKey host{5, 3, 42}, device{5, 3, 42, &word};
  {
    StepCaptureScope recording;
    const grad::Noise n = device.noise(2);
    CHECK(n.seed == 5);
    CHECK(n.stream == philox_stream(3, 0, 2));
    CHECK(n.step_word == &word);
    CHECK(recording.reason().empty());
    const grad::Noise h = host.noise(2);
    CHECK(h.stream == philox_stream(3, 42, 2));
    CHECK(h.step_word == nullptr);
    CHECK_THAT(recording.reason(), HasSubstr("stochastic-rounding noise"));
  }
  // The step field the device word holds: philox_stream's bits 8..47, so adding it to the step-0 stream
  // gives the host-step stream.
  for (uint64_t step : {uint64_t{1}, uint64_t{42}, (uint64_t{1} << 40) - 1})
    CHECK(philox_stream(3, 0, 2) + (step << 8) == philox_stream(3, step, 2));
  // On the CPU the clock keeps the host step only, and the bound layers' keys carry no word.
  grad::StepClock clock;
  clock.keep_on_device(Device::cpu());
  clock.set(9);
  CHECK(!clock.word.defined());
  CHECK(clock.step == 9);
}

TEST_CASE("pipelines say whether they draw noise; a bound model needs a device step clock only then", "[grad]") {
  for (const char* name : {"exact", "hlq", "lbp_wht", "luq"}) {
    grad::PipelineSpec s;
    s.name = name;
    INFO(name);
    const bool noisy = std::string(name) == "hlq" || std::string(name) == "luq";
    CHECK(grad::make_pipeline(s)->draws_noise() == noisy);
    Generator gen(1);
    nn::Linear lin(8, 4, nn::Bias::no, gen);
    grad::PipelineConfig cfg;
    cfg.default_spec = s;
    CHECK(nn::any_draws_noise(nn::bind_pipelines(lin, cfg, std::make_shared<grad::StepClock>())) == noisy);
  }
}
