// Finite-difference gradient check (see gradcheck.h).
#include "gradcheck.h"

#include <cmath>

#include "hadatrain/autograd/engine.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/ops/ops.h"

namespace ht::test {
namespace {
double weighted_sum(const Tensor& out, const Tensor& w) { return sum(mul(out.to(DType::f64), w)).item(); }
}  // namespace

std::string gradcheck(const GradcheckFn& f, const std::vector<Tensor>& inputs, GradcheckOptions opts) {
  std::vector<Tensor> wrt;
  for (const auto& x : inputs) {
    if (!x.defined() || !x.requires_grad()) continue;
    if (x.dtype() != DType::f64 || !x.is_contiguous() || !x.is_cpu())
      return "gradcheck: inputs that require grad must be contiguous f64 CPU tensors, got " + x.describe();
    wrt.push_back(x);
  }
  if (wrt.empty()) return "gradcheck: no input requires grad";

  Tensor out = f(inputs);
  Generator gen(0x5eed);
  const Tensor w = uniform(out.shape(), 0.5, 1.5, gen, {DType::f64});
  const Tensor loss = sum(mul(out.to(DType::f64), w));
  const std::vector<Tensor> analytic = grad({loss}, wrt);

  NoGradGuard no_grad;
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    double* p = wrt[k].data<double>();
    const std::vector<double> ga = analytic[k].defined() ? analytic[k].to_vector<double>()
                                                         : std::vector<double>(static_cast<std::size_t>(wrt[k].numel()), 0.0);
    for (int64_t i = 0; i < wrt[k].numel(); ++i) {
      const double orig = p[i];
      p[i] = orig + opts.eps;
      const double lp = weighted_sum(f(inputs), w);
      p[i] = orig - opts.eps;
      const double lm = weighted_sum(f(inputs), w);
      p[i] = orig;
      const double numeric = (lp - lm) / (2 * opts.eps);
      const double a = ga[static_cast<std::size_t>(i)];
      if (!(std::abs(a - numeric) <= opts.atol + opts.rtol * std::abs(numeric)))
        return fmt::format("gradcheck: input {} ({}) element {}: analytic {:.10g}, numeric {:.10g}", k,
                           wrt[k].describe(), i, a, numeric);
    }
  }
  return {};
}

}  // namespace ht::test
