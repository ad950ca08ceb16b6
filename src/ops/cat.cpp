// cat: joins tensors along an existing dim; stack: along a new dim (unsqueeze each, then cat).
// Inputs are promoted to one dtype (promote_types over all of them); every size but the cat dim must
// match. Backward hands each input the slice of the gradient it produced (narrow), converted back to the
// input's dtype.
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/shape_ops.h"

namespace ht {

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  HT_CHECK(!xs.empty(), "cat: expected at least one tensor, got an empty list");
  for (std::size_t i = 0; i < xs.size(); ++i) HT_CHECK(xs[i].defined(), "cat: input {} is an undefined tensor", i);
  const Tensor& x0 = xs[0];
  HT_CHECK(x0.dim() >= 1, "cat: input 0 {} is 0-dimensional; use stack to join scalars", x0.describe());
  const int d = wrap_dim(dim, x0.dim(), "cat");
  DType dt = x0.dtype();
  const Device dev = x0.device();
  Shape out_shape = x0.shape();
  out_shape[d] = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    HT_CHECK(x.device() == dev, "cat: input {} {} is on a different device than input 0 {}", i, x.describe(),
             x0.describe());
    HT_CHECK(x.dim() == x0.dim(), "cat: input {} {} has {} dims but input 0 {} has {}", i, x.describe(), x.dim(),
             x0.describe(), x0.dim());
    for (int k = 0; k < x.dim(); ++k)
      HT_CHECK(k == d || x.shape()[k] == x0.shape()[k],
               "cat: input {} {} differs from input 0 {} in dim {} (sizes must match except in the cat dim {})", i,
               x.describe(), x0.describe(), k, d);
    if (i > 0) dt = promote_types(dt, x.dtype());
    out_shape[d] += x.shape()[d];
  }
  Tensor out = empty(out_shape, {dt, dev});
  // CUDA needs no kernel of its own: copy_ into a strided slice of out runs the copy kernel.
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const Tensor& x : xs) {
    starts.push_back(start);
    copy_(narrow(out, d, start, x.shape()[d]), x.detach());  // converts to dt
    start += x.shape()[d];
  }
  if (needs_grad(xs)) {
    check_floating("cat", {&out});
    std::vector<int64_t> lengths;
    std::vector<DType> dtypes;
    for (const Tensor& x : xs) {
      lengths.push_back(x.shape()[d]);
      dtypes.push_back(x.dtype());
    }
    auto node = std::make_shared<FunctionNode>(
        "CatBackward", [d, starts, lengths, dtypes](FunctionNode& self, std::vector<Tensor>&& g) {
          std::vector<Tensor> gs(starts.size());
          for (std::size_t i = 0; i < starts.size(); ++i)
            if (self.needs_input_grad(i)) gs[i] = to_dtype(narrow(g[0], d, starts[i], lengths[i]), dtypes[i]);
          return gs;
        });
    std::vector<Tensor> outs{out};
    connect(node, xs, outs);
    out = outs[0];
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  HT_CHECK(!xs.empty(), "stack: expected at least one tensor, got an empty list");
  for (std::size_t i = 0; i < xs.size(); ++i) {
    HT_CHECK(xs[i].defined(), "stack: input {} is an undefined tensor", i);
    HT_CHECK(xs[i].shape() == xs[0].shape(), "stack: input {} {} has a different shape than input 0 {}", i,
             xs[i].describe(), xs[0].describe());
  }
  const int d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(xs.size());
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, d));
  return cat(us, d);
}

}  // namespace ht
