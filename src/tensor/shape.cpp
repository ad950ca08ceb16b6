// Shape helpers: element counts, contiguous strides, dim wrapping and broadcasting.
#include "hadatrain/tensor/shape.h"

namespace ht {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st;
  st.resize(s.size());
  int64_t acc = 1;
  for (int i = s.size() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string to_string(const Dims& d) {
  std::string out = "(";
  for (int i = 0; i < d.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(d[i]);
  }
  return out + ")";
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  const int64_t lo = -std::max(ndim, 1), hi = std::max(ndim, 1) - 1;
  HT_CHECK(dim >= lo && dim <= hi, "{}: dim {} is out of range for a tensor with {} dimensions (expected {}..{})",
           op, dim, ndim, lo, hi);
  return static_cast<int>(dim < 0 ? dim + std::max(ndim, 1) : dim);
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int n = std::max(a.size(), b.size());
  Shape out;
  out.resize(n);
  for (int i = 0; i < n; ++i) {
    const int ia = a.size() - n + i, ib = b.size() - n + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    HT_CHECK(da == db || da == 1 || db == 1, "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op,
             a, b, i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace ht
