// matmul: (..., M, K) @ (..., K, N) -> (..., M, N) with numpy broadcasting of the batch dims. 1-D operands
// follow numpy: a vector on the left is a row (1, K), on the right a column (K, 1), and that dim is dropped
// from the result. Each batch matrix goes to the GEMM helper (OpenBLAS for f32/f64, an fp32-accumulating
// loop for bf16/f16/fp8) straight from its strides when it is row-major or a transposed view (trans flag);
// otherwise it is copied once. Backward: ga = g·bᵀ and gb = aᵀ·g, each summed over broadcast batch dims.
#include <algorithm>

#include "cpu/gemm.h"
#include "cpu/loops.h"
#include "hadatrain/autograd/function.h"
#include "hadatrain/ops/dispatch.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#ifdef HADATRAIN_CUDA
#include "cuda/glue/gemm_glue.h"
#endif

namespace ht {
namespace {

Shape batch_of(const Tensor& t) {
  Shape s = t.shape();
  s.resize(t.dim() - 2);
  return s;
}

bool broadcastable(const Shape& a, const Shape& b) {
  for (int i = 1; i <= std::min(a.size(), b.size()); ++i) {
    const int64_t da = a[a.size() - i], db = b[b.size() - i];
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

// Strides of t's batch dims (all but the last two) viewed as broadcast to `batch` (0 on broadcast dims).
Strides batch_strides(const Tensor& t, const Shape& batch) {
  Strides st;
  st.resize(batch.size());
  const int tb = t.dim() - 2, lead = batch.size() - tb;
  for (int i = 0; i < batch.size(); ++i) {
    const int j = i - lead;
    st[i] = (j < 0 || t.shape()[j] == 1) ? 0 : t.strides()[j];
  }
  return st;
}

// Number of rows when all dims but the last are merged: (..., K) -> (rows, K); well defined when K = 0.
int64_t merged_rows(const Tensor& t) {
  int64_t r = 1;
  for (int i = 0; i + 1 < t.dim(); ++i) r *= t.shape()[i];
  return r;
}

// True when t's dims before the last one merge into one dim of uniform stride (so (..., M, K) can be
// viewed as (B·M, K) without a copy) and its last dim is unit-stride.
bool rows_merge(const Tensor& t) {
  const int nd = t.dim();
  if (t.shape()[nd - 1] != 1 && t.strides()[nd - 1] != 1) return false;
  for (int i = 0; i + 2 < nd; ++i)
    if (t.shape()[i] != 1 && t.strides()[i] != t.strides()[i + 1] * t.shape()[i + 1]) return false;
  return true;
}

// The product of detached operands with at least 2 dims each; shapes were checked by the caller.
Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  const int64_t K = a.shape().back(), N = b.shape().back();
  if (b.dim() == 2 && a.dim() > 2 && rows_merge(a)) {  // (..., M, K) @ (K, N): one GEMM of (B·M, K)
    Shape out_shape = a.shape();
    out_shape[a.dim() - 1] = N;
    return matmul_forward(a.reshape({merged_rows(a), K}), b).reshape(out_shape);
  }
  const int64_t M = a.shape()[a.dim() - 2];
  const Shape batch = broadcast_shapes(batch_of(a), batch_of(b), "matmul");
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = empty(out_shape, {a.dtype(), a.device()});  // (..., M, N)
  if (a.is_cuda()) {
#ifdef HADATRAIN_CUDA
    cuda_ops::matmul(out, a, b);  // cuBLASLt; strided batches, transposed views as trans flags
    return out;
#else
    no_cuda_kernel("matmul");
#endif
  }
  const cpu::GemmOperand ao = cpu::gemm_operand(a), bo = cpu::gemm_operand(b);
  const cpu::GemmDims d = cpu::gemm_dims(M, N, K, ao.layout, bo.layout);
  const Strides out_bs = batch_strides(out, batch);
  visit_floating(a.dtype(), "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = cpu::ptr<T>(ao.t);
    const T* pb = cpu::ptr<T>(bo.t);
    T* po = cpu::ptr<T>(out);
    cpu::for_each_offset<3>(batch, {out_bs, batch_strides(ao.t, batch), batch_strides(bo.t, batch)},
                            [&](const std::array<int64_t, 3>& off) {
                              cpu::gemm<T>(d, pa + off[1], pb + off[2], po + off[0]);
                            });
  });
  return out;
}

class MatmulBackward final : public Node {
 public:
  MatmulBackward(const Tensor& a, const Tensor& b) {
    save(a);
    save(b);
  }
  std::string name() const override { return "MatmulBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    const Tensor& g = grads[0];  // (..., M, N)
    const Tensor& a = saved(0);  // (..., M, K)
    const Tensor& b = saved(1);  // (..., K, N)
    Tensor ga, gb;
    if (needs_input_grad(0)) ga = sum_to(matmul(g, b.transpose(-1, -2)), a.shape());
    if (needs_input_grad(1)) {
      if (b.dim() == 2 && a.dim() > 2) {  // sum over the batch folded into one GEMM: (K, B·M) @ (B·M, N)
        const int64_t K = a.shape().back(), N = b.shape().back();
        gb = matmul(a.reshape({merged_rows(a), K}).transpose(0, 1), g.reshape({merged_rows(g), N}));
      } else {
        gb = sum_to(matmul(a.transpose(-1, -2), g), b.shape());
      }
    }
    return {ga, gb};
  }
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  common_device("matmul", {&a, &b});
  HT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands need at least 1 dim, got a {} and b {}", a.describe(),
           b.describe());
  HT_CHECK(a.dtype() == b.dtype(), "matmul: operands have different dtypes (a {}, b {}); convert one with .to()",
           a.describe(), b.describe());
  check_floating("matmul", {&a, &b});
  const int64_t ka = a.shape().back(), kb = b.dim() == 1 ? b.shape()[0] : b.shape()[b.dim() - 2];
  HT_CHECK(ka == kb,
           "matmul: inner dimensions differ: a {} has K = {} (its last dim) but b {} has K = {} (its {} dim)",
           a.describe(), ka, b.describe(), kb, b.dim() == 1 ? "only" : "second-to-last");
  // Vectors become matrices through differentiable views; the added dim is dropped again.
  if (a.dim() == 1 && b.dim() == 1) return reshape(matmul(unsqueeze(a, 0), unsqueeze(b, 1)), {});
  if (a.dim() == 1) return squeeze(matmul(unsqueeze(a, 0), b), -2);
  if (b.dim() == 1) return squeeze(matmul(a, unsqueeze(b, 1)), -1);

  HT_CHECK(broadcastable(batch_of(a), batch_of(b)),
           "matmul: batch dims (all but the last two) of a {} and b {} cannot be broadcast together", a.describe(),
           b.describe());
  Tensor out = matmul_forward(a.detach(), b.detach());
  if (needs_grad({&a, &b})) connect(std::make_shared<MatmulBackward>(a, b), {&a, &b}, {&out});
  return out;
}

Tensor matmul_f32(const Tensor& a, const Tensor& b) {
  common_device("matmul_f32", {&a, &b});
  HT_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0),
           "matmul_f32: expected a (M, K) and b (K, N), got a {} and b {}", a.describe(), b.describe());
  HT_CHECK(a.dtype() == b.dtype(), "matmul_f32: operands have different dtypes (a {}, b {})", a.describe(),
           b.describe());
  check_floating("matmul_f32", {&a, &b});
  const DType dt = a.dtype();
  if (a.is_cuda() && (dt == DType::bf16 || dt == DType::f16)) {
#ifdef HADATRAIN_CUDA
    Tensor out = empty({a.size(0), b.size(1)}, {DType::f32, a.device()});
    cuda_ops::matmul(out, a.detach(), b.detach());  // the operands' dtype in, f32 out (cuda/cublaslt_gemm.h)
    return out;
#endif
  }
  return matmul_forward(a.detach().to(DType::f32), b.detach().to(DType::f32));
}

}  // namespace ht
