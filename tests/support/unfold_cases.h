// Shared by the CPU and GPU unfold2d / fold2d tests: one test case (input shape and window) and a compact
// constructor for the window parameters.
#pragma once
#include <cstdint>

#include "hadatrain/ops/unfold.h"

namespace ht::test {

struct UnfoldCase {
  int64_t N, C, H, W;
  Unfold2dParams p;
};

// kernel (kh, kw), stride (sh, sw), padding (ph, pw), dilation (dh, dw).
inline Unfold2dParams window(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                             int64_t dw) {
  Unfold2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dilation_h = dh;
  p.dilation_w = dw;
  return p;
}

}  // namespace ht::test
