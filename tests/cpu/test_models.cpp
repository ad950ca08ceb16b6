// nn modules and models: parameter names and counts match torchvision/timm, forward shapes, state dicts,
// train/eval behaviour and a gradient flowing to every parameter.
#include "support/catch.h"
#include "support/testing.h"

#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"

using namespace ht;
using namespace ht::models;

TEST_CASE("ResNet parameter names and counts match torchvision", "[models]") {
  Generator gen(1);
  ResNet r18({ResNetDepth::r18, ResNetStem::imagenet, 1000, 3, false}, gen);
  CHECK(r18.num_parameters() == 11689512);
  ResNet r34({ResNetDepth::r34, ResNetStem::imagenet, 1000, 3, false}, gen);
  CHECK(r34.num_parameters() == 21797672);
  ResNet r50({ResNetDepth::r50, ResNetStem::imagenet, 1000, 3, false}, gen);
  CHECK(r50.num_parameters() == 25557032);
  ResNet c18({ResNetDepth::r18, ResNetStem::cifar, 10, 3, false}, gen);
  CHECK(c18.num_parameters() == 11689512 - 64 * 3 * (49 - 9) - 512 * 990 - 990);
  auto sd = r50.state_dict();
  for (const char* k : {"conv1.weight", "bn1.running_var", "layer1.0.downsample.0.weight", "layer4.2.bn3.bias",
                        "layer3.5.conv2.weight", "fc.bias", "bn1.num_batches_tracked"})
    CHECK(sd.count(k) == 1);
  CHECK(sd.size() == 320);  // 161 parameters + 159 buffers (53 BNs x 3)
}

TEST_CASE("ViT parameter names and counts match timm", "[models]") {
  Generator gen(2);
  auto dgen = std::make_shared<Generator>(3);
  VisionTransformer b16(VitConfig::vit_b16(1000), gen, dgen);
  CHECK(b16.num_parameters() == 86567656);
  auto sd = b16.state_dict();
  for (const char* k : {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.11.attn.qkv.weight",
                        "blocks.0.mlp.fc2.bias", "blocks.3.norm2.weight", "norm.weight", "head.weight"})
    CHECK(sd.count(k) == 1);
  VitConfig mean_pool = VitConfig::vit_s4(100);
  mean_pool.pool = VitPool::mean;
  mean_pool.depth = 2;
  VisionTransformer small(mean_pool, gen, dgen);
  CHECK(small.state_dict().count("fc_norm.weight") == 1);
  CHECK(small.state_dict().count("cls_token") == 0);
  CHECK(small.pos_embed.shape() == Shape{1, 64, 384});
}

TEST_CASE("init statistics follow the torchvision/timm recipes", "[models]") {
  Generator gen(4);
  ResNet r({ResNetDepth::r18, ResNetStem::cifar, 10, 3, false}, gen);
  auto sd = r.state_dict();
  const Tensor w = sd["layer2.0.conv2.weight"];  // (128, 128, 3, 3): std sqrt(2 / (128 * 9))
  const double sd_w = std::sqrt(var(w.to(DType::f64), {0, 1, 2, 3}).item());
  CHECK(sd_w == Approx(std::sqrt(2.0 / (128 * 9))).epsilon(0.03));
  CHECK(sd["layer2.0.bn2.weight"].to_vector<double>()[5] == 1.0);
  const Tensor fc = sd["fc.weight"];  // U(-1/sqrt(512), 1/sqrt(512))
  CHECK(max(abs(fc)).item() <= 1.0 / std::sqrt(512.0));
  VitConfig c = VitConfig::vit_s4(10);
  c.depth = 1;
  auto dgen = std::make_shared<Generator>(3);
  VisionTransformer v(c, gen, dgen);
  const Tensor q = v.state_dict()["blocks.0.attn.qkv.weight"];
  CHECK(std::sqrt(var(q.to(DType::f64), {0, 1}).item()) == Approx(0.02).epsilon(0.05));
  CHECK(max(abs(q)).item() <= 2.0);
}

TEST_CASE("small ResNet and ViT run forward/backward with a gradient for every parameter", "[models]") {
  Generator gen(5);
  ResNet r({ResNetDepth::r18, ResNetStem::cifar, 10, 1, false}, gen);
  Tensor x = test::random_tensor({2, 1, 8, 8}, 6, DType::f32);
  Tensor logits = r.forward(x);
  CHECK(logits.shape() == Shape{2, 10});
  cross_entropy(logits, from_vector(std::vector<int64_t>{3, 7}, {2}, {DType::i64})).backward();
  for (auto& [n, p] : r.named_parameters()) {
    INFO(n);
    REQUIRE(p->grad().defined());
    CHECK(p->grad().shape() == p->shape());
  }
  CHECK(r.state_dict()["bn1.num_batches_tracked"].item() == 1);
  // eval mode uses running statistics: the same input twice gives identical outputs, independent of batch.
  r.eval();
  const auto a = r.forward(x).to_vector<double>();
  const auto b = r.forward(narrow(x, 0, 0, 1)).to_vector<double>();
  for (int k = 0; k < 10; ++k) CHECK(a[k] == Approx(b[k]).epsilon(1e-4).margin(1e-5));

  VitConfig c = VitConfig::vit_s4(5);
  c.image_size = 8;
  c.dim = 32;
  c.heads = 4;
  c.depth = 2;
  auto dgen = std::make_shared<Generator>(3);
  VisionTransformer v(c, gen, dgen);
  Tensor y = v.forward(test::random_tensor({3, 3, 8, 8}, 7, DType::f32));
  CHECK(y.shape() == Shape{3, 5});
  sum(y).backward();
  for (auto& [n, p] : v.named_parameters()) {
    INFO(n);
    REQUIRE(p->grad().defined());
  }
  // A bf16 forward stays bf16 to the logits with f32 master parameters (the class token and position
  // embedding are cast like the weights; a promoting cat/add would run every block in f32), and the
  // master gradients stay f32.
  v.zero_grad();
  const Tensor yb = v.forward(test::random_tensor({3, 3, 8, 8}, 7, DType::f32).to(DType::bf16));
  CHECK(yb.dtype() == DType::bf16);
  sum(yb).backward();
  CHECK(v.cls_token.grad().dtype() == DType::f32);
  CHECK(v.pos_embed.grad().dtype() == DType::f32);
}

TEST_CASE("state dicts round trip and strict loading names what is wrong", "[models]") {
  Generator g1(1), g2(2);
  ResNet a({ResNetDepth::r18, ResNetStem::cifar, 10, 3, false}, g1);
  ResNet b({ResNetDepth::r18, ResNetStem::cifar, 10, 3, false}, g2);
  b.load_state_dict(a.state_dict());
  CHECK(b.state_dict()["layer3.1.conv1.weight"].to_vector<double>() ==
        a.state_dict()["layer3.1.conv1.weight"].to_vector<double>());
  auto sd = a.state_dict();
  sd.erase("fc.bias");
  sd["extra.weight"] = zeros({1});
  CHECK_THROWS_WITH(b.load_state_dict(sd), HasSubstr("missing keys [fc.bias]") &&
                                               HasSubstr("unexpected keys [extra.weight]"));
  auto bad = a.state_dict();
  bad["fc.weight"] = zeros({3, 3});
  CHECK_THROWS_WITH(b.load_state_dict(bad), HasSubstr("fc.weight"));
}

TEST_CASE("ViT in eval mode applies no dropout, the position-embedding dropout included", "[models]") {
  Generator gen(11);
  auto dgen = std::make_shared<Generator>(12);
  VitConfig c{.image_size = 8, .patch_size = 4, .in_channels = 1, .dim = 16, .depth = 1, .heads = 2,
              .num_classes = 3, .dropout = 0.5};
  VisionTransformer v(c, gen, dgen);
  const Tensor x = test::random_tensor({2, 1, 8, 8}, 13, DType::f32);
  v.eval();
  NoGradGuard ng;
  const Tensor a = v.forward(x), b = v.forward(x);
  CHECK(test::compare(a, b, 0.0, 0.0) == "");
  v.train();
  const Tensor t1 = v.forward(x), t2 = v.forward(x);
  CHECK(test::compare(t1, t2, 0.0, 0.0) != "");  // train mode draws fresh masks
}

TEST_CASE("ViT drop_path: block i drops with drop_path * i / (depth - 1), only in train mode", "[models]") {
  Generator gen(11);
  auto dgen = std::make_shared<Generator>(12);
  VitConfig c{.image_size = 8, .patch_size = 4, .in_channels = 1, .dim = 16, .depth = 3, .heads = 2,
              .num_classes = 3, .drop_path = 0.4};
  VisionTransformer v(c, gen, dgen);
  std::vector<double> rates;
  for (auto& [name, m] : v.named_modules())
    if (auto* d = dynamic_cast<nn::DropPath*>(m)) {
      rates.push_back(d->p);
      CHECK(name.find(".drop_path") != std::string::npos);
    }
  CHECK(rates == std::vector<double>{0.0, 0.0, 0.2, 0.2, 0.4, 0.4});  // drop_path1 and drop_path2 of each block
  // No parameters of its own: the same names and count as without it (timm's state dict).
  Generator gen0(11);
  VitConfig c0 = c;
  c0.drop_path = 0.0;
  VisionTransformer plain(c0, gen0, std::make_shared<Generator>(12));
  CHECK(v.state_dict().size() == plain.state_dict().size());
  const Tensor x = test::random_tensor({64, 1, 8, 8}, 13, DType::f32);
  NoGradGuard ng;
  v.eval();
  plain.eval();
  CHECK(test::compare(v.forward(x), plain.forward(x), 0.0, 0.0) == "");  // same weights, nothing dropped
  v.train();
  plain.train();
  const Tensor dropped = v.forward(x), kept = plain.forward(x);
  CHECK(dgen->state() == 4);  // two draws in each of the two blocks with a rate above 0
  // Some samples lose a branch (their logits change), others keep every branch scaled.
  CHECK(test::compare(dropped, kept, 0.0, 0.0) != "");
  CHECK_THROWS_WITH(VisionTransformer(VitConfig{.drop_path = 1.0}, gen, dgen),
                    HasSubstr("drop_path must be in [0, 1)"));
}

TEST_CASE("vit_layer_id groups a ViT's parameters as timm's layer decay does", "[models]") {
  Generator gen(1);
  VisionTransformer v(VitConfig{.image_size = 8, .patch_size = 4, .in_channels = 1, .dim = 16, .depth = 3, .heads = 2,
                                .num_classes = 3},
                      gen, std::make_shared<Generator>(2));
  std::map<int64_t, int> per_layer;
  for (const auto& [name, t] : v.named_parameters()) {
    const int64_t id = vit_layer_id(name, 3);
    ++per_layer[id];
    if (name.rfind("blocks.1.", 0) == 0) CHECK(id == 2);
  }
  CHECK(vit_layer_id("patch_embed.proj.weight", 3) == 0);
  CHECK(vit_layer_id("cls_token", 3) == 0);
  CHECK(vit_layer_id("pos_embed", 3) == 0);
  CHECK(vit_layer_id("blocks.0.attn.qkv.weight", 3) == 1);
  CHECK(vit_layer_id("blocks.2.mlp.fc2.bias", 3) == 3);
  CHECK(vit_layer_id("norm.weight", 3) == 4);
  CHECK(vit_layer_id("head.bias", 3) == 4);
  CHECK(per_layer.size() == 5);  // the stem, three blocks, the norm and head
  CHECK(per_layer[0] == 4);      // patch_embed.proj weight and bias, cls_token, pos_embed
}
