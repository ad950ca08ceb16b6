// Golden tests against PyTorch for the ImageNet-scale architectures: torchvision ResNet-34 (basic blocks) and
// ResNet-50 (bottlenecks), both with the ImageNet stem (7x7 stride-2 conv, 3x3 stride-2 max-pool), and a timm ViT
// with ViT-B/16's blocks (dim 768, 12 heads, MLP 3072, patch 16, class token) and 2 of its 12 blocks. Weights are
// filled by the closed formula of tools/golden/make_fixtures.py (its `imagenet` set, which wrote the fixtures with
// torch on the GPU machine); a 4 x 3 x 32 x 32 batch in float64 is compared for logits, loss, batch-norm running
// statistics and every parameter's gradient norm and 32 sampled elements (support/golden_testing.h).
#include "support/catch.h"
#include "support/golden_testing.h"

#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"

using namespace ht;
using test::check_against_golden;

TEST_CASE("ResNet-34 (ImageNet stem) matches torchvision in float64", "[golden]") {
  Generator gen(0);
  models::ResNet r({models::ResNetDepth::r34, models::ResNetStem::imagenet, 10, 3, false}, gen);
  check_against_golden(r, "tests/fixtures/golden_resnet34_imagenet.safetensors", 0.0, 1e-10);
}

TEST_CASE("ResNet-50 (ImageNet stem, bottleneck blocks) matches torchvision in float64", "[golden]") {
  Generator gen(0);
  models::ResNet r({models::ResNetDepth::r50, models::ResNetStem::imagenet, 10, 3, false}, gen);
  check_against_golden(r, "tests/fixtures/golden_resnet50_imagenet.safetensors", 0.0, 1e-10);
}

TEST_CASE("a ViT with ViT-B/16's blocks matches timm in float64", "[golden]") {
  models::VitConfig c = models::VitConfig::vit_b16(10);
  c.image_size = 32;  // 2 x 2 patches of 16 plus the class token
  c.depth = 2;
  REQUIRE(c.patch_size == 16);
  REQUIRE(c.dim == 768);
  REQUIRE(c.heads == 12);
  REQUIRE(c.mlp_ratio == 4.0);
  Generator gen(0);
  models::VisionTransformer v(c, gen, std::make_shared<Generator>(1));
  check_against_golden(v, "tests/fixtures/golden_vit_b16_shape.safetensors", 0.1);
}
