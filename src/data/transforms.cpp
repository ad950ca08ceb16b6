// Image augmentations (crop, flip, bilinear resize, random-resized-crop, centre crop), normalisation and
// batch conversion. Geometry and draw order follow torchvision; see transforms.h for each contract.
#include "hadatrain/data/transforms.h"

#include <algorithm>
#include <cmath>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/factory.h"

namespace ht::data {
namespace {

void check_image(const Image& img, const char* op) {
  HT_CHECK(img.numel() > 0, "{}: empty image {}", op, img.describe());
  HT_CHECK(static_cast<int64_t>(img.pixels.size()) == img.numel(), "{}: image {} holds {} bytes, expected {}", op,
           img.describe(), img.pixels.size(), img.numel());
}

uint8_t round_to_u8(float v) {
  const float r = std::floor(v + 0.5f);
  return static_cast<uint8_t>(std::clamp(r, 0.0f, 255.0f));
}

// Note [Resampling taps]
// Output pixel o of a resize from `in` to `out` pixels covers the source interval centred at
// c = (o + 0.5) * in / out (in pixel-edge coordinates; source pixel x has its centre at x + 0.5).
// Its taps are the source pixels x with |x + 0.5 - c| < support, weighted by the triangle
// 1 - |x + 0.5 - c| / fs and normalised to sum 1, where fs = in / out when shrinking with antialiasing
// (the filter widens with the scale, as PIL and torchvision antialias=True) and fs = 1 otherwise, and
// support = fs. With fs = 1 this is exactly bilinear interpolation at source position c - 0.5 with the
// position clamped to [0, in - 1]: the renormalisation drops the missing neighbour at the borders.
struct Taps {
  std::vector<int64_t> first;  // (out) first source pixel
  std::vector<int64_t> count;  // (out) number of taps
  std::vector<float> weights;  // (out, max_taps)
  int64_t max_taps = 0;
};

Taps make_taps(int64_t in, int64_t out, Antialias aa) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double fs = (aa == Antialias::on && scale > 1.0) ? scale : 1.0;
  const double support = fs;
  Taps t;
  t.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<std::size_t>(out));
  t.count.resize(static_cast<std::size_t>(out));
  t.weights.assign(static_cast<std::size_t>(out * t.max_taps), 0.0f);
  for (int64_t o = 0; o < out; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    HT_ASSERT(hi > lo && hi - lo <= t.max_taps, "resize: {} taps for scale {}", hi - lo, scale);
    float* w = &t.weights[static_cast<std::size_t>(o * t.max_taps)];
    double total = 0;
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((static_cast<double>(x) + 0.5 - center) / fs);
      total += d < 1.0 ? 1.0 - d : 0.0;
    }
    HT_ASSERT(total > 0, "resize: no source pixel for output {} of {} -> {}", o, in, out);
    for (int64_t x = lo; x < hi; ++x) {
      const double d = std::abs((static_cast<double>(x) + 0.5 - center) / fs);
      w[x - lo] = static_cast<float>((d < 1.0 ? 1.0 - d : 0.0) / total);
    }
    t.first[static_cast<std::size_t>(o)] = lo;
    t.count[static_cast<std::size_t>(o)] = hi - lo;
  }
  return t;
}

// Python's round(): half to even (the default floating-point rounding mode).
int64_t round_half_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

}  // namespace

Image crop(const Image& img, const Rect& r) {
  check_image(img, "crop");
  HT_CHECK(r.height > 0 && r.width > 0, "crop: empty rectangle {}x{}", r.height, r.width);
  Image out = Image::zeros(r.height, r.width, img.channels, img.layout);
  const int64_t y0 = std::max<int64_t>(0, -r.top), y1 = std::min(r.height, img.height - r.top);
  const int64_t x0 = std::max<int64_t>(0, -r.left), x1 = std::min(r.width, img.width - r.left);
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) out.at(c, y, x) = img.at(c, r.top + y, r.left + x);
  return out;
}

Image hflip(const Image& img) {
  check_image(img, "hflip");
  Image out = Image::zeros(img.height, img.width, img.channels, img.layout);
  for (int64_t c = 0; c < img.channels; ++c)
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x) out.at(c, y, img.width - 1 - x) = img.at(c, y, x);
  return out;
}

Image resize_region(const Image& img, const Rect& src, int64_t out_h, int64_t out_w, Antialias aa) {
  check_image(img, "resize");
  HT_CHECK(out_h > 0 && out_w > 0, "resize: output size must be positive, got {}x{}", out_h, out_w);
  HT_CHECK(src.height > 0 && src.width > 0 && src.top >= 0 && src.left >= 0 && src.top + src.height <= img.height &&
               src.left + src.width <= img.width,
           "resize: region (top {}, left {}, {}x{}) is not inside the {} image", src.top, src.left, src.height,
           src.width, img.describe());
  const int64_t C = img.channels;
  const Taps tx = make_taps(src.width, out_w, aa), ty = make_taps(src.height, out_h, aa);
  const ImageStrides s = img.strides();
  const uint8_t* in = img.pixels.data() + img.offset(0, src.top, src.left);
  // Horizontal pass: (src.height, out_w, C) f32.
  std::vector<float> tmp(static_cast<std::size_t>(src.height * out_w * C));
  for (int64_t y = 0; y < src.height; ++y)
    for (int64_t ox = 0; ox < out_w; ++ox) {
      const int64_t first = tx.first[static_cast<std::size_t>(ox)], n = tx.count[static_cast<std::size_t>(ox)];
      const float* w = &tx.weights[static_cast<std::size_t>(ox * tx.max_taps)];
      for (int64_t c = 0; c < C; ++c) {
        const uint8_t* p = in + c * s.c + y * s.y + first * s.x;
        float acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += w[k] * static_cast<float>(p[k * s.x]);
        tmp[static_cast<std::size_t>((y * out_w + ox) * C + c)] = acc;
      }
    }
  // Vertical pass into the output, in the input's layout.
  Image out = Image::zeros(out_h, out_w, C, img.layout);
  for (int64_t oy = 0; oy < out_h; ++oy) {
    const int64_t first = ty.first[static_cast<std::size_t>(oy)], n = ty.count[static_cast<std::size_t>(oy)];
    const float* w = &ty.weights[static_cast<std::size_t>(oy * ty.max_taps)];
    for (int64_t ox = 0; ox < out_w; ++ox)
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += w[k] * tmp[static_cast<std::size_t>(((first + k) * out_w + ox) * C + c)];
        out.at(c, oy, ox) = round_to_u8(acc);
      }
  }
  return out;
}

Image resize(const Image& img, int64_t out_h, int64_t out_w, Antialias aa) {
  return resize_region(img, {0, 0, img.height, img.width}, out_h, out_w, aa);
}

Image resize_shorter(const Image& img, int64_t size, Antialias aa) {
  check_image(img, "resize_shorter");
  HT_CHECK(size > 0, "resize_shorter: size must be positive, got {}", size);
  int64_t h = size, w = size;
  if (img.height < img.width) w = size * img.width / img.height;
  else if (img.width < img.height) h = size * img.height / img.width;
  return resize(img, h, w, aa);
}

Rect center_crop_rect(int64_t height, int64_t width, int64_t out_h, int64_t out_w) {
  HT_CHECK(out_h > 0 && out_w > 0, "center_crop: crop size must be positive, got {}x{}", out_h, out_w);
  auto start = [](int64_t in, int64_t out) {
    return out > in ? -((out - in) / 2) : round_half_even(static_cast<double>(in - out) / 2.0);
  };
  return {start(height, out_h), start(width, out_w), out_h, out_w};
}

Image center_crop(const Image& img, int64_t out_h, int64_t out_w) {
  return crop(img, center_crop_rect(img.height, img.width, out_h, out_w));
}

Rect random_crop_rect(int64_t height, int64_t width, const RandomCropParams& p, SampleRng& rng) {
  HT_CHECK(p.height > 0 && p.width > 0 && p.padding >= 0, "random_crop: bad size {}x{} or padding {}", p.height,
           p.width, p.padding);
  const int64_t ph = height + 2 * p.padding, pw = width + 2 * p.padding;
  HT_CHECK(ph >= p.height && pw >= p.width,
           "random_crop: the {}x{} image padded by {} is smaller than the {}x{} crop", height, width, p.padding,
           p.height, p.width);
  const int64_t top = rng.randint(0, ph - p.height);
  const int64_t left = rng.randint(0, pw - p.width);
  return {top - p.padding, left - p.padding, p.height, p.width};
}

Image random_crop(const Image& img, const RandomCropParams& p, SampleRng& rng) {
  return crop(img, random_crop_rect(img.height, img.width, p, rng));
}

Image random_hflip(Image img, SampleRng& rng, float p) {
  if (rng.uniform() < p) return hflip(img);
  return img;
}

Rect random_resized_crop_rect(int64_t height, int64_t width, const RandomResizedCropParams& p, SampleRng& rng) {
  HT_CHECK(height > 0 && width > 0, "random_resized_crop: empty {}x{} image", height, width);
  HT_CHECK(p.scale_min > 0 && p.scale_min <= p.scale_max, "random_resized_crop: bad scale range ({}, {})",
           p.scale_min, p.scale_max);
  HT_CHECK(p.ratio_min > 0 && p.ratio_min <= p.ratio_max, "random_resized_crop: bad ratio range ({}, {})",
           p.ratio_min, p.ratio_max);
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_r0 = std::log(static_cast<double>(p.ratio_min)), log_r1 = std::log(static_cast<double>(p.ratio_max));
  for (int attempt = 0; attempt < p.attempts; ++attempt) {
    const double s = p.scale_min + (static_cast<double>(p.scale_max) - p.scale_min) * rng.uniform();
    const double r = std::exp(log_r0 + (log_r1 - log_r0) * rng.uniform());
    const int64_t w = round_half_even(std::sqrt(area * s * r));
    const int64_t h = round_half_even(std::sqrt(area * s / r));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = rng.randint(0, height - h);
      const int64_t left = rng.randint(0, width - w);
      return {top, left, h, w};
    }
  }
  // Fallback: the centre crop with the aspect ratio clamped into [ratio_min, ratio_max].
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < p.ratio_min) h = round_half_even(static_cast<double>(w) / p.ratio_min);
  else if (in_ratio > p.ratio_max) w = round_half_even(static_cast<double>(h) * p.ratio_max);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

Image random_resized_crop(const Image& img, const RandomResizedCropParams& p, SampleRng& rng) {
  check_image(img, "random_resized_crop");
  const Rect r = random_resized_crop_rect(img.height, img.width, p, rng);
  return resize_region(img, r, p.height, p.width, p.antialias);
}

void Normalize::check(int64_t channels) const {
  HT_CHECK(mean.size() == std.size(), "Normalize: {} means but {} standard deviations", mean.size(), std.size());
  if (mean.empty()) return;
  HT_CHECK(static_cast<int64_t>(mean.size()) == channels,
           "Normalize: statistics for {} channels, but the image has {} channels", mean.size(), channels);
  for (float s : std) HT_CHECK(s > 0, "Normalize: standard deviations must be positive, got {}", s);
}

void normalize_into(const Image& img, const Normalize& norm, float* out) {
  check_image(img, "normalize");
  norm.check(img.channels);
  const int64_t hw = img.height * img.width;
  for (int64_t c = 0; c < img.channels; ++c) {
    const float mean = norm.mean.empty() ? 0.0f : norm.mean[static_cast<std::size_t>(c)];
    const float sd = norm.std.empty() ? 1.0f : norm.std[static_cast<std::size_t>(c)];
    float* plane = out + c * hw;
    for (int64_t y = 0; y < img.height; ++y)
      for (int64_t x = 0; x < img.width; ++x)
        plane[y * img.width + x] = (static_cast<float>(img.at(c, y, x)) / 255.0f - mean) / sd;
  }
}

Tensor to_tensor(const Image& img, const Normalize& norm) {
  Tensor t = empty({img.channels, img.height, img.width}, {DType::f32});  // (C, H, W)
  normalize_into(img, norm, t.data<float>());
  return t;
}

Tensor to_batch(const std::vector<Image>& images, const Normalize& norm) {
  HT_CHECK(!images.empty(), "to_batch: no images");
  const Image& first = images.front();
  const auto n = static_cast<int64_t>(images.size());
  Tensor t = empty({n, first.channels, first.height, first.width}, {DType::f32});  // (N, C, H, W)
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const Image& img = images[static_cast<std::size_t>(i)];
    HT_CHECK(img.same_geometry(first), "to_batch: image {} is {}, image 0 is {}; a batch needs one size", i,
             img.describe(), first.describe());
    normalize_into(img, norm, p + i * first.numel());
  }
  return t;
}

Transform compose(std::vector<Transform> steps) {
  for (const auto& s : steps) HT_CHECK(static_cast<bool>(s), "compose: empty transform");
  return [steps = std::move(steps)](Image img, SampleRng& rng) {
    for (const auto& s : steps) img = s(std::move(img), rng);
    return img;
  };
}

Transform random_crop_transform(RandomCropParams p) {
  return [p](Image img, SampleRng& rng) { return random_crop(img, p, rng); };
}

Transform random_hflip_transform(float p) {
  return [p](Image img, SampleRng& rng) { return random_hflip(std::move(img), rng, p); };
}

Transform resize_transform(int64_t height, int64_t width) {
  HT_CHECK(height > 0 && width > 0, "resize_transform: size {}x{} must be positive", height, width);
  return [height, width](Image img, SampleRng&) {
    return img.height == height && img.width == width ? img : resize(img, height, width, Antialias::on);
  };
}

Transform random_resized_crop_transform(RandomResizedCropParams p) {
  return [p](Image img, SampleRng& rng) { return random_resized_crop(img, p, rng); };
}

Transform resize_shorter_transform(int64_t size, Antialias aa) {
  return [size, aa](Image img, SampleRng&) { return resize_shorter(img, size, aa); };
}

Transform center_crop_transform(int64_t out_h, int64_t out_w) {
  return [out_h, out_w](Image img, SampleRng&) { return center_crop(img, out_h, out_w); };
}

Transform cifar_train_transform() {
  return compose({random_crop_transform({32, 32, 4}), random_hflip_transform(0.5f)});
}

Transform imagenet_train_transform(int64_t size) {
  RandomResizedCropParams p;
  p.height = p.width = size;
  return compose({random_resized_crop_transform(p), random_hflip_transform(0.5f)});
}

Transform imagenet_eval_transform(int64_t resize, int64_t crop) {
  return compose({resize_shorter_transform(resize), center_crop_transform(crop, crop)});
}

}  // namespace ht::data
