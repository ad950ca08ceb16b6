// Operand layouts passed by value to elementwise kernels: the common index space (the output's shape, at
// most 8 dims) and each operand's element strides over it (0 on broadcast dims). Built on the host by
// make_layout, which drops size-1 dims and merges dims that are contiguous for every operand, so most
// launches end up with one or two dims. Index math uses 32-bit fast division (FastDiv) when the index
// space has fewer than 2^31 elements.
#pragma once
#include <cstdint>

#include "hadatrain/tensor/scalar_types.h"  // HT_HD

#if defined(__CUDACC__)
#define HT_DEV __device__ __forceinline__
#define HT_UNROLL _Pragma("unroll")
#else
#define HT_DEV inline  // host builds: the index math is unit-tested on the CPU (tests/cpu/test_kernel_layout.cpp)
#define HT_UNROLL
#endif

namespace ht::kernels {

inline constexpr int kMaxDims = 8;

// Division by a fixed divisor d in [1, 2^31) for dividends n in [0, 2^31) by multiply-high and shift
// (Granlund & Montgomery): q = (mulhi(n, m) + n) >> s.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((uint64_t{1} << s) < divisor) ++s;
    m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - divisor)) / divisor + 1);
  }
  HT_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (hi + n) >> s;
  }
};

template <int N>
struct Layout {
  int ndim = 0;
  int64_t numel = 0;
  int64_t size[kMaxDims] = {};
  FastDiv div[kMaxDims];
  int64_t stride[N][kMaxDims] = {};

  // Every operand dense and in the same order: element i of each operand is at offset i.
  HT_HD bool flat() const {
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k)
      if (ndim == 1 && stride[k][0] != 1) return false;
    return true;
  }
};

// Builds a Layout from the index-space shape and one stride array per operand (each of length ndim).
template <int N>
Layout<N> make_layout(int ndim, const int64_t* shape, const int64_t* const (&strides)[N]) {
  Layout<N> l;
  l.numel = 1;
  for (int d = 0; d < ndim; ++d) l.numel *= shape[d];
  // Keep non-trivial dims, outermost first.
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 1) continue;
    const int j = l.ndim++;
    l.size[j] = shape[d];
    for (int k = 0; k < N; ++k) l.stride[k][j] = strides[k][d];
  }
  // Merge dim j into the next inner dim j+1 when every operand steps over it contiguously.
  int out = 0;
  for (int j = 0; j < l.ndim; ++j) {
    if (out > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable &= l.stride[k][out - 1] == l.stride[k][j] * l.size[j];
      if (mergeable) {
        l.size[out - 1] *= l.size[j];
        for (int k = 0; k < N; ++k) l.stride[k][out - 1] = l.stride[k][j];
        continue;
      }
    }
    l.size[out] = l.size[j];
    for (int k = 0; k < N; ++k) l.stride[k][out] = l.stride[k][j];
    ++out;
  }
  l.ndim = out;
  for (int j = 0; j < l.ndim; ++j)
    l.div[j] = FastDiv(l.size[j] > 0 && l.size[j] < (int64_t{1} << 31) ? static_cast<uint32_t>(l.size[j]) : 1u);
  return l;
}

// Element offsets of every operand for linear index i of the index space (row-major).
template <int N>
HT_DEV void offsets_of(const Layout<N>& l, int64_t i, int64_t (&off)[N]) {
HT_UNROLL
  for (int k = 0; k < N; ++k) off[k] = 0;
  if (l.numel < (int64_t{1} << 31)) {
    uint32_t r = static_cast<uint32_t>(i);
HT_UNROLL
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= l.ndim) continue;
      const uint32_t q = d > 0 ? l.div[d].div(r) : 0u;
      const uint32_t idx = r - q * static_cast<uint32_t>(l.size[d]);
HT_UNROLL
      for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * l.stride[k][d];
      r = q;
    }
  } else {
    int64_t r = i;
    for (int d = l.ndim - 1; d >= 0; --d) {
      const int64_t q = d > 0 ? r / l.size[d] : 0;
      const int64_t idx = r - q * l.size[d];
      for (int k = 0; k < N; ++k) off[k] += idx * l.stride[k][d];
      r = q;
    }
  }
}

}  // namespace ht::kernels
