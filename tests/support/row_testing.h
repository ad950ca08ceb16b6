// Shared by the GPU row-op tests (tests/gpu/test_gpu_rows.cpp, test_gpu_rows_norm.cpp): the dtypes and row
// lengths they sweep, the row tolerance, and check_op, which runs a graph on the CPU and on CUDA (poisoned
// allocations) and compares the outputs and every input's gradient.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hadatrain/ops/ops.h"
#include "support/gpu_testing.h"

namespace ht::test {

// A graph of row ops on its inputs, run on either device by check_op.
using Graph = std::function<Tensor(const std::vector<Tensor>&)>;

// The dtypes and row lengths the row tests sweep.
inline const std::vector<DType> kDTypes = {DType::f32, DType::bf16, DType::f64};
inline const std::vector<int64_t> kLens = {1, 7, 1000, 4097};

// The tolerance of row results: the shared table, widened where the GPU reduces a row in float while the CPU
// reference works in double (f32: 10x the table, a float sum over 4097 elements carries about 1e-6 relative
// error), and for narrow dtypes 2x, because a backward reads the forward output, which may already differ by
// one ulp.
inline Tolerance row_tol(DType dt) {
  Tolerance t = tolerance(dt);
  const double k = dt == DType::f32 ? 10.0 : (dt == DType::bf16 || dt == DType::f16 ? 2.0 : 1.0);
  return {t.rtol * k, t.atol * k};
}

// Leaves with the same values on `dev`; floating ones require grad.
inline std::vector<Tensor> leaves(const std::vector<Tensor>& values, Device dev) {
  std::vector<Tensor> out;
  for (const Tensor& v : values) {
    if (!v.defined()) {
      out.push_back(Tensor());
      continue;
    }
    Tensor t = v.to(dev).detach();
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    out.push_back(t);
  }
  return out;
}

// Runs f on both devices, then backward of sum(f(..) * r) with a random r (so that the gradient of a
// softmax is not identically zero); "" when the outputs and every gradient agree.
inline std::string check_op(const Graph& f, const std::vector<Tensor>& values, Tolerance fwd_tol, Tolerance grad_tol,
                            uint64_t seed = 99) {
  auto cpu = leaves(values, Device::cpu());
  Tensor yc = f(cpu);
  const Tensor r = random_input(yc.shape(), seed, yc.dtype(), 0.5, 1.5);
  Tensor yg;
  std::vector<Tensor> gpu;
  {
    PoisonGuard poison;
    gpu = leaves(values, kCuda);
    yg = f(gpu);
    if (yg.requires_grad()) sum(mul(yg, r.to(kCuda))).backward();
  }
  std::string msg = compare_to_cpu(yg, yc, fwd_tol);
  if (!msg.empty()) return "forward: " + msg;
  if (!yc.requires_grad()) return {};
  sum(mul(yc, r)).backward();
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].defined() || !cpu[i].requires_grad()) continue;
    if (!cpu[i].grad().defined()) {
      if (gpu[i].grad().defined()) return fmt::format("input {}: a gradient on CUDA but none on the CPU", i);
      continue;
    }
    if (!gpu[i].grad().defined()) return fmt::format("input {}: no gradient on CUDA", i);
    msg = compare_to_cpu(gpu[i].grad(), cpu[i].grad(), grad_tol);
    if (!msg.empty()) return fmt::format("gradient of input {}: {}", i, msg);
  }
  return {};
}

inline std::string check_op(const Graph& f, const std::vector<Tensor>& values, DType dt) {
  return check_op(f, values, row_tol(dt), row_tol(dt));
}

}  // namespace ht::test
