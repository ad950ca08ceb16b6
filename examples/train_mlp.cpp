// Trains a small MLP in code, without a YAML config: a synthetic image dataset, the data loader (batches of
// named tensors "image" and "label"), the image-classification task, AdamW and a hand-written loop, then an
// evaluation of the test split through the task. Exits 1 unless the loss fell and the test accuracy is far
// above chance, so CTest notices when training stops working.
//
// The data: 8x8 grey images of 4 classes; class k is a bright band over rows 2k and 2k+1 on a noisy
// background. The noise comes from the sample's own random stream, so every run sees the same images.
#include <cstdio>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "hadatrain/data/dataset.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/optim/optimizer.h"
#include "hadatrain/train/image_classification.h"
#include "hadatrain/train/task.h"

using namespace ht;

namespace {

constexpr int64_t kSide = 8, kClasses = 4;

class Bands final : public data::Dataset {
 public:
  explicit Bands(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  data::Sample get(int64_t index, data::SampleRng& rng) const override {
    const int64_t label = index % kClasses;
    data::Image img = data::Image::zeros(kSide, kSide, 1, data::ImageLayout::chw);
    for (int64_t y = 0; y < kSide; ++y)
      for (int64_t x = 0; x < kSide; ++x) {
        const float band = y / 2 == label ? 150.0f : 40.0f;
        img.at(0, y, x) = static_cast<uint8_t>(band + rng.uniform(0.0f, 100.0f));
      }
    return {img, label};
  }

 private:
  int64_t n_;
};

data::LoaderOptions loader_options(uint64_t seed, data::Shuffle shuffle) {
  data::LoaderOptions o;
  o.batch_size = 32;
  o.num_workers = 0;
  o.seed = seed;  // the train and test splits draw different noise
  o.shuffle = shuffle;
  o.normalize = {{0.5f}, {0.25f}};
  return o;
}

}  // namespace

int main() {
  const Device device = Device::cpu();
  data::DataLoader train_loader(std::make_shared<Bands>(512), loader_options(1, data::Shuffle::on));
  data::DataLoader test_loader(std::make_shared<Bands>(256), loader_options(2, data::Shuffle::off));

  Generator gen(0);
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Flatten>(1));  // (B, 1, 8, 8) -> (B, 64)
  model.push_back(std::make_shared<nn::Linear>(kSide * kSide, 32, nn::Bias::yes, gen));
  model.push_back(std::make_shared<nn::Activation>(nn::ActivationKind::relu));
  model.push_back(std::make_shared<nn::Linear>(32, kClasses, nn::Bias::yes, gen));
  auto optimizer = optim::make_adamw(optim::make_param_refs(model.named_parameters()), {.weight_decay = 0.0});

  const train::ImageClassification task;
  const int epochs = 3;
  std::vector<double> epoch_loss;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double sum = 0.0;
    int64_t steps = 0;
    while (const auto batch = train_loader.next()) {  // batch->at("image") (32, 1, 8, 8), at("label") (32)
      task.check_batch(*batch);
      optimizer->zero_grad();
      const Tensor loss = task.loss(model, batch->to(device));
      loss.backward();
      optimizer->step(1e-2);
      sum += loss.item();
      ++steps;
    }
    epoch_loss.push_back(sum / static_cast<double>(steps));
    fmt::print("epoch {}: mean training loss {:.4f} over {} steps\n", epoch + 1, epoch_loss.back(), steps);
  }

  const train::EvalResult r = train::evaluate(model, task, test_loader, device);
  fmt::print("{} ({} test images)\n", r.summary, r.total);

  bool ok = true;
  if (!(epoch_loss.back() < 0.5 * epoch_loss.front())) {
    fmt::print(stderr, "FAIL: the training loss went from {:.4f} to {:.4f}; expected it to halve at least\n",
               epoch_loss.front(), epoch_loss.back());
    ok = false;
  }
  if (!(r.number("acc") > 0.9)) {
    fmt::print(stderr, "FAIL: test accuracy {:.2f}%, expected more than 90% (chance is 25%)\n", 100 * r.number("acc"));
    ok = false;
  }
  return ok ? 0 : 1;
}
