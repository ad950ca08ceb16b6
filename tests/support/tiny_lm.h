// A tiny causal language model for task and trainer tests: logits = fc(dropout(tanh(embed[ids]))), each position
// on its own (no attention), so expected losses can be computed by hand. ids (B, T) -> logits (B, T, V).
#pragma once
#include <memory>

#include "hadatrain/nn/layers.h"
#include "hadatrain/ops/ops.h"

namespace ht::test {

class TinyLm final : public nn::Module {
 public:
  TinyLm(int64_t vocab, int64_t dim, Generator& init, std::shared_ptr<Generator> drop, double p = 0.0) {
    embed = uniform({vocab, dim}, -1.0, 1.0, init);
    register_parameter("embed", &embed);
    fc = register_module("fc", std::make_shared<nn::Linear>(dim, vocab, nn::Bias::yes, init));
    drop_ = register_module("drop", std::make_shared<nn::Dropout>(p, std::move(drop)));
  }
  std::string type_name() const override { return "TinyLm"; }
  Tensor forward(const Tensor& ids) override {
    return fc->forward(drop_->forward(tanh(embedding(materialise(embed), ids))));
  }
  Tensor embed;  // (V, D)
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Dropout> drop_;
};

}  // namespace ht::test
