// Gradient pipelines on CUDA against the CPU reference with the same noise key: the quantised integers are
// bit-identical on both backends (tests/gpu/test_gpu_grad_quant.cpp, test_gpu_grad_hla.cpp), so g_x and g_w
// differ only by the accumulation order of the products and by the final rounding to the input dtype.
// Every pipeline and the main options, f32 and bf16 inputs, shapes with T = 16 / 4 and n = 64 / 1 (the
// fallbacks), poisoned CUDA allocations. Also an end-to-end Linear + Conv2d step through bound pipelines, HLQ's
// acbp_share in a ViT (Note [Shared saved inputs]) and HLQ's g_w chain on a side stream (Note [HLQ's two chains]).
#include "support/catch.h"
#include "support/model_testing.h"
#include "support/gpu_testing.h"
#include "support/testing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "hadatrain/autograd/node.h"
#include "hadatrain/cuda/caching_allocator.h"
#include "hadatrain/cuda/graph.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/grad/pipeline_hlq.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/tensor/factory.h"
#include "grad/pipeline_helpers.h"

using namespace ht;

namespace {

struct Case {
  std::string label;
  grad::PipelineSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  grad::PipelineSpec s;
  c.push_back({"exact", s});
  s.name = "hlq";
  c.push_back({"hlq default", s});
  grad::PipelineSpec t = s;
  t.options_as<grad::HlqOptions>().gy_scale = grad::ScaleGranularity::sample;
  t.options_as<grad::HlqOptions>().carrier = grad::Carrier::int8;
  t.options_as<grad::HlqOptions>().w_quant = grad::WeightQuant::absmax_sr;
  t.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;
  c.push_back({"hlq sample int8 absmax_sr", t});
  t = s;
  t.options_as<grad::HlqOptions>().gy_scale = grad::ScaleGranularity::tensor;
  t.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::tensor;
  t.options_as<grad::HlqOptions>().acbp_bits = 4;
  t.options_as<grad::HlqOptions>().fallback = grad::HlaFallback::split_extra;
  c.push_back({"hlq tensor acbp4 split_extra", t});
  t = s;
  t.options_as<grad::HlqOptions>().fallback = grad::HlaFallback::pad;
  t.options_as<grad::HlqOptions>().x_scale = grad::ScaleRule::absmax;
  t.options_as<grad::HlqOptions>().acbp_bits = 0;
  c.push_back({"hlq pad no-acbp", t});
  grad::PipelineSpec l;
  l.name = "lbp_wht";
  c.push_back({"lbp_wht", l});
  grad::PipelineSpec q;
  q.name = "luq";
  c.push_back({"luq", q});
  return c;
}

}  // namespace

TEST_CASE("every pipeline: CUDA gradients match the CPU reference with the same noise", "[gpu][grad]") {
  test::PoisonGuard poison;
  struct Shape3 {
    int64_t B, L, I, O;
  };
  // L 64 (n 64; 8×8 grid), L 65 (n 1: fallbacks; class token + 8×8), O 100 (T 4), odd I.
  for (const Shape3 sh : {Shape3{3, 64, 48, 32}, Shape3{2, 65, 37, 100}}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = test::random_input({sh.B, sh.L, sh.I}, 1, DType::f32).to(dt);
      const Tensor w = mul(test::random_input({sh.O, sh.I}, 2, DType::f32), 0.1).to(dt);
      const Tensor g = mul(test::random_input({sh.B, sh.L, sh.O}, 3, DType::f32), 0.01).to(dt);
      for (const Case& c : cases()) {
        auto pc = grad::make_pipeline(c.spec);
        auto pg = grad::make_pipeline(c.spec);
        const grad::NoiseKey key{11, 2, 5};
        grad::ForwardResult fc = pc->forward(x, w, {}, key, grad::SaveForBackward::yes);
        grad::ForwardResult fg = pg->forward(x.to(test::kCuda), w.to(test::kCuda), {}, key, grad::SaveForBackward::yes);
        const grad::Grads gc = pc->backward(*fc.saved, g, {true, true});
        const grad::Grads gg = pg->backward(*fg.saved, g.to(test::kCuda), {true, true});
        INFO(c.label << ", " << dtype_name(dt) << ", B " << sh.B << " L " << sh.L << " I " << sh.I << " O " << sh.O);
        CHECK(fg.saved->bytes == fc.saved->bytes);
        CHECK(gg.x.is_cuda());
        CHECK(gg.x.dtype() == dt);
        CHECK(gg.w.dtype() == dt);
        // f32: the products differ in accumulation order only; bf16: plus one rounding of the result.
        const double tol = dt == DType::f32 ? 1e-4 : 1.5e-2;
        CHECK(test::rel_error(fg.y, fc.y) < tol);
        CHECK(test::rel_error(gg.x, gc.x) < tol);
        CHECK(test::rel_error(gg.w, gc.w) < tol);
      }
    }
  }
}

TEST_CASE("bound pipelines train a Linear + Conv2d step on CUDA like on the CPU", "[gpu][grad]") {
  test::PoisonGuard poison;
  for (const std::string name : {"hlq", "lbp_wht", "luq"}) {
    std::vector<Tensor> grads[2];
    for (int dev = 0; dev < 2; ++dev) {
      Generator gen(4);
      nn::Conv2dOptions o;
      o.in_channels = 3;
      o.out_channels = 16;
      o.padding = 1;
      auto conv = std::make_shared<nn::Conv2d>(o, gen);
      auto lin = std::make_shared<nn::Linear>(16, 10, nn::Bias::yes, gen);
      grad::PipelineConfig cfg;
      cfg.default_spec.name = name;
      auto clock = std::make_shared<grad::StepClock>();
      nn::bind_pipelines(*conv, cfg, clock);
      nn::bind_pipelines(*lin, cfg, clock);
      Tensor x = test::random_input({4, 3, 8, 8}, 9, DType::f32);
      if (dev == 1) {
        conv->to(test::kCuda);
        lin->to(test::kCuda);
        x = x.to(test::kCuda);
      }
      const Tensor h = relu(conv->forward(x));                     // (4, 16, 8, 8)
      const Tensor y = lin->forward(permute(h, {0, 2, 3, 1}));      // (4, 8, 8, 10): tokens through Linear
      sum(mul(y, y)).backward();
      grads[dev] = {conv->weight.grad(), conv->bias.grad(), lin->weight.grad(), lin->bias.grad()};
    }
    INFO(name);
    for (std::size_t i = 0; i < grads[0].size(); ++i) CHECK(test::rel_error(grads[1][i], grads[0][i]) < 1e-4);
  }
}

// A channels-last conv product's image gradient comes back channels-last (Fold2dParams::channels_last, Note [Fold,
// channels-last output]; a 1x1 stride-1 window returns its columns as the image, no fold): the (N, H, W, C) input's
// gradient is then contiguous, and equals the NCHW layer's (same columns, same noise, same sums). C 64 and a 3x3
// window take the fold's tiles kernel with the halo stage, 3x3 stride 2 the tiles kernel without it.
TEST_CASE("channels-last conv products on CUDA return a channels-last image gradient", "[gpu][grad]") {
  test::PoisonGuard poison;
  struct Window {
    int64_t k, stride, pad;
  };
  for (const std::string name : {"hlq", "lbp_wht", "luq"}) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      for (const Window win : {Window{3, 1, 1}, Window{3, 2, 1}, Window{1, 1, 0}}) {
        INFO(name << " " << dtype_name(dt) << " kernel " << win.k << " stride " << win.stride);
        nn::Conv2dOptions o;
        o.in_channels = 64;
        o.out_channels = 32;
        o.kernel = win.k;
        o.stride = win.stride;
        o.padding = win.pad;
        Generator g1(7), g2(7);
        auto a = std::make_shared<nn::Conv2d>(o, g1);
        o.layout = ConvLayout::nhwc;
        auto b = std::make_shared<nn::Conv2d>(o, g2);
        grad::PipelineConfig cfg;
        cfg.default_spec.name = name;
        nn::bind_pipelines(*a, cfg, std::make_shared<grad::StepClock>());
        nn::bind_pipelines(*b, cfg, std::make_shared<grad::StepClock>());
        a->to(test::kCuda);
        b->to(test::kCuda);
        const Tensor x = test::random_input({2, 64, 12, 12}, 21, DType::f32).to(test::kCuda).to(dt);
        Tensor xa = x.detach(), xb = permute(x, {0, 2, 3, 1}).contiguous();
        xa.set_requires_grad(true);
        xb.set_requires_grad(true);
        const Tensor ya = a->forward(xa), yb = b->forward(xb);  // (2, 32, OH, OW), (2, OH, OW, 32)
        const Tensor gy = test::random_input(ya.shape(), 22, DType::f32).to(test::kCuda).to(dt);
        sum(mul(ya, gy)).backward();
        sum(mul(yb, permute(gy, {0, 2, 3, 1}))).backward();
        REQUIRE(xb.grad().defined());
        CHECK(test::rel_error(xb.grad(), permute(xa.grad(), {0, 2, 3, 1})) < 1e-5);
        if (name != "hlq") continue;
        // The product node's own output: channels-last for the channels-last image, the NCHW one's values.
        Unfold2dParams u;
        u.kernel_h = u.kernel_w = win.k;
        u.stride_h = u.stride_w = win.stride;
        u.pad_h = u.pad_w = win.pad;
        const Tensor w = a->weight.detach().to(dt).reshape({32, -1});
        const grad::ProductCall call{grad::make_hlq_pipeline(grad::HlqOptions{}), {}, {}};
        Tensor node_grads[2];
        for (int cl = 0; cl < 2; ++cl) {
          Tensor image = cl ? permute(xb.detach(), {0, 3, 1, 2}) : xa.detach();
          image.set_requires_grad(true);
          const Tensor y = grad::conv_product(image, w, u, call);  // (N, L, O)
          const Tensor g3 = test::random_input(y.shape(), 23, DType::f32).to(test::kCuda).to(dt);
          node_grads[cl] = y.grad_fn()->apply({g3})[0];
          CHECK(is_channels_last(node_grads[cl]) == (cl == 1));
        }
        CHECK(test::compare(node_grads[1].to(Device::cpu()), node_grads[0].to(Device::cpu()), 0, 0) == "");
      }
    }
  }
}

TEST_CASE("hlq acbp_conv input_map: CUDA matches the CPU reference in both conv layouts", "[gpu][grad]") {
  // docs/gradient_pipelines.md, Note [ACBP of a convolution]: the forward keeps the int8 input map (one scale
  // per sample), backward dequantises, unfolds and projects it. The saved integers are bit-identical on both
  // backends (checked through quantize on the map the pipeline quantises), so the gradients differ only as in
  // the test above.
  test::PoisonGuard poison;
  grad::PipelineSpec base;
  base.name = "hlq";
  base.options_as<grad::HlqOptions>().acbp_conv = grad::AcbpConv::input_map;
  std::vector<Case> specs{{"input_map default", base}};
  grad::PipelineSpec t = base;
  t.options_as<grad::HlqOptions>().gw_scale = grad::ScaleGranularity::sample;
  t.options_as<grad::HlqOptions>().acbp_bits = 4;
  t.options_as<grad::HlqOptions>().x_scale = grad::ScaleRule::absmax;
  specs.push_back({"input_map sample acbp4 absmax", t});
  t = base;
  t.options_as<grad::HlqOptions>().acbp_bits = 0;
  specs.push_back({"input_map unquantised map", t});
  // The default conv products (the integer products over the columns, g_x folded) run in every case above and
  // with the saved columns here; the simulated forms, for comparison only: g_x as cuDNN backward data over the
  // dequantised levels (Note [HLQ conv g_x]), g_w as cuDNN backward filter of the map's image and the
  // back-projected g̃ (Note [HLQ conv g_w]), and both.
  t = base;
  t.options_as<grad::HlqOptions>().acbp_conv = grad::AcbpConv::columns;
  specs.push_back({"columns default", t});
  t = base;
  t.options_as<grad::HlqOptions>().conv_gx = grad::ConvGx::dgrad_simulated;
  specs.push_back({"input_map conv_gx dgrad_simulated", t});
  t = base;
  t.options_as<grad::HlqOptions>().conv_gw = grad::ConvGw::wgrad_simulated;
  specs.push_back({"input_map conv_gw wgrad_simulated", t});
  t.options_as<grad::HlqOptions>().conv_gx = grad::ConvGx::dgrad_simulated;
  specs.push_back({"input_map both simulated", t});
  const int64_t N = 3, C = 5, H = 16, O = 24;
  for (const int64_t stride : {int64_t{1}, int64_t{2}}) {  // 16×16 grid (n 256) / 8×8 grid (n 64)
    Unfold2dParams u;
    u.kernel_h = u.kernel_w = 3;
    u.stride_h = u.stride_w = stride;
    u.pad_h = u.pad_w = 1;
    const int64_t OH = (H - 1) / stride + 1;
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor x = test::random_input({N, C, H, H}, 21, DType::f32).to(dt);
      const Tensor w = mul(test::random_input({O, C * 9}, 22, DType::f32), 0.1).to(dt);
      const Tensor g = mul(test::random_input({N, OH * OH, O}, 23, DType::f32), 0.01).to(dt);
      for (const bool nhwc : {false, true}) {
        // The map the pipeline quantises (memory order of the layout): identical integers and scales.
        const Tensor phys = nhwc ? permute(x, {0, 2, 3, 1}).contiguous() : x;
        grad::QuantSpec q;
        q.bits = 8;
        q.granularity = grad::Granularity::sample;
        q.scale_rule = grad::ScaleRule::sawb;
        q.rounding = grad::Rounding::nearest;
        const grad::Quantized qc = grad::quantize(phys, q);
        const grad::Quantized qg = grad::quantize(phys.to(test::kCuda), q);
        CHECK(test::compare_bits(qg.values, qc.values) == "");
        CHECK(test::compare_bits(qg.scale, qc.scale) == "");
        for (const Case& c : specs) {
          struct Out {
            Tensor y, gx, gw;
            int64_t bytes = 0;
          } out[2];
          for (int dev = 0; dev < 2; ++dev) {
            Tensor xs = dev ? phys.to(test::kCuda) : phys.clone();
            xs.set_requires_grad(true);
            Tensor ws = dev ? w.to(test::kCuda) : w.clone();
            ws.set_requires_grad(true);
            const Tensor image = nhwc ? permute(xs, {0, 3, 1, 2}) : xs;  // (N, C, H, W)
            const grad::ProductCall call{grad::make_pipeline(c.spec), {}, grad::NoiseKey{11, 2, 5}, &out[dev].bytes};
            out[dev].y = grad::conv_product(image, ws, u, call);  // (N, L, O)
            sum(mul(out[dev].y, dev ? g.to(test::kCuda) : g)).backward();
            out[dev].gx = xs.grad();
            out[dev].gw = ws.grad();
          }
          INFO(c.label << ", " << dtype_name(dt) << ", stride " << stride << (nhwc ? ", nhwc" : ", nchw"));
          CHECK(out[1].bytes == out[0].bytes);
          // The map, unless the columns are smaller (acbp_bits 4 at stride 2: 3·36·45 / 2 < 3·5·16·16).
          const int bits = c.spec.options_as<grad::HlqOptions>().acbp_bits;
          const auto item = static_cast<int64_t>(itemsize(dt));
          const int64_t R = stride == 1 ? 136 : 36;  // n 256: r 136; n 64: r 36
          const int64_t map_bytes = bits == 0 ? x.numel() * item : x.numel() + 4 * N;
          const int64_t col_bytes = bits == 0 ? N * R * C * 9 * item
                                              : N * R * C * 9 * bits / 8 +
                                                    (c.spec.options_as<grad::HlqOptions>().gw_scale == grad::ScaleGranularity::sample ? 4 * N : 4);
          CHECK(out[0].bytes == (c.spec.options_as<grad::HlqOptions>().acbp_conv == grad::AcbpConv::input_map ? std::min(map_bytes, col_bytes)
                                                                                    : col_bytes));
          CHECK(out[1].gw.is_cuda());
          CHECK(out[1].gw.dtype() == dt);
          CHECK(out[1].gx.dtype() == dt);
          const double tol = dt == DType::f32 ? 1e-4 : 1.5e-2;
          CHECK(test::rel_error(out[1].y, out[0].y) < tol);
          CHECK(test::rel_error(out[1].gx, out[0].gx) < tol);
          CHECK(test::rel_error(out[1].gw, out[0].gw) < tol);
        }
      }
    }
  }
}

TEST_CASE("scale_i32 on CUDA equals the CPU on odd and vector-friendly shapes", "[gpu][grad]") {
  // The int32 epilogue of HLQ's int8 g_x product (token / sample scales): rows in groups of rows_per_scale,
  // row-chunked kernels with 16-byte (several chunks a thread; 1600 columns: a partly filled second span) and
  // element-wise paths.
  struct Case {
    int64_t rows, cols, per;
  };
  for (const Case c : {Case{12, 768, 1}, Case{30, 13, 3}, Case{7, 40, 7}, Case{64, 24, 16}, Case{3, 1, 1},
                     Case{20, 1600, 4}}) {
    CAPTURE(c.rows, c.cols, c.per);
    const Tensor row_scale =
        test::random_input({c.rows / c.per}, 40 + static_cast<uint64_t>(c.cols), DType::f32, 0.1, 3.0);
    // int32 accumulators: a·s_a·s_b·mult·row (the CPU rounds in another order: within 2 f32 ulps)
    const Tensor acc = test::random_input({c.rows, c.cols}, 99, DType::f32, -3e5, 3e5).to(DType::i32);
    const Tensor sa = full({1}, 0.0123, {DType::f32, Device::cpu()}), sb = full({1}, 0.5, {DType::f32, Device::cpu()});
    for (DType out : {DType::bf16, DType::f32})
      for (bool rows : {false, true}) {
        CAPTURE(dtype_name(out), rows);
        const Tensor rs = rows ? row_scale : Tensor();
        const Tensor expect = grad::scale_i32(acc, sa, sb, 0.25, out, rs, c.per).to(DType::f64);
        Tensor gpu;
        {
          test::PoisonGuard poison;
          gpu = grad::scale_i32(acc.to(test::kCuda), sa.to(test::kCuda), sb.to(test::kCuda), 0.25, out,
                                rows ? row_scale.to(test::kCuda) : Tensor(), c.per);
        }
        CHECK(test::rel_error(gpu.to(Device::cpu()).to(DType::f64), expect) < (out == DType::bf16 ? 8e-3 : 1e-6));
      }
  }
}

TEST_CASE("split_scaled_codes on CUDA gives the CPU's bits; scaled_code_product agrees", "[gpu][grad]") {
  // Note [Per-sample scales in one product]: HLQ's int8 codes and LUQ's e4m3 codes, per-sample scales over 5 orders
  // of magnitude; per-sample sizes that take the 16-byte path (multiple of 8) and the element-wise one.
  struct Case {
    int64_t B, K, C;
  };
  for (const Case c : {Case{6, 5, 24}, Case{5, 3, 7}, Case{2, 1, 1}})
    for (DType dt : {DType::i8, DType::f8e4m3}) {
      CAPTURE(c.B, c.K, c.C, dtype_name(dt));
      const Tensor raw = test::random_input({c.B, c.K, c.C}, 61 + static_cast<uint64_t>(c.C), DType::f32, -127, 127);
      const Tensor codes = dt == DType::i8 ? raw.to(DType::i8) : mul(raw, 1.0 / 16).to(DType::f8e4m3);
      const Tensor scale = exp(test::random_input({c.B}, 62, DType::f32, -6.0, 6.0));
      const Tensor cpu = grad::split_scaled_codes(codes, scale);
      REQUIRE(cpu.size(0) == 2);
      Tensor gpu;
      {
        test::PoisonGuard poison;
        gpu = grad::split_scaled_codes(codes.to(test::kCuda), scale.to(test::kCuda));
      }
      CHECK(test::compare_bits(gpu, cpu) == "");
      // hi + lo is t = scale·code within 2^-18 (f64 reference; t itself is one f32 rounding off)
      const Tensor t = mul(codes.to(DType::f64), reshape(scale.to(DType::f64), {c.B, 1, 1}));
      const Tensor sum = add(select(cpu, 0, 0).to(DType::f64), select(cpu, 0, 1).to(DType::f64));
      CHECK(test::rel_error(sum, t) < 5e-6);
      const Tensor other = test::random_input({c.B, c.K, 11}, 63, DType::f32, -127, 127).to(DType::i8);
      const Tensor a = dt == DType::i8 ? codes : codes.to(DType::f32).to(DType::i8);
      const Tensor expect = grad::scaled_code_product(a, other, scale);
      const Tensor got = grad::scaled_code_product(a.to(test::kCuda), other.to(test::kCuda), scale.to(test::kCuda));
      CHECK(test::rel_error(got.to(Device::cpu()), expect) < 1e-6);
    }
}

TEST_CASE("hlq acbp_share in a ViT on CUDA: proj reads the attention's kept output without a copy", "[gpu][grad]") {
  // Note [Shared saved inputs]: the packed flash attention keeps its output o for its backward, and o is the
  // input of blocks.N.attn.proj; with acbp_share HLQ keeps a reference and compresses o in backward. Note [Rebuilt
  // inputs]: with acbp_rebuild too, qkv, mlp.fc1 and mlp.fc2 keep nothing and rebuild the LayerNorm / gelu outputs
  // in backward. The gradients
  // keep their bits (the compression of x is deterministic); only the saved bytes change.
  test::PoisonGuard poison;
  const models::VitConfig cfg = test::tiny_vit(128, 2, 2);  // D 64: the fused attention
  std::vector<Tensor> grads[3];
  int64_t proj_bytes[3] = {-1, -1, -1}, fc1_bytes[3] = {-1, -1, -1}, fc2_bytes[3] = {-1, -1, -1},
          qkv_bytes[3] = {-1, -1, -1};
  for (int run = 0; run < 3; ++run) {  // 0: copies, 1: acbp_share, 2: acbp_share and acbp_rebuild
    Generator gen(9);
    models::VisionTransformer v(cfg, gen, std::make_shared<Generator>(10));
    v.to(test::kCuda);
    v.to(DType::bf16);
    grad::PipelineConfig pc;
    pc.default_spec.name = "hlq";
    pc.default_spec.options_as<grad::HlqOptions>().acbp_share = run >= 1;
    pc.default_spec.options_as<grad::HlqOptions>().acbp_rebuild = run == 2;
    const auto bound = nn::bind_pipelines(v, pc, std::make_shared<grad::StepClock>());
    const Tensor x = test::random_input({4, 3, 8, 8}, 11, DType::f32).to(DType::bf16).to(test::kCuda);
    const Tensor target = from_vector(std::vector<int64_t>{1, 7, 3, 0}, {4}, {DType::i64}).to(test::kCuda);
    cross_entropy(v.forward(x), target).backward();
    for (const auto& b : bound) {
      if (b.name == "blocks.1.attn.proj") proj_bytes[run] = b.binding->saved_bytes;
      if (b.name == "blocks.1.mlp.fc1") fc1_bytes[run] = b.binding->saved_bytes;
      if (b.name == "blocks.1.mlp.fc2") fc2_bytes[run] = b.binding->saved_bytes;
      if (b.name == "blocks.1.attn.qkv") qkv_bytes[run] = b.binding->saved_bytes;
    }
    for (auto& [n, p] : v.named_parameters()) grads[run].push_back(p->grad());
  }
  CHECK(proj_bytes[0] > 0);
  CHECK(proj_bytes[1] == 0);
  CHECK(proj_bytes[2] == 0);
  CHECK(fc1_bytes[0] > 0);  // the LayerNorm keeps its input, not fc1's
  CHECK(fc1_bytes[1] == fc1_bytes[0]);
  CHECK(fc1_bytes[2] == 0);  // rebuilt from the LayerNorm's kept input
  CHECK(qkv_bytes[0] > 0);
  CHECK(qkv_bytes[1] == qkv_bytes[0]);
  CHECK(qkv_bytes[2] == 0);
  CHECK(fc2_bytes[0] > 0);
  CHECK(fc2_bytes[1] == fc2_bytes[0]);
  CHECK(fc2_bytes[2] == 0);
  for (int run = 1; run < 3; ++run) {
    REQUIRE(grads[0].size() == grads[run].size());
    for (std::size_t i = 0; i < grads[0].size(); ++i) {
      REQUIRE(grads[0][i].defined());
      CHECK(test::compare_bits(grads[run][i], grads[0][i].to(Device::cpu())) == "");
    }
  }
}

TEST_CASE("recompute_output in a ViT on CUDA: the gelu and the attention keep no fc1 / qkv output", "[gpu][grad]") {
  // Note [Recomputed outputs]: with recompute_output on fc1 and qkv, the gelu keeps fc1's node instead of z, and the
  // packed attention qkv's node instead of the packed q, k, v; both are rebuilt in backward (fc1's through the
  // LayerNorm's rebuild). What the forward leaves allocated drops by those tensors; the gradients keep their bits.
  test::PoisonGuard poison;
  const models::VitConfig cfg = test::tiny_vit(128, 2, 2);  // D 64: the fused attention
  const int64_t B = 4, tokens = 5;  // 2x2 patches and the class token
  std::vector<Tensor> grads[2];
  std::size_t after_forward[2] = {0, 0};
  for (int recompute = 0; recompute < 2; ++recompute) {
    Generator gen(9);
    models::VisionTransformer v(cfg, gen, std::make_shared<Generator>(10));
    v.to(test::kCuda);
    v.to(DType::bf16);
    const grad::PipelineConfig pc = test::hlq_recomputing_fc1_qkv(recompute == 1);
    const auto bound = nn::bind_pipelines(v, pc, std::make_shared<grad::StepClock>());
    const Tensor x = test::random_input({B, 3, 8, 8}, 11, DType::f32).to(DType::bf16).to(test::kCuda);
    const Tensor target = from_vector(std::vector<int64_t>{1, 7, 3, 0}, {B}, {DType::i64}).to(test::kCuda);
    const std::size_t before = cuda::memory_stats().allocated_bytes;
    const Tensor loss = cross_entropy(v.forward(x), target);
    after_forward[recompute] = cuda::memory_stats().allocated_bytes - before;
    loss.backward();
    for (const auto& b : bound) {
      INFO(b.name);
      CHECK(b.binding->output_rebuilt == (recompute == 1 && (b.name.ends_with("fc1") || b.name.ends_with("qkv"))));
    }
    for (auto& [n, p] : v.named_parameters()) grads[recompute].push_back(p->grad());
  }
  // Per block: z (B, tokens, 4·dim) and qkv (B, tokens, 3·dim) in bf16; the product nodes keep the bias casts
  // (a few KiB) instead.
  const std::size_t expected = static_cast<std::size_t>(cfg.depth * B * tokens * 7 * cfg.dim * 2);
  INFO("after the forward: " << after_forward[0] << " -> " << after_forward[1] << " bytes, expected -" << expected);
  CHECK(after_forward[0] >= after_forward[1] + expected - 8192);
  REQUIRE(grads[0].size() == grads[1].size());
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    REQUIRE(grads[0][i].defined());
    CHECK(test::compare_bits(grads[1][i], grads[0][i].to(Device::cpu())) == "");
  }
}

TEST_CASE("hlq acbp_rebuild in a ResNet on CUDA: every conv after a batch norm rebuilds its input", "[gpu][grad]") {
  // Note [Rebuilt inputs]: a conv's input in a ResNet is a fused batch norm's output (bn-relu, or bn-add-relu for a
  // block's input; in channels last seen through a reshape), which the CUDA batch norm rebuilds from its kept input,
  // statistics, weight, bias and residual with the forward's normalisation kernel. So with acbp_rebuild every Conv2d
  // but the stem's keeps nothing, and the gradients keep their bits (the default conv_gw columns: g_w over the
  // columns the forward would have kept). Second pass: conv_gw wgrad_simulated reads the rebuilt image itself (Note
  // [HLQ conv g_w]): the same bytes, gradients near the columns form's.
  test::PoisonGuard poison;
  for (const ConvLayout layout : {ConvLayout::nhwc, ConvLayout::nchw}) {
    INFO((layout == ConvLayout::nhwc ? "nhwc" : "nchw"));
    std::vector<Tensor> grads[3];
    std::map<std::string, int64_t> bytes[3];
    for (int rebuild = 0; rebuild < 3; ++rebuild) {
      Generator gen(12);
      models::ResNetConfig rc;
      rc.layout = layout;
      models::ResNet net(rc, gen);
      net.to(test::kCuda);
      net.to(DType::bf16);
      grad::PipelineConfig pc;
      pc.default_spec.name = "hlq";
      pc.default_spec.options_as<grad::HlqOptions>().acbp_rebuild = rebuild >= 1;
      if (rebuild == 2) pc.default_spec.options_as<grad::HlqOptions>().conv_gw = grad::ConvGw::wgrad_simulated;
      const auto bound = nn::bind_pipelines(net, pc, std::make_shared<grad::StepClock>());
      const Tensor x = test::random_input({4, 3, 8, 8}, 13, DType::f32).to(DType::bf16).to(test::kCuda);
      const Tensor target = from_vector(std::vector<int64_t>{1, 7, 3, 0}, {4}, {DType::i64}).to(test::kCuda);
      cross_entropy(net.forward(x), target).backward();
      for (const auto& b : bound) bytes[rebuild][b.name] = b.binding->saved_bytes;
      for (auto& [n, p] : net.named_parameters()) grads[rebuild].push_back(p->grad());
    }
    REQUIRE(bytes[0].size() == 21);  // 20 convs (3 downsample) and fc
    for (const auto& [name, b] : bytes[0]) {
      INFO(name);
      CHECK(b > 0);
      const bool kept = name == "conv1" || name == "fc";  // the stem reads the image; fc a mean
      CHECK(bytes[1][name] == (kept ? b : 0));
      CHECK(bytes[2][name] == bytes[1][name]);
    }
    REQUIRE(grads[0].size() == grads[1].size());
    REQUIRE(grads[2].size() == grads[1].size());
    for (std::size_t i = 0; i < grads[0].size(); ++i) {
      REQUIRE(grads[0][i].defined());
      CHECK(test::compare_bits(grads[1][i], grads[0][i].to(Device::cpu())) == "");
      const double d = test::rel_error(grads[2][i], grads[1][i]);
      INFO("parameter " << i << " " << grads[2][i].describe() << ": wgrad_simulated vs columns " << d);
      CHECK(d < 0.5);  // x̃'s 8-bit rounding and its SAWB clipping (a wrong g_w is ~1 or more off)
    }
  }
}

TEST_CASE("hlq overlap: g_w's chain on a side stream gives one stream's bits, eagerly and in a step graph",
          "[gpu][grad]") {
  // Note [HLQ's two chains]: the same kernels and noise on two streams. L 256 (n 64: projection, 8-bit quantiser,
  // int8 product, rescaling beside g_x's quantisers and fp8 product); L 65 (identity HLA plan): with gx_bits 4 g_w
  // takes max |g_y| from g_x's quantiser on the side stream, with gx_bits 0 its own; either way the bias gradient
  // comes from the side stream's 8-bit quantiser and is handed to the main stream.
  struct Setup {
    int64_t L;
    int gx_bits;
  };
  for (const Setup su : {Setup{256, 4}, Setup{65, 4}, Setup{65, 0}}) {
    const int64_t B = 2, L = su.L, I = 192, O = 320;
    INFO("L " << L << ", gx_bits " << su.gx_bits);
    const Tensor x = test::random_input({B, L, I}, 41, DType::bf16).to(test::kCuda);
    const Tensor w = mul(test::random_input({O, I}, 42, DType::f32), 0.05).to(DType::bf16).to(test::kCuda);
    const Tensor g = mul(test::random_input({B, L, O}, 43, DType::f32), 0.01).to(DType::bf16).to(test::kCuda);
    grad::PipelineSpec on;
    on.name = "hlq";
    on.options_as<grad::HlqOptions>().gx_bits = su.gx_bits;
    grad::PipelineSpec off = on;
    off.options_as<grad::HlqOptions>().overlap = false;
    const grad::Wanted wanted{true, true, true};

    cuda::StepGraph graph(0);
    cuda::StreamGuard stream(graph.stream(), 0);  // eager steps first, on the graph's stream (cuda/graph.h)
    grad::StepClock clock;
    clock.keep_on_device(test::kCuda);
    clock.set(3);
    const grad::NoiseKey key{7, 1, 0, static_cast<const int64_t*>(clock.word.data_ptr())};
    auto run = [&](grad::Pipeline& p) {
      grad::ForwardResult f = p.forward(x, w, {}, key, grad::SaveForBackward::yes);
      return p.backward(*f.saved, g, wanted);
    };
    auto p_on = grad::make_pipeline(on), p_off = grad::make_pipeline(off);
    const grad::Grads serial = run(*p_off);
    const grad::Grads side = run(*p_on);
    REQUIRE(side.w.defined());
    CHECK(test::compare_bits(side.x, serial.x.to(Device::cpu())) == "");
    CHECK(test::compare_bits(side.w, serial.w.to(Device::cpu())) == "");
    CHECK(side.b.defined() == serial.b.defined());
    if (L == 65) CHECK(side.b.defined());
    if (serial.b.defined()) CHECK(test::compare_bits(side.b, serial.b.to(Device::cpu())) == "");

    // Recorded: the fork and join become two branches of the graph; what the branch allocates is freed inside it
    Tensor gx_out = empty_like(serial.x), gw_out = empty_like(serial.w);
    const std::string why = graph.record([&] {
      const grad::Grads r = run(*p_on);
      copy_(gx_out, r.x);
      copy_(gw_out, r.w);
    });
    REQUIRE(why == "");
    graph.replay();
    REQUIRE(cudaStreamSynchronize(graph.stream()) == cudaSuccess);
    CHECK(test::compare_bits(gx_out, serial.x.to(Device::cpu())) == "");
    CHECK(test::compare_bits(gw_out, serial.w.to(Device::cpu())) == "");
  }
}

// Note [Fast accumulation of integer codes] (ops/lowp_matmul.h): HLQ's g_x product multiplies 4-bit levels held in
// e4m3, so its partial sums are integers, and while they stay below 2^14 the fast accumulator sums them exactly:
// g_x with fast accumulation is then bit-identical to the promoted product. Checked on a small layer and on
// Llama-3-8B's q_proj (K = 4096) and up_proj (g_x sums over K = 14336) at 2048 tokens, Gaussian g_y and W, and
// g_y with outlier channels (one in 64 channels 40x larger: after the rotation their blocks take the largest
// levels). g_w (int8, exact) and the bias gradient keep their bits either way.
TEST_CASE("hlq fp8_accumulation fast: g_x bit-identical to the precise product, g_w unchanged", "[gpu][grad]") {
  struct Layer {
    int64_t B, L, I, O;
    bool outliers;
  };
  grad::StepClock clock;
  clock.keep_on_device(test::kCuda);
  clock.set(3);
  const grad::NoiseKey key{7, 1, 0, static_cast<const int64_t*>(clock.word.data_ptr())};
  grad::PipelineSpec precise;
  precise.name = "hlq";
  precise.options_as<grad::HlqOptions>().fp8_accumulation = Fp8Accumulation::precise;
  grad::PipelineSpec fast = precise;
  fast.options_as<grad::HlqOptions>().fp8_accumulation = Fp8Accumulation::fast;
  CHECK(grad::describe(precise).find("precise fp8 accumulation") != std::string::npos);
  CHECK(grad::describe(fast).find("accumulation") == std::string::npos);  // the default goes unsaid
  for (const Layer s : {Layer{2, 256, 192, 320, false}, Layer{1, 2048, 4096, 4096, false},
                        Layer{1, 2048, 4096, 4096, true}, Layer{1, 2048, 4096, 14336, false}}) {
    CAPTURE(s.B, s.L, s.I, s.O, s.outliers);
    const Tensor x = test::random_input({s.B, s.L, s.I}, 51, DType::bf16).to(test::kCuda);
    const Tensor w = mul(test::random_input({s.O, s.I}, 52, DType::f32), 0.02).to(DType::bf16).to(test::kCuda);
    Tensor g = mul(test::random_input({s.B, s.L, s.O}, 53, DType::f32), 0.01);
    if (s.outliers) {
      std::vector<float> col(static_cast<std::size_t>(s.O), 1.f);
      for (int64_t c = 0; c < s.O; c += 64) col[static_cast<std::size_t>(c)] = 40.f;
      g = mul(g, from_vector(col, {s.O}));
    }
    g = g.to(DType::bf16).to(test::kCuda);
    auto run = [&](const grad::PipelineSpec& spec) {
      auto p = grad::make_pipeline(spec);
      grad::ForwardResult f = p->forward(x, w, {}, key, grad::SaveForBackward::yes);
      return p->backward(*f.saved, g, {true, true, true});
    };
    const grad::Grads a = run(precise), b = run(fast);
    CHECK(test::compare_bits(b.w, a.w.to(Device::cpu())) == "");
    CHECK(test::compare_bits(b.x, a.x.to(Device::cpu())) == "");
  }
}
