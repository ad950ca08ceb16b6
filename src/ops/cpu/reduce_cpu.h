// CPU reference reduction helper: accumulates input elements into output slots in double precision.
// Internal to src/ops.
#pragma once
#include <vector>

#include "convert.h"
#include "loops.h"

namespace ht::cpu {

// Which input dims are reduced, as a boolean mask of length x.dim() (from a list of possibly negative dims;
// an empty list means all dims). Throws on repeated dims.
std::vector<bool> reduce_mask(const Tensor& x, const Dims& dims, const char* op);
// Output shape for a reduction with keepdim (reduced dims become 1).
Shape reduced_shape_keepdim(const Shape& s, const std::vector<bool>& mask);
// Strides of a keepdim-shaped output viewed over the input's index space: 0 on reduced dims.
Strides reduce_out_strides(const Shape& keep_shape, const std::vector<bool>& mask);

// For every input element, calls f(slot, value) with slot = flat index into the keepdim output.
template <class F>
void reduce_visit(const Tensor& x, const std::vector<bool>& mask, F&& f) {
  const Shape ks = reduced_shape_keepdim(x.shape(), mask);
  const Strides os = reduce_out_strides(ks, mask);
  visit_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, int4x2>) {
      HT_FAIL("reductions do not take packed int4");
    } else {
      // Row-major order, line by line along the (coalesced) last dim; a line that sums into one slot is
      // its own loop, so the compiler can keep that slot in a register (same order of additions).
      if (x.numel() == 0) return;
      const T* p = ptr<T>(x);
      Shape shape = x.shape();
      std::array<Strides, 2> st{x.strides(), os};
      coalesce_dims<2>(shape, st);
      if (shape.size() == 0) {
        f(int64_t{0}, to_double(p[0]));
        return;
      }
      const int last = shape.size() - 1;
      const int64_t inner = shape[last], x_step = st[0][last], slot_step = st[1][last];
      Shape outer = shape;
      outer[last] = 1;
      for_each_offset<2>(outer, st, [&](const std::array<int64_t, 2>& o) {
        const T* line = p + o[0];
        if (slot_step == 0)
          for (int64_t i = 0; i < inner; ++i) f(o[1], to_double(line[i * x_step]));
        else
          for (int64_t i = 0; i < inner; ++i) f(o[1] + i * slot_step, to_double(line[i * x_step]));
      });
    }
  });
}

}  // namespace ht::cpu
