// Variance over dims with a correction (1 = unbiased), composed from mean and sum so that its gradient
// comes from the primitives.
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/reduce.h"

namespace ht {

Tensor var(const Tensor& x, const Dims& dims, int64_t correction, KeepDim keep) {
  HT_CHECK(is_floating(x.dtype()), "var: expected a floating tensor, got {}", x.describe());
  int64_t count = 1;
  if (dims.empty()) {
    count = x.numel();
  } else {
    for (int64_t d : dims) count *= x.shape()[wrap_dim(d, x.dim(), "var")];
  }
  HT_CHECK(count - correction > 0, "var: {} elements with correction {} leave no degrees of freedom", count,
           correction);
  const Tensor mu = dims.empty() ? mean(x) : mean(x, dims, KeepDim::yes);
  const Tensor d = sub(x, mu);
  const Tensor ss = dims.empty() ? sum(mul(d, d)) : sum(mul(d, d), dims, keep);
  return div(ss, static_cast<double>(count - correction));
}

}  // namespace ht
