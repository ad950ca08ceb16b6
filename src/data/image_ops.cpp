// RandAugment's image operations: per-pixel maps, histogram ops, PIL-style enhancement blends and affine
// warps with nearest or bilinear sampling (image_ops.h gives each formula).
#include "hadatrain/data/image_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>

#include "hadatrain/core/error.h"

namespace ht::data {
namespace {

void check_image(const Image& img, const char* op) {
  HT_CHECK(img.numel() > 0, "{}: empty image {}", op, img.describe());
  HT_CHECK(static_cast<int64_t>(img.pixels.size()) == img.numel(), "{}: image {} holds {} bytes, expected {}", op,
           img.describe(), img.pixels.size(), img.numel());
}

// The same image with every value passed through `lut`.
Image apply_lut(const Image& img, const std::array<uint8_t, 256>& lut) {
  Image out = img;
  for (uint8_t& p : out.pixels) p = lut[p];
  return out;
}

// PIL's Image.blend(degenerate, image, f) on one value: computed in f32, truncated towards zero, clipped.
uint8_t blend(uint8_t d, uint8_t p, float f) {
  const float v = static_cast<float>(d) + f * (static_cast<float>(p) - static_cast<float>(d));
  if (v <= 0.0f) return 0;
  if (v >= 255.0f) return 255;
  return static_cast<uint8_t>(v);
}

void check_color_channels(const Image& img, const char* op) {
  HT_CHECK(img.channels == 1 || img.channels == 3, "{}: needs a 1- or 3-channel image, got {}", op, img.describe());
}

// PIL's "L" conversion of pixel (y, x): ITU-R 601-2 luma in 16-bit fixed point, rounded.
uint8_t luma(const Image& img, int64_t y, int64_t x) {
  if (img.channels == 1) return img.at(0, y, x);
  const uint32_t r = img.at(0, y, x), g = img.at(1, y, x), b = img.at(2, y, x);
  return static_cast<uint8_t>((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

// The fill value of channel c (WarpOptions::fill).
uint8_t fill_of(const WarpOptions& w, int64_t c, int64_t channels) {
  if (w.fill.empty()) return 0;
  HT_CHECK(w.fill.size() == 1 || static_cast<int64_t>(w.fill.size()) == channels,
           "warp: {} fill values for a {}-channel image (give one, or one per channel)", w.fill.size(), channels);
  return w.fill.size() == 1 ? w.fill[0] : w.fill[static_cast<std::size_t>(c)];
}

}  // namespace

Image invert(const Image& img) {
  check_image(img, "invert");
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) lut[static_cast<std::size_t>(v)] = static_cast<uint8_t>(255 - v);
  return apply_lut(img, lut);
}

Image posterize(const Image& img, int bits) {
  check_image(img, "posterize");
  HT_CHECK(bits >= 0 && bits <= 8, "posterize: bits must be in [0, 8], got {}", bits);
  const int mask = ~((1 << (8 - bits)) - 1) & 0xFF;
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) lut[static_cast<std::size_t>(v)] = static_cast<uint8_t>(v & mask);
  return apply_lut(img, lut);
}

Image solarize(const Image& img, int threshold) {
  check_image(img, "solarize");
  HT_CHECK(threshold >= 0 && threshold <= 256, "solarize: threshold must be in [0, 256], got {}", threshold);
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v) lut[static_cast<std::size_t>(v)] = static_cast<uint8_t>(v >= threshold ? 255 - v : v);
  return apply_lut(img, lut);
}

Image solarize_add(const Image& img, int add, int threshold) {
  check_image(img, "solarize_add");
  HT_CHECK(add >= 0 && add <= 255, "solarize_add: add must be in [0, 255], got {}", add);
  std::array<uint8_t, 256> lut{};
  for (int v = 0; v < 256; ++v)
    lut[static_cast<std::size_t>(v)] = static_cast<uint8_t>(v < threshold ? std::min(255, v + add) : v);
  return apply_lut(img, lut);
}

Image auto_contrast(const Image& img) {
  check_image(img, "auto_contrast");
  Image out = img;
  for (int64_t c = 0; c < img.channels; ++c) {
    int lo = 255, hi = 0;
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) {
        lo = std::min<int>(lo, img.at(c, y, x));
        hi = std::max<int>(hi, img.at(c, y, x));
      }
    if (hi <= lo) continue;
    // PIL's lookup table, in doubles as Python computes it: int(v * scale + offset), offset = -lo * scale.
    const double scale = 255.0 / static_cast<double>(hi - lo), offset = -static_cast<double>(lo) * scale;
    std::array<uint8_t, 256> lut{};
    for (int v = 0; v < 256; ++v)
      lut[static_cast<std::size_t>(v)] =
          static_cast<uint8_t>(std::clamp(static_cast<int>(static_cast<double>(v) * scale + offset), 0, 255));
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) out.at(c, y, x) = lut[img.at(c, y, x)];
  }
  return out;
}

Image equalize(const Image& img) {
  check_image(img, "equalize");
  Image out = img;
  for (int64_t c = 0; c < img.channels; ++c) {
    std::array<int64_t, 256> h{};
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) ++h[img.at(c, y, x)];
    int last = 255;
    while (h[static_cast<std::size_t>(last)] == 0) --last;  // the image is not empty, so a bin is
    const int64_t step = (img.height * img.width - h[static_cast<std::size_t>(last)]) / 255;
    if (step == 0) continue;
    std::array<uint8_t, 256> lut{};
    int64_t n = step / 2;
    for (std::size_t v = 0; v < 256; ++v) {
      lut[v] = static_cast<uint8_t>(std::min<int64_t>(255, n / step));
      n += h[v];
    }
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) out.at(c, y, x) = lut[img.at(c, y, x)];
  }
  return out;
}

Image adjust_brightness(const Image& img, float factor) {
  check_image(img, "adjust_brightness");
  Image out = img;
  for (uint8_t& p : out.pixels) p = blend(0, p, factor);
  return out;
}

Image adjust_color(const Image& img, float factor) {
  check_image(img, "adjust_color");
  check_color_channels(img, "adjust_color");
  if (img.channels == 1) return img;
  Image out = img;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) {
      const uint8_t l = luma(img, y, x);
      for (int64_t c = 0; c < 3; ++c) out.at(c, y, x) = blend(l, img.at(c, y, x), factor);
    }
  return out;
}

Image adjust_contrast(const Image& img, float factor) {
  check_image(img, "adjust_contrast");
  check_color_channels(img, "adjust_contrast");
  int64_t sum = 0;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) sum += luma(img, y, x);
  const double mean = static_cast<double>(sum) / static_cast<double>(img.height * img.width);
  const auto d = static_cast<uint8_t>(std::floor(mean + 0.5));
  Image out = img;
  for (uint8_t& p : out.pixels) p = blend(d, p, factor);
  return out;
}

Image adjust_sharpness(const Image& img, float factor) {
  check_image(img, "adjust_sharpness");
  Image out = img;
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t y = 1; y + 1 < img.height; ++y)
      for (int64_t x = 1; x + 1 < img.width; ++x) {
        int sum = 4 * img.at(c, y, x);  // centre weight 5 = 4 + the 1 of the 3x3 loop
        for (int64_t dy = -1; dy <= 1; ++dy)
          for (int64_t dx = -1; dx <= 1; ++dx) sum += img.at(c, y + dy, x + dx);
        // sum / 13 is never exactly half-way (13 is odd), so rounding has no ties.
        const auto smooth = static_cast<uint8_t>((sum * 2 + 13) / 26);
        out.at(c, y, x) = blend(smooth, img.at(c, y, x), factor);
      }
  return out;
}

Image affine_warp(const Image& img, const double (&m)[6], const WarpOptions& w) {
  check_image(img, "affine_warp");
  const int64_t C = img.channels, H = img.height, W = img.width;
  std::vector<uint8_t> fill(static_cast<std::size_t>(C));
  for (int64_t c = 0; c < C; ++c) fill[static_cast<std::size_t>(c)] = fill_of(w, c, C);
  Image out = Image::zeros(H, W, C, img.layout);
  for (int64_t y = 0; y < H; ++y)
    for (int64_t x = 0; x < W; ++x) {
      const double px = static_cast<double>(x) + 0.5, py = static_cast<double>(y) + 0.5;
      const double sx = m[0] * px + m[1] * py + m[2], sy = m[3] * px + m[4] * py + m[5];
      if (w.resample == Resample::nearest) {
        const auto ix = static_cast<int64_t>(std::floor(sx)), iy = static_cast<int64_t>(std::floor(sy));
        const bool in = ix >= 0 && ix < W && iy >= 0 && iy < H;
        for (int64_t c = 0; c < C; ++c) out.at(c, y, x) = in ? img.at(c, iy, ix) : fill[static_cast<std::size_t>(c)];
        continue;
      }
      // PIL's bilinear: (sx, sy) outside the image takes the fill; inside, the four neighbours of
      // (sx - 0.5, sy - 0.5) with indices clamped to the image, lerped along x then y in doubles, truncated.
      if (sx < 0 || sx >= static_cast<double>(W) || sy < 0 || sy >= static_cast<double>(H)) {
        for (int64_t c = 0; c < C; ++c) out.at(c, y, x) = fill[static_cast<std::size_t>(c)];
        continue;
      }
      const double u = sx - 0.5, v = sy - 0.5;
      const double fx = std::floor(u), fy = std::floor(v);
      const double dx = u - fx, dy = v - fy;
      const auto clamp_x = [&](int64_t i) { return std::clamp<int64_t>(i, 0, W - 1); };
      const auto clamp_y = [&](int64_t i) { return std::clamp<int64_t>(i, 0, H - 1); };
      const int64_t x0 = clamp_x(static_cast<int64_t>(fx)), x1 = clamp_x(static_cast<int64_t>(fx) + 1);
      const int64_t y0 = clamp_y(static_cast<int64_t>(fy)), y1 = clamp_y(static_cast<int64_t>(fy) + 1);
      for (int64_t c = 0; c < C; ++c) {
        const double a0 = img.at(c, y0, x0), b0 = img.at(c, y0, x1);
        const double a1 = img.at(c, y1, x0), b1 = img.at(c, y1, x1);
        const double top = a0 + (b0 - a0) * dx, bottom = a1 + (b1 - a1) * dx;
        out.at(c, y, x) = static_cast<uint8_t>(top + (bottom - top) * dy);
      }
    }
  return out;
}

Image rotate(const Image& img, double degrees, const WarpOptions& w) {
  // Output point p, centre o: the source is o + R (p - o) with R = [[cos, -sin], [sin, cos]] of the angle, in
  // image coordinates (y down), which turns the content counter-clockwise on screen. The matrix is computed as
  // PIL's Image.rotate does, operation for operation (the angle taken modulo 360 as Python's %, negated in
  // radians, cos and sin rounded to 15 decimals, the centre folded into the offsets), so a pixel centre that
  // lands exactly on a sample point in PIL does so here too; multiples of 90 degrees map centres onto centres.
  double deg = std::fmod(degrees, 360.0);
  if (deg < 0) deg += 360.0;
  const double a = -(deg * (std::numbers::pi / 180.0));
  auto r15 = [](double v) { return std::round(v * 1e15) / 1e15; };
  const double m0 = r15(std::cos(a)), m1 = r15(std::sin(a)), m3 = r15(-std::sin(a)), m4 = m0;
  const double ox = static_cast<double>(img.width) / 2.0, oy = static_cast<double>(img.height) / 2.0;
  const double m[6] = {m0, m1, (m0 * -ox + m1 * -oy) + ox, m3, m4, (m3 * -ox + m4 * -oy) + oy};
  return affine_warp(img, m, w);
}

Image shear_x(const Image& img, double factor, const WarpOptions& w) {
  const double m[6] = {1, factor, 0, 0, 1, 0};
  return affine_warp(img, m, w);
}

Image shear_y(const Image& img, double factor, const WarpOptions& w) {
  const double m[6] = {1, 0, 0, factor, 1, 0};
  return affine_warp(img, m, w);
}

Image translate(const Image& img, double dx, double dy, const WarpOptions& w) {
  const double m[6] = {1, 0, -dx, 0, 1, -dy};
  return affine_warp(img, m, w);
}

}  // namespace ht::data
