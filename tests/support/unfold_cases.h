// Shared by the CPU and GPU unfold2d / fold2d and HLA tests: one test case (input shape and window) and compact
// constructors for the window parameters.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>

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

// A square window: kernel k×k, the same stride, padding and dilation along both axes.
inline Unfold2dParams square_window(int64_t k, int64_t stride, int64_t pad, int64_t dilation = 1) {
  return window(k, k, stride, stride, pad, pad, dilation, dilation);
}

// "N 2 C 3 H 17 W 15 k 3x3 s 2 p 1 d 1": the case in a test's INFO line.
inline std::string describe(const UnfoldCase& c) {
  std::ostringstream o;
  o << "N " << c.N << " C " << c.C << " H " << c.H << " W " << c.W << " k " << c.p.kernel_h << "x" << c.p.kernel_w
    << " s " << c.p.stride_h << " p " << c.p.pad_h << " d " << c.p.dilation_h;
  return o.str();
}

}  // namespace ht::test
