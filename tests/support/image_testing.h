// Test images shared by the image-transform tests.
#pragma once

#include <cstdint>

#include "hadatrain/data/image.h"

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

}  // namespace ht::test
