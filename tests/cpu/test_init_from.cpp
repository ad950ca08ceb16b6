// model.init_from (train/init_from.h): name mapping from wrapped state dicts, missing and unexpected keys,
// a file the model has no tensor of, classifier re-initialisation, shape errors, and ViT position-embedding resampling against a numpy reference
// of PyTorch's antialiased bicubic interpolation.
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>
#include <map>

#include "hadatrain/core/name_list.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/init_from.h"

using namespace ht;
using train::init_from;

namespace {

std::shared_ptr<models::ResNet> resnet18(int64_t classes, uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<models::ResNet>(
      models::ResNetConfig{models::ResNetDepth::r18, models::ResNetStem::cifar, classes, 3, false}, gen);
}

std::shared_ptr<models::VisionTransformer> vit(int64_t image, int64_t classes, uint64_t seed) {
  models::VitConfig c;
  c.image_size = image;
  c.patch_size = 4;
  c.dim = 16;
  c.depth = 1;
  c.heads = 2;
  c.num_classes = classes;
  Generator gen(seed);
  return std::make_shared<models::VisionTransformer>(c, gen, std::make_shared<Generator>(0));
}

bool has_prefix(const std::vector<std::string>& v, const std::string& p) {
  for (const auto& s : v)
    if (s.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

TEST_CASE("init_from: a wrapped torchvision-named state dict loads every tensor", "[init_from]") {
  auto src = resnet18(10, 1);
  auto dst = resnet18(10, 2);
  std::map<std::string, Tensor> wrapped;
  for (auto& [k, v] : src->state_dict()) wrapped.emplace("module." + k, v);
  wrapped.emplace("module.extra.scale", ones({3}));  // a tensor our model does not have
  const auto stripped = train::strip_wrapper_prefix(std::move(wrapped));
  CHECK(stripped.count("conv1.weight") == 1);
  const train::InitFromReport r = init_from(*dst, stripped, "test");
  CHECK(r.missing.empty());
  CHECK(r.reinitialised.empty());
  REQUIRE(r.unexpected == std::vector<std::string>{"extra.scale"});
  CHECK(r.loaded.size() == src->state_dict().size());
  src->eval();
  dst->eval();
  const Tensor x = test::random_tensor({2, 3, 8, 8}, 5, DType::f32);
  CHECK(test::compare(dst->forward(x), src->forward(x), 0, 0) == "");
}

TEST_CASE("init_from: missing tensors keep their initialisation and are listed", "[init_from]") {
  auto src = resnet18(10, 1);
  auto dst = resnet18(10, 2);
  auto state = src->state_dict();
  state.erase("layer4.1.bn2.running_var");
  const Tensor before = dst->state_dict().at("layer4.1.bn2.running_var").clone();
  const auto r = init_from(*dst, state, "test");
  CHECK(r.missing == std::vector<std::string>{"layer4.1.bn2.running_var"});
  CHECK(test::compare(dst->state_dict().at("layer4.1.bn2.running_var"), before, 0, 0) == "");
  CHECK(test::compare(dst->state_dict().at("layer4.1.bn2.weight"), state.at("layer4.1.bn2.weight"), 0, 0) == "");
  const auto lines = r.lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].find("layer4.1.bn2.running_var") != std::string::npos);
}

TEST_CASE("init_from: a file none of whose tensors the model has is an error", "[init_from]") {
  auto src = resnet18(10, 1);
  auto dst = resnet18(10, 2);
  std::map<std::string, Tensor> prefixed;  // every name under a prefix that is not stripped
  for (const auto& [name, t] : src->state_dict()) prefixed.emplace("backbone." + name, t);
  const Tensor before = dst->state_dict().at("conv1.weight").clone();
  CHECK_THROWS_WITH(init_from(*dst, prefixed, "w.safetensors"),
                    HasSubstr("model.init_from w.safetensors: none of its") &&
                        HasSubstr("is a tensor of the model") && HasSubstr("backbone."));
  CHECK(test::compare(dst->state_dict().at("conv1.weight"), before, 0, 0) == "");
}

TEST_CASE("init_from: a classifier with another class count is re-initialised and reported", "[init_from]") {
  auto src = resnet18(1000, 1);
  auto dst = resnet18(10, 2);
  const Tensor fc_before = dst->state_dict().at("fc.weight").clone();
  const auto r = init_from(*dst, src->state_dict(), "test");
  REQUIRE(r.reinitialised.size() == 2);
  CHECK(r.reinitialised[0] == "fc.bias (1000) -> (10)");
  CHECK(r.reinitialised[1] == "fc.weight (1000, 512) -> (10, 512)");
  CHECK(test::compare(dst->state_dict().at("fc.weight"), fc_before, 0, 0) == "");
  CHECK(test::compare(dst->state_dict().at("layer1.0.conv1.weight"), src->state_dict().at("layer1.0.conv1.weight"), 0, 0) == "");
  CHECK(r.missing.empty());
}

TEST_CASE("init_from: any other shape difference is an error naming the tensor and both shapes", "[init_from]") {
  auto src = resnet18(10, 1);
  Generator gen(3);
  models::ResNet gray({models::ResNetDepth::r18, models::ResNetStem::cifar, 10, 1, false}, gen);  // 1 input channel
  CHECK_THROWS_WITH(init_from(gray, src->state_dict(), "w.safetensors"),
                    HasSubstr("'conv1.weight' has shape (64, 3, 3, 3) in the file and (64, 1, 3, 3) in the model") &&
                        HasSubstr("w.safetensors"));
}

TEST_CASE("init_from: reads a safetensors file or a folder and names what is missing", "[init_from]") {
  test::TempDir dir("init_from");
  auto src = resnet18(10, 1);
  io::TensorList list;
  for (auto& [k, v] : src->state_dict()) list.emplace_back("_orig_mod." + k, v);
  io::save_safetensors(dir.path / "model.safetensors", list);
  auto dst = resnet18(10, 2);
  const auto r = train::init_from_path(*dst, dir.path);  // the folder: model.safetensors inside
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  CHECK(test::compare(dst->state_dict().at("layer3.1.conv2.weight"), src->state_dict().at("layer3.1.conv2.weight"), 0, 0) == "");
  CHECK_THROWS_WITH(train::read_pretrained(dir.path / "nope.safetensors"),
                    HasSubstr("nope.safetensors does not exist") && HasSubstr("docs/reproduction.md"));
  std::filesystem::create_directory(dir.path / "empty");
  CHECK_THROWS_WITH(train::read_pretrained(dir.path / "empty"),
                    HasSubstr("holds neither model.safetensors, model.safetensors.index.json nor step_<N> checkpoints"));
}

// The values of tools/golden's numpy reference (computed with numpy 1.24 from the antialiased bicubic formula):
// pe[t][d] = sin(0.37 (3 t + d) + 0.1) for a class token and a 4x4 grid of 3 channels.
Tensor reference_pos_embed() {
  std::vector<double> v;
  for (int t = 0; t < 17; ++t)
    for (int d = 0; d < 3; ++d) v.push_back(std::sin(0.37 * (3 * t + d) + 0.1));
  return from_vector(v, {1, 17, 3}, {DType::f64});
}

TEST_CASE("resample_pos_embed matches the antialiased bicubic reference when shrinking and growing", "[init_from]") {
  const Tensor pe = reference_pos_embed();
  const Tensor down = train::resample_pos_embed(pe, 1, 4, 4, 2, 2);  // (1, 1 + 4, 3)
  CHECK(test::compare(down, std::vector<double>{0.09983341664682817, 0.4528862853790682, 0.7446431199708594,
                                                0.26277658307645246, 0.3381771564684483, 0.36780703819319743,
                                                0.13951829112189312, 0.006921078918254017, -0.12661286884872128,
                                                -0.2106122242212281, -0.30550288573652423, -0.35904516484620635,
                                                -0.2000710406892402, -0.07482509072560438, 0.060548084247373464},
                      1e-12, 1e-12) == "");
  const Tensor up = train::resample_pos_embed(pe, 1, 4, 4, 6, 6);  // (1, 1 + 36, 3)
  REQUIRE(up.size(1) == 37);
  const std::vector<double> u = up.to_vector<double>();
  const std::vector<double> expected{0.09983341664682817, 0.4528862853790682, 0.7446431199708594,   // token 0
                                     1.0549067605045899,  1.1267440500590398, 1.0460818182332838,   // token 1
                                     0.967393973166343,   0.8353644452597545, 0.5902722585590257,   // token 2
                                     0.5457529007027868,  0.21331768394381995, -0.14798908061844793,  // token 18
                                     -0.9427722716056939, -0.6557992472824844, -0.2800668713329343};  // token 36
  const int tokens[] = {0, 1, 2, 18, 36};
  for (int k = 0; k < 5; ++k)
    for (int d = 0; d < 3; ++d)
      CHECK(std::abs(u[static_cast<std::size_t>(tokens[k] * 3 + d)] - expected[static_cast<std::size_t>(k * 3 + d)]) < 1e-12);
  // The same grid size returns the input.
  CHECK(test::compare(train::resample_pos_embed(pe, 1, 4, 4, 4, 4), pe, 0, 1e-15) == "");
}

TEST_CASE("init_from: a ViT for another image size gets its position embedding resampled", "[init_from]") {
  auto src = vit(16, 10, 1);  // 4x4 grid
  auto dst = vit(8, 10, 2);   // 2x2 grid
  const auto r = init_from(*dst, src->state_dict(), "test");
  REQUIRE(r.resampled.size() == 1);
  CHECK(r.resampled[0] == "pos_embed (1, 17, 16) -> (1, 5, 16) (grid 4x4 -> 2x2)");
  CHECK(r.missing.empty());
  const Tensor expected = train::resample_pos_embed(src->pos_embed, 1, 4, 4, 2, 2);
  CHECK(test::compare(dst->pos_embed, expected, 0, 0) == "");
  // The class token's position is kept as it is.
  CHECK(test::compare(dst->pos_embed.narrow(1, 0, 1), src->pos_embed.narrow(1, 0, 1), 0, 0) == "");
  CHECK(has_prefix(r.loaded, "blocks.0.attn.qkv.weight"));
}

// The lists of tensor names in init_from's and the HF reader's messages, and of files and parameters elsewhere.
TEST_CASE("first_names shows the first names and counts the rest", "[init_from]") {
  const std::vector<std::string> names{"a", "b", "c", "d", "e"};
  CHECK(first_names(names, 3) == "a, b, c and 2 more");
  CHECK(first_names(names, 3, "'") == "'a', 'b', 'c' and 2 more");
  CHECK(first_names(names, 5) == "a, b, c, d, e");
  CHECK(first_names(names, 12) == "a, b, c, d, e");
  CHECK(first_names({}, 3).empty());
}
