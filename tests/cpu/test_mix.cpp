// Mixup / CutMix (data/mix.h) against timm's formulas worked by hand, the Beta draws' moments, determinism by
// batch position, and the soft-target loss of image classification against cross_entropy with smoothing.
#include "support/catch.h"
#include "support/testing.h"

#include <cmath>

#include "hadatrain/data/mix.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/tensor/factory.h"
#include "hadatrain/train/image_classification.h"

using namespace ht;
using namespace ht::data;

namespace {
Tensor images(int64_t b, int64_t c, int64_t h, int64_t w) {
  std::vector<float> v;
  for (int64_t k = 0; k < b * c * h * w; ++k) v.push_back(std::sin(0.1f * static_cast<float>(k)) + 0.01f * static_cast<float>(k));
  return from_vector(v, {b, c, h, w});
}
}  // namespace

TEST_CASE("mixup mixes each row with its mirror and mixes smoothed one-hot targets", "[mix]") {
  Tensor x = images(3, 1, 2, 2);
  const Tensor orig = x.clone();
  const double lam = 0.7;
  const Tensor t = apply_mix(x, {0, 1, 2}, {MixDraw{lam}}, 4, 0.1);
  const auto o = orig.to_vector<float>(), m = x.to_vector<float>();
  const float a = 0.7f, b = static_cast<float>(1.0 - lam);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k) {
      const float own = o[static_cast<std::size_t>(i * 4 + k)] * a, other = o[static_cast<std::size_t>((2 - i) * 4 + k)] * b;
      CHECK(m[static_cast<std::size_t>(i * 4 + k)] == own + other);
    }
  // off = 0.1 / 4 = 0.025, on = 0.925; row 0: label 0 with weight 0.7, label 2 with weight 0.3.
  const auto tv = t.to_vector<float>();
  CHECK(tv[0] == Approx(0.925 * 0.7 + 0.025 * 0.3).epsilon(1e-6));
  CHECK(tv[1] == Approx(0.025).epsilon(1e-6));
  CHECK(tv[2] == Approx(0.025 * 0.7 + 0.925 * 0.3).epsilon(1e-6));
  CHECK(tv[5] == Approx(0.925).epsilon(1e-6));  // the middle row of an odd batch mixes with itself
  for (int i = 0; i < 3; ++i) CHECK(tv[i * 4] + tv[i * 4 + 1] + tv[i * 4 + 2] + tv[i * 4 + 3] == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("cutmix box follows timm's rand_bbox and corrects lam to the pasted area", "[mix]") {
  // lam 0.75: cut = int(8 * sqrt(0.25)) = 4; centre (1, 6): rows clip(1 -+ 2) = [0, 3), columns [4, 8).
  const MixDraw d = cutmix_box(0.75, 1, 6, 8, 8, true);
  CHECK(d.y0 == 0);
  CHECK(d.y1 == 3);
  CHECK(d.x0 == 4);
  CHECK(d.x1 == 8);
  CHECK(d.lam == 1.0 - 12.0 / 64.0);
  CHECK(cutmix_box(0.75, 1, 6, 8, 8, false).lam == 0.75);
  Tensor x = images(2, 2, 8, 8);
  const Tensor orig = x.clone();
  apply_mix(x, {0, 1}, {d}, 2, 0.0);
  const auto o = orig.to_vector<float>(), m = x.to_vector<float>();
  for (int i = 0; i < 2; ++i)
    for (int c = 0; c < 2; ++c)
      for (int y = 0; y < 8; ++y)
        for (int xx = 0; xx < 8; ++xx) {
          const bool inside = y < 3 && xx >= 4;
          const int src = inside ? 1 - i : i;
          CHECK(m[static_cast<std::size_t>(((i * 2 + c) * 8 + y) * 8 + xx)] ==
                o[static_cast<std::size_t>(((src * 2 + c) * 8 + y) * 8 + xx)]);
        }
}

TEST_CASE("Beta draws have the Beta(a, a) mean and variance", "[mix]") {
  for (const double a : {0.8, 1.0, 2.0}) {
    SampleRng rng(7, data_stream(RngPurpose::mix, 0, 0));
    const int n = 20000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; ++i) {
      const double v = sample_beta(a, rng);
      REQUIRE(v > 0.0);
      REQUIRE(v < 1.0);
      s += v;
      s2 += v * v;
    }
    const double mean = s / n, var = s2 / n - mean * mean;
    INFO("alpha " << a);
    CHECK(std::abs(mean - 0.5) < 0.01);
    CHECK(std::abs(var - 1.0 / (4.0 * (2.0 * a + 1.0))) < 0.004);
  }
}

TEST_CASE("mix_batch draws from the batch's position only", "[mix]") {
  MixOptions o;
  o.num_classes = 10;
  o.seed = 3;
  auto make = [](int64_t batch_index) {
    Batch b;
    b.set(batch_key::image, images(4, 1, 6, 6));
    b.set(batch_key::label, from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}, {DType::i64}));
    b.position = {2, batch_index};
    return b;
  };
  Batch a = make(5), b = make(5), c = make(6);
  mix_batch(a, o);
  mix_batch(b, o);
  mix_batch(c, o);
  CHECK(test::compare(a.at(batch_key::image), b.at(batch_key::image), 0, 0) == "");
  CHECK(test::compare(a.at(batch_key::soft_target), b.at(batch_key::soft_target), 0, 0) == "");
  CHECK(test::compare(a.at(batch_key::soft_target), c.at(batch_key::soft_target), 0, 0) != "");
  o.prob = 0.0;  // never mixed: the images stay, targets are the smoothed one-hot rows
  Batch d = make(5);
  mix_batch(d, o);
  CHECK(test::compare(d.at(batch_key::image), images(4, 1, 6, 6), 0, 0) == "");
  CHECK(d.at(batch_key::soft_target).to_vector<float>()[1] == Approx(0.91).epsilon(1e-6));
}

TEST_CASE("image classification uses soft-target cross-entropy when the batch has soft targets", "[mix]") {
  Generator gen(1);
  auto model = std::make_shared<nn::Linear>(4, 3, nn::Bias::yes, gen);
  const train::ImageClassification task({.compute_dtype = DType::f32, .label_smoothing = 0.0});
  Batch b;
  const Tensor x = test::random_tensor({5, 4}, 2, DType::f32);
  const Tensor y = from_vector(std::vector<int64_t>{0, 2, 1, 1, 0}, {5}, {DType::i64});
  b.set(batch_key::image, x);
  b.set(batch_key::label, y);
  Tensor img = from_vector(std::vector<float>(5, 0.f), {5, 1, 1, 1});
  // Unmixed soft targets with smoothing 0.1 are cross_entropy with label_smoothing 0.1.
  b.set(batch_key::soft_target, apply_mix(img, {0, 2, 1, 1, 0}, {MixDraw{}}, 3, 0.1));
  const double soft = task.loss(*model, b).item();
  const double ref = cross_entropy(model->forward(x), y, {.label_smoothing = 0.1}).item();
  CHECK(soft == Approx(ref).epsilon(1e-6));
}
