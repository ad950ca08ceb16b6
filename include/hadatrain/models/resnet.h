// ResNet-18/34/50 with torchvision's parameter names and initialisation, and a choice of stem:
// ImageNet (7x7 stride-2 conv + 3x3 max-pool) or CIFAR (3x3 stride-1 conv, no max-pool), and a choice of
// activation layout: NCHW, or channels last (NHWC: the input is permuted once at the stem, every conv and
// batch norm runs channels last; parameter names, shapes and state dicts are the same in both).
#pragma once
#include <memory>

#include "hadatrain/nn/layers.h"

namespace ht::models {

enum class ResNetDepth { r18, r34, r50 };
enum class ResNetStem { imagenet, cifar };
// Which elementwise steps run fused into the batch norms: bn_relu computes every bn -> relu pair (stem and
// blocks) with one batch_norm op (BatchNormActivation::relu); bn_add_relu also each block's end,
// relu(bn(conv(y)) + shortcut), with batch_norm_add_relu; none runs them as separate ops (the reference
// composition; same parameters, same results).
enum class ResNetFusion { none, bn_relu, bn_add_relu };

struct ResNetConfig {
  ResNetDepth depth = ResNetDepth::r18;
  ResNetStem stem = ResNetStem::cifar;
  int64_t num_classes = 10;
  int64_t in_channels = 3;
  bool zero_init_residual = false;  // torchvision option: last BN of each block starts at 0
  ConvLayout layout = ConvLayout::nchw;  // nhwc: channels-last activations (faster with cuDNN on tensor cores)
  ResNetFusion fusion = ResNetFusion::bn_add_relu;
};

ResNetDepth resnet_depth_from_name(const std::string& name);  // "resnet18", "resnet34", "resnet50"

class ResNet : public nn::Module {
 public:
  ResNet(const ResNetConfig& cfg, Generator& gen);
  std::string type_name() const override { return "ResNet"; }
  Tensor forward(const Tensor& x) override;  // (N, C, H, W) -> (N, num_classes), in either layout
  ResNetConfig config;

 private:
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::shared_ptr<nn::MaxPool2d> maxpool_;
  std::shared_ptr<nn::Sequential> layers_[4];
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace ht::models
