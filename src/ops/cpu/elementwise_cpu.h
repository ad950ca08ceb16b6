// CPU reference loops for elementwise maps: out = f(a) and out = f(a, b) with broadcasting, computed in
// acc_t<T> (float for narrow floats, double for f64, int64 for integers). Internal to src/ops.
#pragma once
#include "convert.h"
#include "loops.h"

namespace ht::cpu {

// out[i] = f(a[i]) for tensors of one dtype T (out contiguous or not; a broadcast to out).
template <class T, class F>
void unary_map(const Tensor& out, const Tensor& a, F&& f) {
  using A = acc_t<T>;
  T* o = ptr<T>(out);
  const T* pa = ptr<T>(a);
  if (out.is_contiguous() && a.is_contiguous() && a.shape() == out.shape()) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = convert<T>(f(convert<A>(pa[i])));
    return;
  }
  for_each_offset<2>(out.shape(), {out.strides(), broadcast_strides(a, out.shape())},
                     [&](const std::array<int64_t, 2>& off) { o[off[0]] = convert<T>(f(convert<A>(pa[off[1]]))); });
}

// out[i] = f(a[i], b[i]) with a, b of dtype T broadcast to out; out of dtype O.
template <class T, class O, class F>
void binary_map(const Tensor& out, const Tensor& a, const Tensor& b, F&& f) {
  using A = acc_t<T>;
  O* o = ptr<O>(out);
  const T* pa = ptr<T>(a);
  const T* pb = ptr<T>(b);
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() &&
      b.shape() == out.shape()) {
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) o[i] = convert<O>(f(convert<A>(pa[i]), convert<A>(pb[i])));
    return;
  }
  for_each_offset<3>(out.shape(),
                     {out.strides(), broadcast_strides(a, out.shape()), broadcast_strides(b, out.shape())},
                     [&](const std::array<int64_t, 3>& off) {
                       o[off[0]] = convert<O>(f(convert<A>(pa[off[1]]), convert<A>(pb[off[2]])));
                     });
}

}  // namespace ht::cpu
