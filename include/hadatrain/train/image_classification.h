// Image classification: a model maps image (B, C, H, W) to logits (B, classes); training minimises
// cross-entropy with optional label smoothing against label (B); evaluation reports the mean cross-entropy
// (without smoothing), top-1 and top-5 accuracy, and keeps the checkpoint with the best top-1.
#pragma once
#include <string>
#include <vector>

#include "hadatrain/train/task.h"

namespace ht::train {

struct ImageClassificationOptions {
  DType compute_dtype = DType::f32;  // the image is cast to it before the forward pass
  double label_smoothing = 0.0;      // training loss only
  // The cast also lays the image out channels last ((B, C, H, W) shape, (B, H, W, C) memory: to_dtype_in_order),
  // the layout a channels-last model reads, in the same pass; the model's own layout change is then a view.
  bool channels_last = false;
};

class ImageClassification final : public Task {
 public:
  explicit ImageClassification(ImageClassificationOptions o = {}) : o_(o) {}
  std::string name() const override { return "image classification"; }
  std::vector<std::string> required_keys() const override;
  std::string unit() const override { return "img"; }
  int64_t units(const data::Batch& batch) const override { return batch.size(); }
  bool rows_are_units() const override { return true; }
  Tensor loss(nn::Module& model, const data::Batch& batch) const override;
  // Out-of-range labels on CUDA (cross_entropy's TargetCheck::deferred).
  void check_deferred(Device device) const override;
  // Metrics, in record order: acc (top-1 accuracy), top5, correct (top-1 count), total. Score: top-1.
  std::unique_ptr<Evaluator> evaluator() const override;
  std::string score_name() const override { return "top1"; }
  double initial_score() const override { return -1.0; }

 private:
  ImageClassificationOptions o_;
};

}  // namespace ht::train
