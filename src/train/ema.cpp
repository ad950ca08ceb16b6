// The weight average (Note [Weight EMA] in ema.h).
#include "ema.h"

#include <fmt/format.h>

#include "hadatrain/core/error.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/tensor/dtype.h"

namespace ht::train {

WeightEma::WeightEma(nn::Module& model, const EmaSection& cfg) : cfg_(cfg) {
  for (auto& [name, slot] : model.named_parameters())
    if (slot->defined() && slot->requires_grad()) entries_.push_back({name, slot, clone(slot->detach())});
  for (auto& [name, slot] : model.named_buffers())
    if (slot->defined()) entries_.push_back({name, slot, clone(slot->detach())});
  HT_CHECK(!entries_.empty(), "ema: the model has no trained parameter or buffer to average");
}

void WeightEma::copy_weights() {
  for (Entry& e : entries_) copy_(e.average, e.weight->detach());
}

void WeightEma::restart() {
  copy_weights();
  updates_ = 0;
}

void WeightEma::after_step(int64_t step, bool in_warmup) {
  if (step % cfg_.every_steps != 0) return;
  if (updates_ == 0) {
    copy_weights();
  } else {
    for (Entry& e : entries_) {
      const Tensor w = e.weight->detach();
      if (!is_floating(e.average.dtype())) {
        copy_(e.average, w);
        continue;
      }
      mul_(e.average, cfg_.decay);
      add_(e.average, w, 1.0 - cfg_.decay);
    }
  }
  updates_ = cfg_.restart_during_warmup && in_warmup ? 0 : updates_ + 1;
}

std::map<std::string, Tensor> WeightEma::tensors() const {
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries_) out.emplace(e.name, e.average);
  return out;
}

void WeightEma::load(const std::map<std::string, Tensor>& t, int64_t updates, const std::string& where) {
  for (const Entry& e : entries_) {
    const auto it = t.find(e.name);
    HT_CHECK(it != t.end(), "{}: the weight average has no tensor '{}' (this run averages {} tensors)", where, e.name,
             entries_.size());
    HT_CHECK(it->second.shape() == e.average.shape(), "{}: the weight average's '{}' is {}, the model's is {}", where,
             e.name, it->second.describe(), e.average.describe());
  }
  HT_CHECK(t.size() == entries_.size(),
           "{}: the weight average holds {} tensors, this run averages {} (a different model, or other frozen "
           "parameters: train.freeze)",
           where, t.size(), entries_.size());
  for (Entry& e : entries_) copy_(e.average, t.at(e.name));
  updates_ = updates;
}

std::vector<Tensor> WeightEma::swap_in() {
  std::vector<Tensor> saved;
  saved.reserve(entries_.size());
  for (Entry& e : entries_) {
    const Tensor w = e.weight->detach();
    saved.push_back(clone(w));
    copy_(w, e.average);
  }
  return saved;
}

void WeightEma::restore(const std::vector<Tensor>& saved) {
  for (std::size_t i = 0; i < saved.size(); ++i) copy_(entries_[i].weight->detach(), saved[i]);
}

}  // namespace ht::train
