// Linear and Conv2d modules. Their products are where gradient pipelines plug in: forward captures the
// pipeline, backward never looks it up globally. Mixed precision: the weights come from materialise in the
// input's dtype (Note [Materialising parameters]: a bf16 forward's weight gradient reaches the f32 master).
#include "hadatrain/autograd/function.h"
#include "hadatrain/nn/init.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn {
namespace {
// The node that made x, when x is its only output and it can rebuild x from what it keeps for its own backward
// (Note [Rebuilt inputs]); null otherwise.
std::shared_ptr<Node> rebuilder_of(const Tensor& x) {
  const auto& fn = x.grad_fn();
  return fn && fn->rebuilds_output(x.output_nr()) ? fn : nullptr;
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, Bias b, Generator& gen) : in_features(in), out_features(out) {
  HT_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in {} out {}", in, out);
  weight = empty({out, in});
  init::default_linear_weight_(weight, gen);
  register_parameter("weight", &weight);
  if (b == Bias::yes) {
    bias = empty({out});
    init::default_linear_bias_(bias, in, gen);
    register_parameter("bias", &bias);
  }
}

Linear::Linear(Tensor w, Tensor b) : weight(std::move(w)), bias(std::move(b)) {
  HT_CHECK(weight.defined() && weight.dim() == 2 && weight.size(0) > 0 && weight.size(1) > 0,
           "Linear: the adopted weight must be (out, in) with positive sizes, got {}",
           weight.defined() ? weight.describe() : std::string("an undefined tensor"));
  HT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
           "Linear: the adopted bias must be ({}), got {}", weight.size(0), bias.describe());
  in_features = weight.size(1);
  out_features = weight.size(0);
  register_parameter("weight", &weight);
  if (bias.defined()) register_parameter("bias", &bias);
}

Tensor Linear::forward(const Tensor& x) {
  HT_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear({}, {}): input {} has last dim {} (expected {})",
           in_features, out_features, x.describe(), x.dim() ? x.size(-1) : 0, in_features);
  if (!grad_pipeline.routes(needs_grad({&x, &weight})))
    return linear(x, materialise(weight, x.dtype()), materialise(bias, x.dtype()));
  // Through the layer's gradient pipeline (Note [Product geometry]): (N, I) is (1, N, I); (B, ..., I) is
  // (B, L, I); the bias goes into the forward GEMM's epilogue, and the product op (not the pipeline) gives it its
  // gradient, so every pipeline agrees on it.
  grad::ProductInfo info;
  Tensor x3;
  if (x.dim() <= 2) {
    x3 = reshape(x, {1, x.dim() == 2 ? x.size(0) : 1, in_features});
    info.batch_rows = x.dim() == 2;
  } else {
    x3 = reshape(x, {x.size(0), -1, in_features});
  }
  // x itself is the output of an op that can rebuild it from what it keeps (Note [Rebuilt inputs]).
  if (auto fn = rebuilder_of(x))
    info.rebuild = {std::move(fn), [s = x3.shape()](const Tensor& t) { return reshape(t, s); }, nullptr};
  const bool train = is_training();
  const grad::ProductCall call{grad_pipeline.pipeline, info, grad_pipeline.key_now(),
                               train ? &grad_pipeline.saved_bytes : nullptr, grad_pipeline.recompute_output,
                               train ? &grad_pipeline.output_rebuilt : nullptr};
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  return reshape(grad::product(x3, materialise(weight, x.dtype()), call, materialise(bias, x.dtype())), out_shape);
}

Conv2d::Conv2d(const Conv2dOptions& o, Generator& gen) : options(o) {
  HT_CHECK(o.in_channels > 0 && o.out_channels > 0 && o.kernel > 0 && o.groups > 0,
           "Conv2d: channels, kernel and groups must be positive (in {}, out {}, kernel {}, groups {})",
           o.in_channels, o.out_channels, o.kernel, o.groups);
  HT_CHECK(o.in_channels % o.groups == 0 && o.out_channels % o.groups == 0,
           "Conv2d: in {} and out {} channels must be divisible by groups {}", o.in_channels, o.out_channels,
           o.groups);
  weight = empty({o.out_channels, o.in_channels / o.groups, o.kernel, o.kernel});
  init::default_linear_weight_(weight, gen);
  register_parameter("weight", &weight);
  if (o.bias == Bias::yes) {
    bias = empty({o.out_channels});
    init::default_linear_bias_(bias, init::fan_in(weight), gen);
    register_parameter("bias", &bias);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  Conv2dParams p;
  p.stride_h = p.stride_w = options.stride;
  p.pad_h = p.pad_w = options.padding;
  p.dilation_h = p.dilation_w = options.dilation;
  p.groups = options.groups;
  p.layout = options.layout;
  if (!grad_pipeline.routes(needs_grad({&x, &weight}))) {
    // An NHWC convolution reads its weight as (O, KH, KW, C): a cast lays it out so in the same pass.
    const WeightLayout wl = options.layout == ConvLayout::nhwc ? WeightLayout::channels_last : WeightLayout::as_is;
    return conv2d(x, materialise(weight, x.dtype(), wl), materialise(bias, x.dtype()), p);
  }
  // Through the layer's gradient pipeline: the im2col view (Note [Product geometry]) x_col (N, L, C·k·k)
  // times W (O, C·k·k)ᵀ, by grad::conv_product, which also hands the pipeline the input map (HLQ may save it
  // instead of the columns); fold2d (unfold2d's backward) maps g_x back to the image. groups == 1 here.
  // Channels last: unfold2d reads the (N, C, H, W) permuted view of x (any strides), and the product's
  // (N, L, O) rows are already the (N, OH, OW, O) output.
  const bool nhwc = options.layout == ConvLayout::nhwc;
  HT_CHECK(x.dim() == 4 && x.size(nhwc ? 3 : 1) == options.in_channels,
           "Conv2d({} -> {}): input must be {}, got {}", options.in_channels, options.out_channels,
           nhwc ? fmt::format("(N, H, W, {}) (layout nhwc)", options.in_channels)
                : fmt::format("(N, {}, H, W)", options.in_channels),
           x.describe());
  const Tensor xn = nhwc ? permute(x, {0, 3, 1, 2}) : x;  // (N, C, H, W)
  Unfold2dParams u;
  u.kernel_h = u.kernel_w = options.kernel;
  u.stride_h = u.stride_w = options.stride;
  u.pad_h = u.pad_w = options.padding;
  u.dilation_h = u.dilation_w = options.dilation;
  const int64_t N = x.size(0), O = options.out_channels;
  const int64_t span = options.dilation * (options.kernel - 1) + 1;
  grad::ProductInfo info;
  info.grid_h = (xn.size(2) + 2 * options.padding - span) / options.stride + 1;
  info.grid_w = (xn.size(3) + 2 * options.padding - span) / options.stride + 1;
  // A batch norm's (or its channels-last reshape's) output, rebuilt in backward (Note [Rebuilt inputs]).
  if (auto fn = rebuilder_of(x))
    info.rebuild = {std::move(fn), [nhwc](const Tensor& t) { return nhwc ? permute(t, {0, 3, 1, 2}) : t; }, nullptr};
  const grad::ProductCall call{grad_pipeline.pipeline, info, grad_pipeline.key_now(),
                               is_training() ? &grad_pipeline.saved_bytes : nullptr};
  const Tensor y3 = grad::conv_product(xn, reshape(materialise(weight, x.dtype()), {O, -1}), u, call);  // (N, L, O)
  if (nhwc) {
    Tensor y = reshape(y3, {N, info.grid_h, info.grid_w, O});
    return bias.defined() ? add(y, reshape(materialise(bias, x.dtype()), {1, 1, 1, O})) : y;
  }
  Tensor y = reshape(y3.transpose(1, 2), {N, O, info.grid_h, info.grid_w});
  return bias.defined() ? add(y, reshape(materialise(bias, x.dtype()), {1, O, 1, 1})) : y;
}

}  // namespace ht::nn
