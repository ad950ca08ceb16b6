// HLQ's ACBP for convolutions (docs/gradient_pipelines.md, Note [ACBP of a convolution]): acbp_conv columns
// (the reference: the projected, quantised im2col columns) against input_map (the int8 input map, im2col and
// projection re-run in backward, where the map is the smaller), through grad::conv_product in both layouts: exactness
// with quantisation and rank reduction off, the error bound and closeness to columns with the defaults, unchanged g_x,
// saved bytes and the config keys; the default conv products (the columns, integer path) and the simulated forms
// (conv_gx dgrad_simulated, conv_gw wgrad_simulated) against them.
#include <cmath>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/pipeline_config.h"
#include "support/catch.h"
#include "support/model_testing.h"
#include "support/testing.h"

using namespace ht;

namespace {

// One 3×3 convolution (C -> O channels) of x (N, C, H, W), run through grad::conv_product.
struct ConvCase {
  Tensor x;   // (N, C, H, W)
  Tensor w;   // (O, C, k, k)
  Tensor gy;  // (N, L, O): the gradient of y (N, L, O)
  Unfold2dParams window;
};

ConvCase make_case(int64_t N, int64_t C, int64_t H, int64_t O, int64_t stride, DType dt, uint64_t seed) {
  ConvCase c;
  c.window.kernel_h = c.window.kernel_w = 3;
  c.window.stride_h = c.window.stride_w = stride;
  c.window.pad_h = c.window.pad_w = 1;
  const int64_t OH = (H + 2 - 3) / stride + 1;
  c.x = test::random_tensor({N, C, H, H}, seed, dt);
  c.w = test::random_tensor({O, C, 3, 3}, seed + 1, dt);
  c.gy = test::random_tensor({N, OH * OH, O}, seed + 2, dt);
  return c;
}

struct ConvGrads {
  Tensor y, gx, gw;  // y (N, L, O), gx (N, C, H, W), gw (O, C, k, k)
  Tensor gx_leaf;    // the gradient of the stored input ((N, H, W, C) for nhwc)
  int64_t bytes = 0;
};

// nhwc: x is stored channels last ((N, H, W, C) contiguous) and enters as its permuted (N, C, H, W) view, as
// the Conv2d route does for ConvLayout::nhwc; gx is returned as (N, C, H, W) either way.
ConvGrads run(const grad::PipelineSpec& spec, const ConvCase& c, bool nhwc, int64_t step = 0) {
  Tensor xs = nhwc ? permute(c.x, {0, 2, 3, 1}).contiguous() : c.x.clone();
  xs.set_requires_grad(true);
  Tensor w = c.w.clone();
  w.set_requires_grad(true);
  const Tensor image = nhwc ? permute(xs, {0, 3, 1, 2}) : xs;
  ConvGrads g;
  const grad::ProductCall call{grad::make_pipeline(spec), {}, grad::NoiseKey{7, 3, step}, &g.bytes};
  g.y = grad::conv_product(image, reshape(w, {w.size(0), -1}), c.window, call);  // (N, L, O)
  sum(mul(g.y, c.gy)).backward();
  g.gx_leaf = xs.grad();
  g.gx = nhwc ? permute(xs.grad(), {0, 3, 1, 2}) : xs.grad();
  g.gw = w.grad();
  return g;
}

grad::PipelineSpec hlq(grad::AcbpConv mode) {
  grad::PipelineSpec s;
  s.name = "hlq";
  s.options_as<grad::HlqOptions>().acbp_conv = mode;
  return s;
}

// The simulated forms of the conv products (Notes [HLQ conv g_x], [HLQ conv g_w]), for comparison only.
grad::PipelineSpec simulated_gx(grad::PipelineSpec s) {
  s.options_as<grad::HlqOptions>().conv_gx = grad::ConvGx::dgrad_simulated;
  return s;
}
grad::PipelineSpec simulated_gw(grad::PipelineSpec s) {
  s.options_as<grad::HlqOptions>().conv_gw = grad::ConvGw::wgrad_simulated;
  return s;
}

grad::PipelineSpec hlq_lossless(grad::AcbpConv mode) {
  grad::PipelineSpec s = hlq(mode);
  s.options_as<grad::HlqOptions>().gx_bits = 0;
  s.options_as<grad::HlqOptions>().gw_bits = 0;
  s.options_as<grad::HlqOptions>().acbp_bits = 0;
  s.options_as<grad::HlqOptions>().rank.kind = grad::HlaRank::Kind::full;
  return s;
}

}  // namespace

TEST_CASE("hlq acbp_conv input_map reproduces exact conv gradients without quantisation at full rank", "[grad]") {
  // stride 1 (16×16 grid, n 256) and stride 2 (8×8 grid, n 64); 7×7 input -> 7×7 grid: n 1 (fallback ref).
  for (const auto& [H, stride] : {std::pair<int64_t, int64_t>{16, 1}, {16, 2}, {7, 1}}) {
    const ConvCase c = make_case(2, 3, H, 8, stride, DType::f64, 10 + H + stride);
    const ConvGrads ref = run(grad::PipelineSpec{}, c, false);  // exact
    // The exact route is the convolution itself.
    Conv2dParams p;
    p.stride_h = p.stride_w = stride;
    p.pad_h = p.pad_w = 1;
    const Tensor yconv = conv2d(c.x, c.w, Tensor(), p);  // (N, O, OH, OW)
    CHECK(test::rel_error(reshape(ref.y.transpose(1, 2), yconv.shape()), yconv) < 1e-12);
    // The lossless hlq rounds its rotation and projection through f32: 1e-7 of exact; the input_map columns
    // are the f64 map's own, so both modes agree to f64 rounding.
    const ConvGrads col = run(hlq_lossless(grad::AcbpConv::columns), c, false);
    for (bool nhwc : {false, true}) {
      const ConvGrads g = run(hlq_lossless(grad::AcbpConv::input_map), c, nhwc);
      INFO("H " << H << " stride " << stride << (nhwc ? " nhwc" : " nchw"));
      CHECK(test::rel_error(g.y, ref.y) < 1e-12);
      CHECK(test::rel_error(g.gx, ref.gx) < 1e-6);
      CHECK(test::rel_error(g.gw, ref.gw) < 1e-6);
      CHECK(test::rel_error(g.gx, col.gx) < 1e-12);
      CHECK(test::rel_error(g.gw, col.gw) < 1e-12);
      CHECK(g.bytes == c.x.numel() * 8);  // the unquantised f64 map
    }
  }
}

TEST_CASE("hlq conv_gw wgrad_simulated: (Pᵀ·g̃)ᵀ·cols as a convolution backward, the columns form's g̃",
          "[grad]") {
  // Note [HLQ conv g_w]. Without quantisation, at reduced rank: the columns form's (1/n)·Σ_b g̃ᵀ·x̃ up to f32
  // rounding (the identity g̃ᵀ·P·cols = (Pᵀ·g̃)ᵀ·cols), in both layouts, strides 1 and 2 (n 256, 64) and a 7×7
  // grid (n 1); at full rank the exact gradient. The image comes from the saved input map (unquantised here).
  for (const auto& [H, stride] : {std::pair<int64_t, int64_t>{16, 1}, {16, 2}, {7, 1}}) {
    const ConvCase c = make_case(2, 3, H, 8, stride, DType::f32, 60 + H + stride);
    const ConvGrads ex = run(grad::PipelineSpec{}, c, false);
    for (bool nhwc : {false, true}) {
      INFO("H " << H << " stride " << stride << (nhwc ? " nhwc" : " nchw"));
      grad::PipelineSpec low_cols = hlq_lossless(grad::AcbpConv::input_map);
      low_cols.options_as<grad::HlqOptions>().rank = grad::HlaRank::of_pct(50);
      const grad::PipelineSpec low = simulated_gw(low_cols);
      const ConvGrads wg = run(low, c, nhwc), cg = run(low_cols, c, nhwc);
      const double d = test::rel_error(wg.gw, cg.gw), e = test::rel_error(wg.gw, ex.gw);
      INFO("wgrad_simulated vs columns " << d << ", vs exact " << e);
      CHECK(d < 1e-5);
      if (H == 16) CHECK(e > 0.1);  // really projected (n > 1)
      CHECK(test::rel_error(wg.gx, cg.gx) == 0.0);
      CHECK(test::rel_error(run(simulated_gw(hlq_lossless(grad::AcbpConv::input_map)), c, nhwc).gw, ex.gw) < 1e-6);
    }
  }
  // Otherwise the defaults (8-bit g̃, the int8 map's image): near the columns form, which quantises x̃ too.
  const ConvCase c = make_case(2, 4, 16, 16, 1, DType::f32, 71);
  const ConvGrads ex = run(grad::PipelineSpec{}, c, false);
  const grad::PipelineSpec cols = hlq(grad::AcbpConv::input_map), sim = simulated_gw(cols);
  const ConvGrads wg = run(sim, c, true), cg = run(cols, c, true);
  const double d = test::rel_error(wg.gw, cg.gw), e = test::rel_error(wg.gw, ex.gw);
  INFO("8-bit: wgrad_simulated vs columns " << d << ", vs exact " << e);
  CHECK(d > 0.0);
  CHECK(d < 0.1);
  CHECK(e > 0.1);
  CHECK(e < 0.8);
  // bf16: the back-projected g̃ rounded once to bf16, cuDNN-style f32 sums on the CPU.
  ConvCase cb = c;
  cb.x = c.x.to(DType::bf16);
  cb.w = c.w.to(DType::bf16);
  cb.gy = c.gy.to(DType::bf16);
  const ConvGrads wb = run(sim, cb, true);
  CHECK(wb.gw.dtype() == DType::bf16);
  CHECK(test::rel_error(wb.gw, wg.gw) < 0.05);
  // A conv whose forward saved its projected columns has no image in backward: the columns form runs.
  const grad::PipelineSpec saved_cols = hlq(grad::AcbpConv::columns);
  CHECK(test::rel_error(run(simulated_gw(saved_cols), c, true).gw, run(saved_cols, c, true).gw) == 0.0);
}

TEST_CASE("hlq acbp_conv input_map with the defaults: g_w near columns and exact, g_x unchanged", "[grad]") {
  // docs/gradient_pipelines.md, "ACBP of a convolution": on uniform random data (N 2, C 4 -> O 16, 3×3,
  // stride 1, 16×16: n 256, r 136) g_w of either mode is within 0.8 of exact (the low-pass projection of a
  // white signal, sqrt(1 − 136/256) = 0.69, plus quantisation); the two modes differ only by where x is
  // quantised to 8 bits (before or after the projection): relative difference below 0.1 (measured: errors
  // 0.683 columns, 0.682 input_map, difference 0.053).
  const ConvCase c = make_case(2, 4, 16, 16, 1, DType::f32, 31);
  const ConvGrads ex = run(grad::PipelineSpec{}, c, false);
  const ConvGrads col = run(hlq(grad::AcbpConv::columns), c, false);
  const ConvGrads map = run(hlq(grad::AcbpConv::input_map), c, false);
  const double e_col = test::rel_error(col.gw, ex.gw), e_map = test::rel_error(map.gw, ex.gw),
               d = test::rel_error(map.gw, col.gw);
  INFO("g_w error columns " << e_col << ", input_map " << e_map << ", input_map vs columns " << d);
  CHECK(e_map > 0.1);  // it really projected
  CHECK(e_map < 0.8);
  CHECK(e_col < 0.8);
  CHECK(d > 0.0);      // it really took the other path
  CHECK(d < 0.1);
  // g_x does not read x: identical in both modes (same noise key).
  CHECK(test::rel_error(map.gx, col.gx) == 0.0);
  CHECK(test::rel_error(map.y, ex.y) < 1e-6);
  // Channels last: the same per-sample int8 map in another memory order, the same columns.
  const ConvGrads map_nhwc = run(hlq(grad::AcbpConv::input_map), c, true);
  CHECK(test::rel_error(map_nhwc.gw, map.gw) < 1e-6);
  CHECK(test::rel_error(map_nhwc.gx, map.gx) < 1e-6);
  // bf16 compute: close to the f32 run.
  ConvCase cb = c;
  cb.x = c.x.to(DType::bf16);
  cb.w = c.w.to(DType::bf16);
  cb.gy = c.gy.to(DType::bf16);
  const ConvGrads map_bf16 = run(hlq(grad::AcbpConv::input_map), cb, true);
  CHECK(map_bf16.gw.dtype() == DType::bf16);
  CHECK(test::rel_error(map_bf16.gw, map.gw) < 0.05);
}

TEST_CASE("hlq acbp_conv input_map saves about one byte per input element", "[grad]") {
  // 3×3, stride 1, pad 1, N 2, C 4, 16×16 (L 256, n 256, r 136), I = C·9 = 36.
  const int64_t N = 2, C = 4, H = 16;
  for (DType dt : {DType::f32, DType::bf16}) {
    ConvCase c = make_case(N, C, H, 16, 1, dt, 41);
    for (bool nhwc : {false, true}) {
      INFO(dtype_name(dt) << (nhwc ? " nhwc" : " nchw"));
      // columns: B·R·I int8 values plus one f32 scale (gw_scale tensor) = 4.78 bytes per map element.
      CHECK(run(hlq(grad::AcbpConv::columns), c, nhwc).bytes == N * 136 * C * 9 + 4);
      // input_map: one int8 per map element plus one f32 scale per sample.
      CHECK(run(hlq(grad::AcbpConv::input_map), c, nhwc).bytes == N * C * H * H + 4 * N);
    }
  }
  // acbp_bits 4 (packed columns) still keeps an int8 map; the columns are packed again in backward.
  grad::PipelineSpec s = hlq(grad::AcbpConv::input_map);
  s.options_as<grad::HlqOptions>().acbp_bits = 4;
  s.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;
  const ConvCase c = make_case(N, C, H, 16, 1, DType::f32, 43);
  const ConvGrads g = run(s, c, false);
  CHECK(g.bytes == N * C * H * H + 4 * N);
  CHECK(test::rel_error(g.gw, run(grad::PipelineSpec{}, c, false).gw) < 0.8);
  // A 1×1 stride-2 conv (a ResNet shortcut): its columns (2·36·8 int8 at n 64, r 36) are smaller than the map
  // (2·8·16·16), so input_map keeps the columns — the same bytes and g_w as columns.
  ConvCase d;
  d.window.stride_h = d.window.stride_w = 2;
  d.x = test::random_tensor({2, 8, 16, 16}, 44, DType::f32);
  d.w = test::random_tensor({16, 8, 1, 1}, 45, DType::f32);
  d.gy = test::random_tensor({2, 64, 16}, 46, DType::f32);
  const ConvGrads dc = run(hlq(grad::AcbpConv::columns), d, false), dm = run(hlq(grad::AcbpConv::input_map), d, false);
  CHECK(dc.bytes == 2 * 36 * 8 + 4);
  CHECK(dm.bytes == dc.bytes);
  CHECK(test::rel_error(dm.gw, dc.gw) == 0.0);
  // A product without an input map (a Linear) saves the columns whatever acbp_conv says.
  auto p = grad::make_pipeline(hlq(grad::AcbpConv::input_map));
  const Tensor x = test::random_tensor({2, 256, 36}, 5, DType::f32);
  const Tensor w = test::random_tensor({16, 36}, 6, DType::f32);
  CHECK(p->forward(x, w, {}, {}, grad::SaveForBackward::yes).saved->bytes == N * 136 * C * 9 + 4);
}

TEST_CASE("hlq conv_gx dgrad_simulated: the image gradient of the columns form up to rounding", "[grad]") {
  // Note [HLQ conv g_x]: the same 4-bit levels (same noise), scales applied to the operands of a convolution
  // backward instead of to the integer product; g_w untouched. Lossless (gx_bits 0): exact g_x.
  for (const auto& [H, stride] : {std::pair<int64_t, int64_t>{16, 1}, {16, 2}, {7, 1}}) {
    const ConvCase c = make_case(2, 4, H, 16, stride, DType::f32, 50 + H + stride);
    const ConvGrads ex = run(grad::PipelineSpec{}, c, false);
    for (bool nhwc : {false, true}) {
      INFO("H " << H << " stride " << stride << (nhwc ? " nhwc" : " nchw"));
      const grad::PipelineSpec cols = hlq(grad::AcbpConv::columns), dgrad = simulated_gx(cols),
                               lossless = simulated_gx(hlq_lossless(grad::AcbpConv::columns));
      const ConvGrads dg = run(dgrad, c, nhwc), cg = run(cols, c, nhwc);
      const double d = test::rel_error(dg.gx, cg.gx), e = test::rel_error(dg.gx, ex.gx);
      INFO("dgrad_simulated vs columns " << d << ", vs exact " << e);
      CHECK(d > 0.0);   // really another computation
      CHECK(d < 1e-5);  // f32 roundings of the scaled levels and of the sums only
      CHECK(e > 0.05);  // really quantised (4-bit g_y: about 0.1–0.2 of exact on white data)
      CHECK(e < 0.5);
      CHECK(test::rel_error(dg.gw, cg.gw) == 0.0);
      CHECK(dg.gx_leaf.is_contiguous());  // channels-last in, channels-last out: no transposed copy
      CHECK(test::rel_error(run(lossless, c, nhwc).gx, ex.gx) < 1e-6);
    }
  }
  // bf16: each scaled level rounded to 8 significant bits.
  ConvCase cb = make_case(2, 4, 16, 16, 1, DType::bf16, 77);
  const grad::PipelineSpec cols = hlq(grad::AcbpConv::columns);
  const ConvGrads dg = run(simulated_gx(cols), cb, true), cg = run(cols, cb, true);
  CHECK(dg.gx.dtype() == DType::bf16);
  CHECK(test::rel_error(dg.gx, cg.gx) < 2e-2);
}

TEST_CASE("conv products on odd windows: every pipeline's forward is the convolution, lossless HLQ is exact",
          "[grad]") {
  // 1×1 stride 2, 3×3 dilation 2, 3×1 stride (2, 1) with padding (1, 0), on a 9×7 map with 3 channels (odd
  // grids: L 20, 15, 35 -> n 4, 1, 1), both layouts, both conv_gx forms.
  struct Win {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  };
  uint64_t seed = 300;
  for (const Win& v : {Win{1, 1, 2, 2, 0, 0, 1, 1}, Win{3, 3, 1, 1, 2, 2, 2, 2}, Win{3, 1, 2, 1, 1, 0, 1, 1}}) {
    ConvCase c;
    c.window = Unfold2dParams{v.kh, v.kw, v.sh, v.sw, v.ph, v.pw, v.dh, v.dw};
    const int64_t OH = (9 + 2 * v.ph - v.dh * (v.kh - 1) - 1) / v.sh + 1,
                  OW = (7 + 2 * v.pw - v.dw * (v.kw - 1) - 1) / v.sw + 1;
    c.x = test::random_tensor({2, 3, 9, 7}, ++seed, DType::f64);
    c.w = test::random_tensor({5, 3, v.kh, v.kw}, ++seed, DType::f64);
    c.gy = test::random_tensor({2, OH * OW, 5}, ++seed, DType::f64);
    Conv2dParams p;
    p.stride_h = v.sh;
    p.stride_w = v.sw;
    p.pad_h = v.ph;
    p.pad_w = v.pw;
    p.dilation_h = v.dh;
    p.dilation_w = v.dw;
    const Tensor yconv = conv2d(c.x, c.w, Tensor(), p);  // (N, O, OH, OW)
    const ConvGrads ex = run(grad::PipelineSpec{}, c, false);
    for (bool nhwc : {false, true}) {
      INFO("window " << v.kh << "x" << v.kw << " stride " << v.sh << "," << v.sw << " dilation " << v.dh
                     << (nhwc ? " nhwc" : " nchw"));
      for (const char* name : {"hlq", "lbp_wht", "luq"}) {
        grad::PipelineSpec spec;
        spec.name = name;
        CHECK(test::rel_error(reshape(run(spec, c, nhwc).y.transpose(1, 2), yconv.shape()), yconv) < 1e-12);
      }
      for (grad::ConvGx form : {grad::ConvGx::columns, grad::ConvGx::dgrad_simulated}) {
        grad::PipelineSpec s = hlq_lossless(grad::AcbpConv::columns);
        s.options_as<grad::HlqOptions>().conv_gx = form;
        const ConvGrads g = run(s, c, nhwc);
        CHECK(test::rel_error(g.gx, ex.gx) < 1e-6);
        CHECK(test::rel_error(g.gw, ex.gw) < 1e-6);
      }
    }
  }
}

TEST_CASE("hlq acbp_conv config key", "[grad]") {
  const auto parse = test::parse_grad_pipeline;
  CHECK(parse("grad_pipeline: {default: {name: hlq}}").default_spec.options_as<grad::HlqOptions>().acbp_conv == grad::AcbpConv::columns);
  CHECK(parse("grad_pipeline: {default: {name: hlq, acbp_conv: input_map}}").default_spec.options_as<grad::HlqOptions>().acbp_conv ==
        grad::AcbpConv::input_map);
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, acbp_conv: pixels}}"),
                    HasSubstr("grad_pipeline.default.acbp_conv"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: luq, acbp_conv: input_map}}"), HasSubstr("unknown key"));
  grad::PipelineSpec s = hlq(grad::AcbpConv::input_map);
  CHECK(grad::describe(s).find("conv input map") != std::string::npos);
}

TEST_CASE("hlq conv products: columns by default, the simulated forms by name only", "[grad]") {
  const auto parse = test::parse_grad_pipeline;
  const auto options = [&](const std::string& yaml) { return parse(yaml).default_spec.options_as<grad::HlqOptions>(); };
  CHECK(options("grad_pipeline: {default: {name: hlq}}").conv_gx == grad::ConvGx::columns);
  CHECK(options("grad_pipeline: {default: {name: hlq}}").conv_gw == grad::ConvGw::columns);
  CHECK(options("grad_pipeline: {default: {name: hlq, conv_gx: dgrad_simulated}}").conv_gx ==
        grad::ConvGx::dgrad_simulated);
  CHECK(options("grad_pipeline: {default: {name: hlq, conv_gw: wgrad_simulated}}").conv_gw ==
        grad::ConvGw::wgrad_simulated);
  CHECK(options("grad_pipeline: {default: {name: hlq, conv_gx: columns, conv_gw: columns}}").conv_gx ==
        grad::ConvGx::columns);
  // The unsuffixed names are errors that list the choices.
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, conv_gx: dgrad}}"),
                    HasSubstr("grad_pipeline.default.conv_gx") && HasSubstr("columns, dgrad_simulated"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, conv_gw: wgrad}}"),
                    HasSubstr("grad_pipeline.default.conv_gw") && HasSubstr("columns, wgrad_simulated"));
  CHECK_THROWS_WITH(parse("grad_pipeline: {default: {name: hlq, conv_gw: dgrad_simulated}}"),
                    HasSubstr("grad_pipeline.default.conv_gw"));
  // The description names a simulated form when one is chosen, and nothing for the defaults.
  grad::PipelineSpec s = parse("grad_pipeline: {default: {name: hlq}}").default_spec;
  CHECK(grad::describe(s).find("simulated") == std::string::npos);
  CHECK(grad::describe(simulated_gx(s)).find("conv g_x simulated (dgrad over dequantised values)") !=
        std::string::npos);
  CHECK(grad::describe(simulated_gw(s)).find("conv g_w simulated") != std::string::npos);

  // A conv layer with the default spec computes the columns products: g_x and g_w bit for bit those of the
  // explicit columns options, and not those of the simulated forms (which apply here: the input map is kept).
  // (test_hlq_oracle checks the default conv products against an f64 oracle built from the quantiser's codes.)
  grad::PipelineSpec dflt = parse("grad_pipeline: {default: {name: hlq, acbp_conv: input_map}}").default_spec;
  grad::PipelineSpec cols = hlq(grad::AcbpConv::input_map);
  cols.options_as<grad::HlqOptions>().conv_gx = grad::ConvGx::columns;
  cols.options_as<grad::HlqOptions>().conv_gw = grad::ConvGw::columns;
  const ConvCase c = make_case(2, 4, 16, 16, 1, DType::f32, 81);
  for (bool nhwc : {false, true}) {
    INFO((nhwc ? "nhwc" : "nchw"));
    const ConvGrads d = run(dflt, c, nhwc), k = run(cols, c, nhwc);
    CHECK(test::rel_error(d.gx, k.gx) == 0.0);
    CHECK(test::rel_error(d.gw, k.gw) == 0.0);
    CHECK(test::rel_error(d.gx, run(simulated_gx(dflt), c, nhwc).gx) > 0.0);
    CHECK(test::rel_error(d.gw, run(simulated_gw(dflt), c, nhwc).gw) > 0.0);
  }
}
