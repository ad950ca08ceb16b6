// Elementwise ops with numpy broadcasting: arithmetic, unary math, comparisons, where / masked fill.
// Binary ops promote dtypes (promote_types); results of comparisons are bool (DType::b8).
#pragma once
#include "hadatrain/tensor/tensor.h"

namespace ht {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor sub(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor div(const Tensor& a, double s);
Tensor rsub(double s, const Tensor& a);  // s - a
Tensor pow(const Tensor& a, double exponent);

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApprox { none, tanh };  // none = exact erf form
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);
Tensor silu(const Tensor& x);
Tensor clamp(const Tensor& x, double lo, double hi);

Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double s);
Tensor lt(const Tensor& a, double s);
Tensor gt(const Tensor& a, double s);

// cond ? a : b, broadcasting all three; cond is bool. Differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask (bool, broadcastable to x) is true. Differentiable in x.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// In-place updates for optimisers (not recorded by autograd; self must not require grad).
void add_(const Tensor& self, const Tensor& other, double alpha = 1.0);  // self += alpha * other
void mul_(const Tensor& self, double s);                                  // self *= s

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return sub(a, s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return div(a, s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(s, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace ht
