// model.init_from against the libraries themselves, and Mixup/CutMix against timm: fixtures written by
// tools/golden/timm_init_from.py on the GPU machine (tests/fixtures/init_from_*, mix_timm.safetensors).
//   - a tiny timm ViT's own safetensors file loads with no missing or unexpected tensor and gives timm's logits;
//     loaded into a ViT for half the image size, its position embedding equals timm's resample_abs_pos_embed and
//     the logits equal timm's model at that size;
//   - torchvision resnet18: a file with exactly its state dict's names, dtypes and shapes (from the fixture's
//     metadata), filled by the closed formula the script used, loads completely and gives torchvision's logits;
//   - timm's Mixup: with the draws timm made, apply_mix gives timm's mixed images and soft targets.
// HT_FIXTURES: init_from_timm_vit_io.safetensors init_from_timm_vit.safetensors init_from_torchvision_resnet18.safetensors mix_timm.safetensors
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "hadatrain/data/mix.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/init_from.h"

using namespace ht;

namespace {

io::SafetensorsContents fixture(const std::string& name) {
  const std::string path = "tests/fixtures/" + name;
  if (!std::filesystem::exists(path))
    FAIL("fixture missing: " << path << "; run `python3 tools/golden/timm_init_from.py tests/fixtures` on a machine "
                                        "with torch, timm and torchvision, then commit the files it writes");
  return io::load_safetensors(path);
}

// tools/golden/timm_init_from.py's formula().
Tensor formula(const std::string& name, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  int64_t acc = 0;
  for (std::size_t k = 0; k < name.size(); ++k) acc += static_cast<int64_t>(k + 1) * static_cast<unsigned char>(name[k]);
  const double phase = static_cast<double>(acc % 1000) / 100.0;
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double s = std::sin(0.37 * static_cast<double>(i) + phase);
    double x;
    if (ends("running_var")) x = 1.0 + 0.5 * std::abs(s);
    else if (ends("running_mean") || ends("bias")) x = 0.1 * s;
    else if (shape.size() >= 2) x = s / std::sqrt(static_cast<double>(n / shape[0]));
    else x = 1.0 + 0.2 * s;
    v[static_cast<std::size_t>(i)] = x;
  }
  return from_vector(v, shape, {DType::f64});
}

std::shared_ptr<models::VisionTransformer> timm_tiny_vit(int64_t image) {
  models::VitConfig c;
  c.image_size = image;
  c.patch_size = 4;
  c.dim = 32;
  c.depth = 2;
  c.heads = 4;
  c.num_classes = 10;
  Generator gen(5);
  return std::make_shared<models::VisionTransformer>(c, gen, std::make_shared<Generator>(0));
}

}  // namespace

TEST_CASE("init_from a timm ViT file: every tensor by name, timm's logits, timm's pos-embed resampling", "[golden][init_from]") {
  const auto io = fixture("init_from_timm_vit_io.safetensors");
  const std::string weights = "tests/fixtures/init_from_timm_vit.safetensors";
  auto v16 = timm_tiny_vit(16);
  const auto r = train::init_from_path(*v16, weights);
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  CHECK(r.resampled.empty());
  v16->eval();
  CHECK(test::compare(v16->forward(io.at("x16")), io.at("logits16"), 1e-4, 1e-5) == "");

  auto v8 = timm_tiny_vit(8);
  const auto r8 = train::init_from_path(*v8, weights);
  REQUIRE(r8.resampled.size() == 1);
  CHECK(test::compare(v8->pos_embed, io.at("pos_embed8"), 1e-5, 1e-6) == "");
  v8->eval();
  CHECK(test::compare(v8->forward(io.at("x8")), io.at("logits8"), 1e-4, 1e-5) == "");
}

TEST_CASE("init_from a torchvision resnet18 state dict: complete load and torchvision's logits", "[golden][init_from]") {
  const auto f = fixture("init_from_torchvision_resnet18.safetensors");
  const auto entries = nlohmann::json::parse(f.metadata.at("state_dict"));
  io::TensorList state;
  for (const auto& e : entries) {
    const std::string name = e[0], dtype = e[1];
    Shape shape;
    for (const auto& d : e[2]) shape.push_back(d.get<int64_t>());
    if (dtype == "float32") state.emplace_back(name, formula(name, shape).to(DType::f32));
    else if (dtype == "int64") state.emplace_back(name, zeros(shape, {DType::i64}));
    else FAIL("unexpected dtype " << dtype << " for " << name);
  }
  test::TempDir dir("tv_resnet18");
  io::save_safetensors(dir.path / "resnet18.safetensors", state);
  Generator gen(9);
  models::ResNet r({models::ResNetDepth::r18, models::ResNetStem::imagenet, 10, 3, false}, gen);
  const auto rep = train::init_from_path(r, dir.path / "resnet18.safetensors");
  CHECK(rep.missing.empty());
  CHECK(rep.unexpected.empty());
  CHECK(rep.loaded.size() == entries.size());
  r.to(DType::f64);
  r.eval();
  CHECK(test::compare(r.forward(f.at("x")), f.at("logits"), 1e-9, 1e-9) == "");
}

TEST_CASE("Mixup/CutMix with timm's draws give timm's images and soft targets", "[golden][mix]") {
  const auto f = fixture("mix_timm.safetensors");
  const std::vector<int64_t> labels = f.at("y").to_vector<int64_t>();
  for (int k = 0; k < 4; ++k) {
    INFO("case " << k);
    const std::string c = "case" + std::to_string(k) + ".";
    const std::vector<double> d = f.at(c + "draw").to_vector<double>();
    data::MixDraw draw;
    draw.lam = d[0];
    draw.cutmix = d[1] != 0.0 && d[0] != 1.0;
    draw.y0 = static_cast<int64_t>(d[2]);
    draw.y1 = static_cast<int64_t>(d[3]);
    draw.x0 = static_cast<int64_t>(d[4]);
    draw.x1 = static_cast<int64_t>(d[5]);
    Tensor x = f.at("x").clone();
    const Tensor t = data::apply_mix(x, labels, {draw}, 5, f.at(c + "smoothing").item());
    CHECK(test::compare(x, f.at(c + "x"), 0, 1e-6) == "");
    CHECK(test::compare(t, f.at(c + "target"), 0, 1e-6) == "");
  }
}
