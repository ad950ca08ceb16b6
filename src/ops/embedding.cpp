// embedding(weight (V, D), ids (*) of i32/i64) -> (*, D): out[..., :] = weight[ids[...], :].
// Backward scatter-adds the gradient rows into a zero (V, D) gradient, so repeated ids accumulate; the CPU
// reference accumulates in double and converts once to the weight dtype. CUDA: the forward checks ids on the
// device (Note [Device-side target check] in cuda/glue/rows_glue.cpp); the backward scatter-adds with atomicAdd
// into an f32 (f64) buffer, so the summation order of repeated ids, and the last bits, vary between runs.
#include <vector>

#include "cpu/convert.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/nn_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/rows_glue.h"
#endif

namespace ht {
namespace {

void check_ids(const std::vector<int64_t>& ids, int64_t v, const char* op) {
  for (std::size_t k = 0; k < ids.size(); ++k)
    HT_CHECK(ids[k] >= 0 && ids[k] < v,
             "{}: id {} (at flat position {}) is out of range for a table of V = {} rows (expected 0..{})", op,
             ids[k], k, v, v - 1);
}

// g: (*ids.shape, D) -> (V, D) in `dtype`.
Tensor embedding_backward(const Tensor& g, const Tensor& ids, int64_t v, DType dtype) {
  const int64_t d = g.shape().back();
  if (g.is_cuda()) {
#ifdef HADATRAIN_CUDA
    return cuda_ops::embedding_backward(g, ids, v, dtype);
#else
    no_cuda_kernel("embedding_backward");
#endif
  }
  Tensor gw = empty({v, d}, {dtype, g.device()});  // (V, D)
  const std::vector<int64_t> idv = ids.to_vector<int64_t>();
  const std::vector<double> gv = g.to_vector<double>();  // row-major (*ids.shape, D)
  std::vector<double> acc(static_cast<std::size_t>(v * d), 0.0);
  for (std::size_t k = 0; k < idv.size(); ++k)
    for (int64_t j = 0; j < d; ++j)
      acc[static_cast<std::size_t>(idv[k] * d + j)] += gv[k * static_cast<std::size_t>(d) + static_cast<std::size_t>(j)];
  visit_floating(dtype, "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = cpu::ptr<T>(gw);
    for (std::size_t i = 0; i < acc.size(); ++i) p[i] = cpu::convert<T>(acc[i]);
  });
  return gw;
}

class EmbeddingBackward final : public Node {
 public:
  EmbeddingBackward(int64_t v, DType dtype) : v_(v), dtype_(dtype) {}
  std::string name() const override { return "EmbeddingBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    return {embedding_backward(grads[0], saved(0), v_, dtype_)};
  }

 private:
  int64_t v_;
  DType dtype_;
};

// The CPU reference: out (*ids.shape, D) = weight[ids].
void embedding_cpu(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t v = weight.size(0), d = weight.size(1);
  const std::vector<int64_t> idv = ids.to_vector<int64_t>();  // row-major order of ids
  check_ids(idv, v, "embedding");
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1);
  visit_dtype(weight.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, int4x2>) {
      const T* pw = cpu::ptr<T>(weight);
      T* po = cpu::ptr<T>(out);
      for (std::size_t k = 0; k < idv.size(); ++k)
        for (int64_t j = 0; j < d; ++j) po[static_cast<int64_t>(k) * d + j] = pw[idv[k] * s0 + j * s1];
    }
  });
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids, TargetCheck check) {
  const Device dev = common_device("embedding", {&weight, &ids});
  HT_CHECK(weight.dim() == 2, "embedding: expected weight of shape (V, D), got {}", weight.describe());
  HT_CHECK(weight.dtype() != DType::i4x2, "embedding: packed int4 weights are not supported, got {}",
           weight.describe());
  HT_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64,
           "embedding: expected integer ids (i32 or i64), got {}", ids.describe());
  const int64_t v = weight.size(0), d = weight.size(1);
  Shape out_shape = ids.shape();  // (*ids.shape, D)
  HT_CHECK(out_shape.size() < kMaxDims, "embedding: ids {} have too many dims to append D", ids.describe());
  out_shape.push_back(d);
  Tensor out = empty(out_shape, {weight.dtype(), dev});
  if (dev.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::embedding(out, weight, ids, check);
#else
    no_cuda_kernel("embedding");
#endif
  } else {
    embedding_cpu(out, weight, ids);
  }

  if (needs_grad({&weight})) {
    auto node = std::make_shared<EmbeddingBackward>(v, weight.dtype());
    node->save(ids);
    connect(node, {&weight}, {&out});
  }
  return out;
}

}  // namespace ht
