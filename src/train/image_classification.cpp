// Image classification (image_classification.h): the training loss, and evaluation by cross-entropy,
// top-1 and top-5 over the test set.
#include "hadatrain/train/image_classification.h"

#include <cmath>

#include <fmt/format.h>

#include "hadatrain/data/mix.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"

namespace ht::train {
namespace {

// The image (B, C, H, W) in the compute dtype, channels-last memory when the options ask for it.
Tensor model_input(const data::Batch& batch, const ImageClassificationOptions& o) {
  const Tensor& image = batch.at(data::batch_key::image);
  if (o.channels_last && image.dim() == 4) return to_dtype_in_order(image, o.compute_dtype, {0, 2, 3, 1});
  return image.to(o.compute_dtype);
}

class ClassificationEvaluator final : public Evaluator {
 public:
  explicit ClassificationEvaluator(const ImageClassificationOptions& o) : o_(o) {}

  void add(nn::Module& model, const data::Batch& batch) override {
    const Tensor x = model_input(batch, o_);                        // (B, C, H, W)
    const Tensor& y = batch.at(data::batch_key::label);            // (B)
    const Tensor logits = model.forward(x);                         // (B, classes)
    loss_sum_ += cross_entropy(logits, y, {.reduction = Reduction::sum}).item();
    const std::vector<float> l = logits.to_vector<float>();
    const std::vector<int64_t> labels = y.to_vector<int64_t>();
    const int64_t classes = logits.size(1);
    for (std::size_t i = 0; i < labels.size(); ++i) {
      const float* row = l.data() + i * static_cast<std::size_t>(classes);
      const int64_t label = labels[i];
      const float target = row[label];
      // Classes ranked above the target; ties go to the lower class index, as argmax/topk pick them (with
      // "ties count for the target", a model with constant logits would score 100%). A NaN target ranks last.
      int64_t above = std::isnan(target) ? classes : 0;
      for (int64_t c = 0; c < classes && !std::isnan(target); ++c)
        above += row[c] > target || (row[c] == target && c < label) ? 1 : 0;
      correct_ += above == 0 ? 1 : 0;
      correct_top5_ += above < 5 ? 1 : 0;
    }
    total_ += batch.size();
  }

  EvalResult result() const override {
    auto share = [&](int64_t n) { return total_ ? static_cast<double>(n) / static_cast<double>(total_) : 0.0; };
    EvalResult r;
    r.loss = total_ ? loss_sum_ / static_cast<double>(total_) : 0.0;
    r.total = total_;
    r.score = share(correct_);
    r.metrics = {{"acc", share(correct_)}, {"top5", share(correct_top5_)}, {"correct", correct_}, {"total", total_}};
    r.summary = fmt::format("test loss {:.4f}, top-1 {:.2f}%, top-5 {:.2f}%", r.loss, 100 * share(correct_),
                            100 * share(correct_top5_));
    return r;
  }

  std::vector<double> sums() const override {
    return {loss_sum_, static_cast<double>(correct_), static_cast<double>(correct_top5_), static_cast<double>(total_)};
  }
  void set_sums(const std::vector<double>& s) override {
    HT_ASSERT(s.size() == 4, "classification evaluator: {} sums, expected 4", s.size());
    loss_sum_ = s[0];
    correct_ = static_cast<int64_t>(s[1]);
    correct_top5_ = static_cast<int64_t>(s[2]);
    total_ = static_cast<int64_t>(s[3]);
  }

 private:
  ImageClassificationOptions o_;
  double loss_sum_ = 0.0;
  int64_t correct_ = 0, correct_top5_ = 0, total_ = 0;
};

}  // namespace

std::vector<std::string> ImageClassification::required_keys() const {
  return {std::string(data::batch_key::image), std::string(data::batch_key::label)};
}

Tensor ImageClassification::loss(nn::Module& model, const data::Batch& batch) const {
  CrossEntropyOptions ce;
  ce.label_smoothing = o_.label_smoothing;
  // Targets are checked on the device and read back with the losses (check_deferred): the loss never waits
  // for the device, and a step that computes it can be recorded into a step graph.
  ce.target_check = TargetCheck::deferred;
  const Tensor x = model_input(batch, o_);  // (B, C, H, W)
  const Tensor logits = model.forward(x);    // (B, classes)
  if (batch.has(data::batch_key::soft_target)) {
    // Soft targets (Mixup/CutMix, data/mix.h; smoothing already in them): mean_b sum_c -t_bc log_softmax(z)_bc,
    // composed of differentiable ops with no host read, so a step graph can record it.
    const Tensor& t = batch.at(data::batch_key::soft_target);  // (B, classes) f32
    HT_CHECK(t.dim() == 2 && t.size(0) == logits.size(0) && t.size(1) == logits.size(1),
             "image classification: soft_target is {} but the logits are {}", t.describe(), logits.describe());
    const Tensor logp = log_softmax(logits.to(DType::f32), 1);
    return mean(neg(sum(mul(t, logp), {1})));
  }
  return cross_entropy(logits, batch.at(data::batch_key::label), ce);
}

void ImageClassification::check_deferred(Device device) const { check_deferred_targets(device); }

std::unique_ptr<Evaluator> ImageClassification::evaluator() const {
  return std::make_unique<ClassificationEvaluator>(o_);
}

}  // namespace ht::train
