// Test images shared by the image-transform tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "hadatrain/data/image.h"
#include "hadatrain/tensor/tensor.h"
#include "support/catch.h"

namespace ht::test {

// c channels of h x w pseudo-random pixels (a fixed LCG from `seed`), so resizes and warps see non-linear content.
inline data::Image noise_image(int64_t c, int64_t h, int64_t w, data::ImageLayout layout, uint32_t seed) {
  data::Image img = data::Image::zeros(h, w, c, layout);
  uint32_t s = seed;
  for (auto& p : img.pixels) {
    s = s * 1664525u + 1013904223u;
    p = static_cast<uint8_t>(s >> 24);
  }
  return img;
}

// A fixture's (H, W, C) u8 tensor as an HWC image.
inline data::Image image_of(const Tensor& t) {
  REQUIRE(t.dim() == 3);
  data::Image img = data::Image::zeros(t.size(0), t.size(1), t.size(2), data::ImageLayout::hwc);
  REQUIRE(static_cast<int64_t>(img.pixels.size()) == t.numel());
  std::memcpy(img.pixels.data(), t.data<uint8_t>(), img.pixels.size());
  return img;
}

// The number of values of `ours` that differ from `want` (whose source `what` names, e.g. "Pillow"), reported with
// the first one under `name`.
inline int64_t mismatches(const std::string& name, const data::Image& want, const data::Image& ours,
                          const char* what = "expected") {
  REQUIRE(want.same_geometry(ours));
  int64_t bad = 0;
  for (int64_t y = 0; y < want.height; ++y)
    for (int64_t x = 0; x < want.width; ++x)
      for (int64_t c = 0; c < want.channels; ++c)
        if (ours.at(c, y, x) != want.at(c, y, x) && bad++ == 0)
          UNSCOPED_INFO(name << ": first difference at (y " << y << ", x " << x << ", c " << c << "): ours "
                             << int(ours.at(c, y, x)) << ", " << what << " " << int(want.at(c, y, x)));
  return bad;
}

}  // namespace ht::test
