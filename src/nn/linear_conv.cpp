// Linear and Conv2d modules. Their products are where gradient pipelines plug in (a later issue):
// forward captures the pipeline, backward never looks it up globally.
#include "hadatrain/nn/init.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/tensor/factory.h"

namespace ht::nn {
namespace {
// Mixed precision: parameters stay in their master dtype (f32) and are cast, differentiably, to the
// compute dtype of the input (bf16 forward); the gradient flows back to the master weight in f32.
Tensor cast_like(const Tensor& p, const Tensor& x) {
  return !p.defined() || p.dtype() == x.dtype() ? p : p.to(x.dtype());
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

Tensor Linear::forward(const Tensor& x) {
  HT_CHECK(x.dim() >= 1 && x.size(-1) == in_features, "Linear({}, {}): input {} has last dim {} (expected {})",
           in_features, out_features, x.describe(), x.dim() ? x.size(-1) : 0, in_features);
  return linear(x, cast_like(weight, x), cast_like(bias, x));
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
  return conv2d(x, cast_like(weight, x), cast_like(bias, x), p);
}

}  // namespace ht::nn
