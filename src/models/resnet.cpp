// ResNet (He et al. 2016) as torchvision builds it: BasicBlock (18/34) or Bottleneck (50, stride on the
// 3x3 conv, "ResNet v1.5"), downsample = 1x1 conv + BN when the shape changes, kaiming-normal(fan_out) conv
// init, BN weight 1 / bias 0, default Linear init for fc. With ResNetConfig::layout nhwc the activations are
// channels last (N, H, W, C) from the stem on: convs and batch norms run in that layout, residual adds and
// ReLU do not care, the max-pool runs on the NCHW view, the global average pool is a mean over (H, W).
#include "hadatrain/models/resnet.h"

#include "hadatrain/nn/init.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"

namespace ht::models {
namespace {

using nn::Bias;

std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, ConvLayout layout,
                                 Generator& gen) {
  nn::Conv2dOptions o;
  o.layout = layout;
  o.in_channels = in;
  o.out_channels = out;
  o.kernel = k;
  o.stride = stride;
  o.padding = k / 2;
  o.bias = Bias::no;
  auto c = std::make_shared<nn::Conv2d>(o, gen);
  nn::init::kaiming_normal_fan_out_(c->weight, gen);
  return c;
}

std::shared_ptr<nn::BatchNorm2d> bn(int64_t channels, ConvLayout layout) {
  auto b = std::make_shared<nn::BatchNorm2d>(channels);
  b->layout = layout;
  return b;
}

// relu(bn(x)): the batch norm's fused activation when it has one, else a separate relu.
Tensor bn_relu(nn::BatchNorm2d& b, const Tensor& x) {
  const Tensor y = b.forward(x);
  return b.activation == BatchNormActivation::relu ? y : relu(y);
}
// A batch norm followed by relu: fused into it with ResNetFusion::bn_relu.
std::shared_ptr<nn::BatchNorm2d> bn_then_relu(int64_t channels, ConvLayout layout, ResNetFusion fusion) {
  auto b = bn(channels, layout);
  if (fusion != ResNetFusion::none) b->activation = BatchNormActivation::relu;
  return b;
}

class Block : public nn::Module {
 public:
  Block(int64_t in, int64_t planes, int64_t stride, bool bottleneck, bool zero_init, ConvLayout layout,
        ResNetFusion fusion, Generator& gen)
      : bottleneck_(bottleneck), fuse_add_(fusion == ResNetFusion::bn_add_relu) {
    const int64_t expansion = bottleneck ? 4 : 1, out = planes * expansion;
    if (bottleneck) {
      conv1_ = register_module("conv1", conv(in, planes, 1, 1, layout, gen));
      bn1_ = register_module("bn1", bn_then_relu(planes, layout, fusion));
      conv2_ = register_module("conv2", conv(planes, planes, 3, stride, layout, gen));
      bn2_ = register_module("bn2", bn_then_relu(planes, layout, fusion));
      conv3_ = register_module("conv3", conv(planes, out, 1, 1, layout, gen));
      bn3_ = register_module("bn3", bn(out, layout));
    } else {
      conv1_ = register_module("conv1", conv(in, planes, 3, stride, layout, gen));
      bn1_ = register_module("bn1", bn_then_relu(planes, layout, fusion));
      conv2_ = register_module("conv2", conv(planes, planes, 3, 1, layout, gen));
      bn2_ = register_module("bn2", bn(planes, layout));
    }
    if (zero_init) nn::init::constant_((bottleneck ? bn3_ : bn2_)->weight, 0.0);
    if (stride != 1 || in != out) {
      downsample_ = std::make_shared<nn::Sequential>();
      downsample_->push_back(conv(in, out, 1, stride, layout, gen));
      downsample_->push_back(bn(out, layout));
      register_module("downsample", downsample_);
    }
  }
  std::string type_name() const override { return bottleneck_ ? "Bottleneck" : "BasicBlock"; }
  Tensor forward(const Tensor& x) override {
    Tensor y = bn_relu(*bn1_, conv1_->forward(x));
    const Tensor last = bottleneck_ ? conv3_->forward(bn_relu(*bn2_, conv2_->forward(y))) : conv2_->forward(y);
    nn::BatchNorm2d& bn_last = bottleneck_ ? *bn3_ : *bn2_;
    const Tensor shortcut = downsample_ ? downsample_->forward(x) : x;
    if (fuse_add_) return bn_last.forward_add_relu(last, shortcut);
    return relu(add(bn_last.forward(last), shortcut));
  }

 private:
  bool bottleneck_;
  bool fuse_add_;  // relu(bn(last) + shortcut) as one op (ResNetFusion::bn_add_relu)
  std::shared_ptr<nn::Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<nn::Sequential> downsample_;
};

}  // namespace

ResNetDepth resnet_depth_from_name(const std::string& name) {
  if (name == "resnet18") return ResNetDepth::r18;
  if (name == "resnet34") return ResNetDepth::r34;
  if (name == "resnet50") return ResNetDepth::r50;
  HT_FAIL("unknown ResNet '{}': expected resnet18, resnet34 or resnet50", name);
}

ResNet::ResNet(const ResNetConfig& cfg, Generator& gen) : config(cfg) {
  HT_CHECK(cfg.num_classes > 0 && cfg.in_channels > 0, "ResNet: num_classes and in_channels must be positive");
  const bool bottleneck = cfg.depth == ResNetDepth::r50;
  const int64_t blocks[3][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}, {3, 4, 6, 3}};
  const auto& counts = blocks[static_cast<int>(cfg.depth)];
  if (cfg.stem == ResNetStem::imagenet) {
    conv1_ = register_module("conv1", conv(cfg.in_channels, 64, 7, 2, cfg.layout, gen));
  } else {
    conv1_ = register_module("conv1", conv(cfg.in_channels, 64, 3, 1, cfg.layout, gen));
  }
  bn1_ = register_module("bn1", bn_then_relu(64, cfg.layout, cfg.fusion));
  if (cfg.stem == ResNetStem::imagenet) {
    Pool2dParams p;
    p.kernel_h = p.kernel_w = 3;
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    maxpool_ = std::make_shared<nn::MaxPool2d>(p);
  }
  int64_t in = 64;
  for (int l = 0; l < 4; ++l) {
    const int64_t planes = 64 << l;
    layers_[l] = std::make_shared<nn::Sequential>();
    for (int64_t b = 0; b < counts[l]; ++b) {
      const int64_t stride = (b == 0 && l > 0) ? 2 : 1;
      layers_[l]->push_back(std::make_shared<Block>(in, planes, stride, bottleneck, cfg.zero_init_residual,
                                                        cfg.layout, cfg.fusion, gen));
      in = planes * (bottleneck ? 4 : 1);
    }
    register_module("layer" + std::to_string(l + 1), layers_[l]);
  }
  fc_ = register_module("fc", std::make_shared<nn::Linear>(in, cfg.num_classes, nn::Bias::yes, gen));
}

Tensor ResNet::forward(const Tensor& x) {
  HT_CHECK(x.dim() == 4 && x.size(1) == config.in_channels, "ResNet: expected (N, {}, H, W), got {}",
           config.in_channels, x.describe());
  const bool nhwc = config.layout == ConvLayout::nhwc;
  Tensor y = nhwc ? contiguous(permute(x, {0, 2, 3, 1})) : x;  // (N, H, W, C) once, at the stem
  y = bn_relu(*bn1_, conv1_->forward(y));
  if (maxpool_)
    y = nhwc ? contiguous(permute(maxpool_->forward(permute(y, {0, 3, 1, 2})), {0, 2, 3, 1})) : maxpool_->forward(y);
  for (auto& l : layers_) y = l->forward(y);
  y = nhwc ? mean(y, {1, 2}) : adaptive_avg_pool2d(y, 1, 1).flatten(1);  // (N, C)
  return fc_->forward(y);
}

}  // namespace ht::models
