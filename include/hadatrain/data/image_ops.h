// The image operations RandAugment chooses from (data/rand_augment.h), on u8 images in HWC or CHW layout
// (outputs keep the input's layout). Each follows PIL's ImageOps / ImageEnhance / Image.transform, which timm's
// RandAugment calls and torchvision's tensor functions reproduce; where the two round differently, the op's
// comment says which one it follows.
//
// Note [Warp coordinates]
// The geometric ops map each output pixel back into the input: output pixel (x, y) has its centre at
// (x + 0.5, y + 0.5) in pixel-edge coordinates, the op's inverse map sends that point to (sx, sy), and the
// input is sampled there, as PIL's Image.transform does (which timm calls, and torchvision's RandAugment too on
// the PIL images of its classification recipe): a point outside [0, W) x [0, H) takes the fill value; inside,
// nearest takes input pixel (floor(sx), floor(sy)), and bilinear lerps the four pixels around
// (sx - 0.5, sy - 0.5) along x, then y, in doubles, with indices clamped to the image (the edge pixels
// repeat), and truncates to u8. (torchvision's tensor backend instead blends edge taps with the fill and
// rounds.)
#pragma once
#include <cstdint>
#include <vector>

#include "hadatrain/data/image.h"

namespace ht::data {

// ---- per-pixel ----

// 255 - p.
Image invert(const Image& img);
// Keeps the `bits` high bits of every value (0 <= bits <= 8): p & ~(2^(8 - bits) - 1).
Image posterize(const Image& img, int bits);
// p >= threshold ? 255 - p : p (0 <= threshold <= 256; 256 changes nothing).
Image solarize(const Image& img, int threshold);
// p < threshold ? min(255, p + add) : p (timm's solarize_add; add in [0, 255]).
Image solarize_add(const Image& img, int add, int threshold = 128);

// ---- per-channel histograms ----

// Per channel: lo = min, hi = max; when hi > lo every value becomes int(p * s - lo * s), s = 255 / (hi - lo), in
// doubles (PIL ImageOps.autocontrast with cutoff 0: exactly its table, which can be one below the exact
// quotient), otherwise the channel is unchanged.
Image auto_contrast(const Image& img);
// PIL ImageOps.equalize per channel: with h the channel's 256-bin histogram and step = (N - h[last non-empty
// bin]) / 255 (integer division), value v becomes min(255, (step / 2 + sum_{u < v} h[u]) / step); a channel
// with step 0 (one value, or almost all pixels in the top bin) is unchanged.
Image equalize(const Image& img);

// ---- blends with a degenerate image (PIL ImageEnhance) ----
// Each returns trunc(clamp(d + f * (p - d), 0, 255)) in f32, PIL's Image.blend, for a degenerate image d:
//   brightness: d = 0;
//   color (saturation): d = the pixel's luma L = (19595 R + 38470 G + 7471 B + 32768) >> 16 (PIL's "L"
//     conversion), in every channel; a one-channel image is its own luma (unchanged);
//   contrast: d = round(mean of L over the image) (one value);
//   sharpness: d = the image smoothed by [[1,1,1],[1,5,1],[1,1,1]] / 13 (rounded), the border pixels kept.
// f = 1 returns the image; f = 0 returns d. color and contrast need 1 or 3 channels.
Image adjust_brightness(const Image& img, float factor);
Image adjust_color(const Image& img, float factor);
Image adjust_contrast(const Image& img, float factor);
Image adjust_sharpness(const Image& img, float factor);

// ---- geometry (Note [Warp coordinates]) ----

enum class Resample : uint8_t { nearest, bilinear };

struct WarpOptions {
  Resample resample = Resample::bilinear;
  std::vector<uint8_t> fill;  // the value of pixels from outside the image: one per channel, or one for all
                              // (empty = 0)
};

// out(x, y) = in(a x + b y + c, d x + e y + f) in pixel-edge coordinates: `inverse` = {a, b, c, d, e, f}.
Image affine_warp(const Image& img, const double (&inverse)[6], const WarpOptions& w);
// Counter-clockwise by `degrees` about the image centre, same size (PIL Image.rotate, torchvision rotate).
Image rotate(const Image& img, double degrees, const WarpOptions& w);
// out(x, y) = in(x + factor y, y): PIL's affine (1, factor, 0, 0, 1, 0), about the top-left corner as timm and
// torchvision's RandAugment shear.
Image shear_x(const Image& img, double factor, const WarpOptions& w);
// out(x, y) = in(x, y + factor x).
Image shear_y(const Image& img, double factor, const WarpOptions& w);
// The content moves by (dx, dy) pixels: out(x, y) = in(x - dx, y - dy) (torchvision's affine translate).
Image translate(const Image& img, double dx, double dy, const WarpOptions& w);

}  // namespace ht::data
