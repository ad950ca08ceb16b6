// Golden tests against PyTorch: torchvision ResNet-18 (CIFAR stem) and a small timm ViT, with weights filled
// by the closed formula of tools/golden/make_fixtures.py, compared in float64 on a fixed batch: logits, loss,
// batch-norm running statistics, and for every parameter its gradient norm and 32 sampled elements.
// The fixtures (tests/fixtures/golden_*.safetensors) were made by that script with torch on the GPU machine
// (its `small` set); the ImageNet-stem ResNets and the ViT-B/16-shaped ViT are in test_golden_imagenet.cpp.
#include "support/catch.h"
#include "support/golden_testing.h"

#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"

using namespace ht;
using test::check_against_golden;

TEST_CASE("ResNet-18 (CIFAR stem) matches torchvision in float64", "[golden]") {
  Generator gen(0);
  models::ResNet r({models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 3, false}, gen);
  check_against_golden(r, "tests/fixtures/golden_resnet18_cifar.safetensors", 0.0);
}

TEST_CASE("a small ViT matches timm in float64", "[golden]") {
  models::VitConfig c;
  c.image_size = 16;
  c.patch_size = 4;
  c.dim = 32;
  c.depth = 2;
  c.heads = 4;
  c.num_classes = 10;
  Generator gen(0);
  models::VisionTransformer v(c, gen, std::make_shared<Generator>(1));
  check_against_golden(v, "tests/fixtures/golden_vit_tiny.safetensors", 0.1);
}
