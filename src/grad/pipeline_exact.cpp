// The `exact` pipeline: the forward dtype's products with fp32 accumulation, saving x. Models use the
// plain linear / conv2d ops for exact layers (same math, fused bias, cuDNN); this class is the reference
// the other pipelines are measured against (inspect-grads, tests).
#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/grad/registry.h"
#include "pipeline_helpers.h"

namespace ht::grad {
namespace {

struct ExactSaved final : SavedState {
  SavedTensor x;  // counted on its storage: a later pipeline reading x need not copy it (Note [Shared saved inputs])
  Tensor w;
};

class ExactPipeline final : public Pipeline {
 public:
  std::string name() const override { return "exact"; }
  bool exact_backward() const override { return true; }

  ForwardResult forward(const Tensor& x, const Tensor& w, const ProductInfo& info, const NoiseKey&,
                        SaveForBackward save) override {
    ForwardResult r;
    r.y = forward_product(x, w, info);  // (B, L, O)
    if (save == SaveForBackward::yes) {
      auto s = std::make_unique<ExactSaved>();  // Note [What a product keeps] (grad/pipeline.h)
      if (info.w_grad) s->x = SavedTensor(x);
      if (info.x_grad) s->w = w;
      s->bytes = info.w_grad ? tensor_bytes(x) : 0;
      r.saved = std::move(s);
    }
    return r;
  }

  Grads backward(SavedState& saved, const Tensor& g_y, Wanted wanted) override {
    auto& s = static_cast<ExactSaved&>(saved);
    Grads g;
    if (wanted.x) g.x = exact_grad_x(g_y, s.w);  // (B, L, I)
    if (wanted.w) g.w = exact_grad_w(g_y, s.x.get());  // (O, I)
    return g;
  }
};

}  // namespace

// Called once by the registry (Note [Registration and static linking] in grad/registry.h).
HT_BUILTIN_PIPELINE(exact) {
  return erase(PipelineKind<NoOptions>{.name = "exact",
                                       .read_options = nullptr,
                                       .make = [](const NoOptions&) { return std::make_shared<ExactPipeline>(); },
                                       .describe = nullptr});
}

}  // namespace ht::grad
