// Data-layer transforms: the per-sample Philox stream, crops/flips against hand-computed results, bilinear
// resizing against naive references, centre-crop geometry, random-resized-crop draws, normalisation.
#include <cmath>

#include "hadatrain/data/transforms.h"
#include "support/catch.h"
#include "support/image_testing.h"

using namespace ht;
using namespace ht::data;

namespace {

// A c x h x w image whose pixel (c, y, x) is (31 c + 7 y + 3 x + 1) mod 256, in the given layout.
Image pattern(int64_t c, int64_t h, int64_t w, ImageLayout layout) {
  Image img = Image::zeros(h, w, c, layout);
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) img.at(k, y, x) = static_cast<uint8_t>((31 * k + 7 * y + 3 * x + 1) % 256);
  return img;
}

// PyTorch upsample_bilinear2d (align_corners=False) at one output pixel, in double.
double bilinear_ref(const Image& img, int64_t c, int64_t oy, int64_t ox, int64_t out_h, int64_t out_w) {
  auto src = [](int64_t o, int64_t in, int64_t out) {
    const double s = (o + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5;
    return std::max(s, 0.0);
  };
  const double sy = src(oy, img.height, out_h), sx = src(ox, img.width, out_w);
  const int64_t y0 = static_cast<int64_t>(sy), x0 = static_cast<int64_t>(sx);
  const int64_t y1 = std::min(y0 + 1, img.height - 1), x1 = std::min(x0 + 1, img.width - 1);
  const double ly = sy - y0, lx = sx - x0;
  return (1 - ly) * ((1 - lx) * img.at(c, y0, x0) + lx * img.at(c, y0, x1)) +
         ly * ((1 - lx) * img.at(c, y1, x0) + lx * img.at(c, y1, x1));
}

// Antialiased (triangle filter of width scale) resampling, written directly as a 2-D weighted sum.
double antialias_ref(const Image& img, int64_t c, int64_t oy, int64_t ox, int64_t out_h, int64_t out_w) {
  auto weights = [](int64_t o, int64_t in, int64_t out) {
    const double scale = static_cast<double>(in) / out, fs = std::max(scale, 1.0);
    const double center = (o + 0.5) * scale;
    std::vector<double> w(static_cast<std::size_t>(in));
    double total = 0;
    for (int64_t x = 0; x < in; ++x) {
      const double d = std::abs(x + 0.5 - center) / fs;
      w[static_cast<std::size_t>(x)] = d < 1 ? 1 - d : 0;
      total += w[static_cast<std::size_t>(x)];
    }
    for (auto& v : w) v /= total;
    return w;
  };
  const auto wy = weights(oy, img.height, out_h), wx = weights(ox, img.width, out_w);
  double acc = 0;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) acc += wy[static_cast<std::size_t>(y)] * wx[static_cast<std::size_t>(x)] * img.at(c, y, x);
  return acc;
}

// Largest |actual - reference| over the image.
template <class Ref>
double max_error(const Image& out, Ref ref) {
  double worst = 0;
  for (int64_t c = 0; c < out.channels; ++c)
    for (int64_t y = 0; y < out.height; ++y)
      for (int64_t x = 0; x < out.width; ++x) worst = std::max(worst, std::abs(out.at(c, y, x) - ref(c, y, x)));
  return worst;
}

int64_t multiply_shift(uint32_t word, int64_t range) {
  return static_cast<int64_t>((static_cast<uint64_t>(word) * static_cast<uint64_t>(range)) >> 32);
}

}  // namespace

TEST_CASE("SampleRng draws the Philox words of its (seed, epoch, index) stream", "[data][rng]") {
  const uint64_t seed = 0xDEADBEEF12345ull;
  const uint64_t stream = data_stream(RngPurpose::augment, 3, 1234);
  CHECK(stream == ((uint64_t{3} << 40) | 1234));
  CHECK(data_stream(RngPurpose::shuffle, 3, 0) == ((uint64_t{1} << 62) | (uint64_t{3} << 40)));
  SampleRng rng = SampleRng::for_sample(seed, 3, 1234);
  for (uint64_t k = 0; k < 9; ++k) CHECK(rng.next_u32() == philox_word(seed, stream, k));
  CHECK(rng.draws() == 9);
  // randint is multiply-shift of one word; below() uses two words (low first).
  SampleRng a(seed, stream), b(seed, stream);
  CHECK(a.randint(5, 13) == 5 + multiply_shift(philox_word(seed, stream, 0), 9));
  const uint64_t w64 = philox_word(seed, stream, 1) | (uint64_t{philox_word(seed, stream, 2)} << 32);
  CHECK(a.below(1000) == static_cast<uint64_t>((static_cast<unsigned __int128>(w64) * 1000) >> 64));
  CHECK(b.uniform() == uniform_from_word(philox_word(seed, stream, 0)));
  // Different samples and epochs have different streams.
  CHECK(SampleRng::for_sample(seed, 3, 1235).next_u32() != SampleRng::for_sample(seed, 3, 1234).next_u32());
  CHECK(SampleRng::for_sample(seed, 4, 1234).next_u32() != SampleRng::for_sample(seed, 3, 1234).next_u32());
  CHECK_THROWS_WITH(data_stream(RngPurpose::augment, kMaxRngEpoch + 1, 0), HasSubstr("epoch"));
  CHECK_THROWS_WITH(data_stream(RngPurpose::augment, 0, -1), HasSubstr("sample index"));
  CHECK_THROWS_WITH(a.randint(3, 2), HasSubstr("empty range"));
}

TEST_CASE("crop with zero padding and hflip match hand-written pixels", "[data][transforms]") {
  for (ImageLayout layout : {ImageLayout::chw, ImageLayout::hwc}) {
    const Image img = pattern(3, 4, 5, layout);
    const Image c = crop(img, {-1, 2, 3, 4});  // rows -1..1, columns 2..5
    REQUIRE(c.height == 3);
    REQUIRE(c.width == 4);
    CHECK(c.layout == layout);
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t y = 0; y < 3; ++y)
        for (int64_t x = 0; x < 4; ++x) {
          const int64_t sy = y - 1, sx = x + 2;
          const int expected = (sy < 0 || sx >= 5) ? 0 : (31 * k + 7 * sy + 3 * sx + 1) % 256;
          CHECK(c.at(k, y, x) == expected);
        }
    const Image f = hflip(img);
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 5; ++x) CHECK(f.at(k, y, x) == img.at(k, y, 4 - x));
  }
  // Layout conversion keeps every pixel.
  const Image chw = pattern(2, 3, 4, ImageLayout::chw);
  const Image hwc = to_layout(chw, ImageLayout::hwc);
  CHECK(hwc.pixels[1] == chw.at(1, 0, 0));  // HWC: channel 1 of pixel (0, 0) comes second
  CHECK(to_layout(hwc, ImageLayout::chw).pixels == chw.pixels);
  CHECK_THROWS_WITH(crop(chw, {0, 0, 0, 2}), HasSubstr("empty rectangle"));
}

TEST_CASE("random crop offsets come from the sample's first two words", "[data][transforms]") {
  const uint64_t seed = 77;
  for (int64_t index : {0, 1, 2, 3, 500}) {
    const uint64_t stream = data_stream(RngPurpose::augment, 2, index);
    // CIFAR: 32x32 padded by 4 -> 40x40, a 32x32 window: offsets in [0, 8] (9 values), then minus the padding.
    const int64_t top = multiply_shift(philox_word(seed, stream, 0), 9) - 4;
    const int64_t left = multiply_shift(philox_word(seed, stream, 1), 9) - 4;
    SampleRng rng = SampleRng::for_sample(seed, 2, index);
    const Image img = pattern(3, 32, 32, ImageLayout::chw);
    const Image out = random_crop(img, {32, 32, 4}, rng);
    CHECK(rng.draws() == 2);
    CHECK(out.height == 32);
    CHECK(out.width == 32);
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t y = 0; y < 32; ++y)
        for (int64_t x = 0; x < 32; ++x) {
          const int64_t sy = y + top, sx = x + left;
          const bool inside = sy >= 0 && sy < 32 && sx >= 0 && sx < 32;
          REQUIRE(out.at(k, y, x) == (inside ? img.at(k, sy, sx) : 0));
        }
  }
  SampleRng rng(1, 2);
  CHECK_THROWS_WITH(random_crop_rect(10, 10, {32, 32, 4}, rng), HasSubstr("smaller than"));
}

TEST_CASE("random_hflip flips exactly when the first uniform is below p", "[data][transforms]") {
  const Image img = pattern(3, 2, 5, ImageLayout::hwc);
  int flipped = 0;
  for (int64_t index = 0; index < 64; ++index) {
    const bool expect = uniform_from_word(philox_word(9, data_stream(RngPurpose::augment, 0, index), 0)) < 0.5f;
    SampleRng rng = SampleRng::for_sample(9, 0, index);
    const Image out = random_hflip(img, rng);
    CHECK(out.pixels == (expect ? hflip(img) : img).pixels);
    flipped += expect;
  }
  CHECK(flipped > 16);  // both outcomes occur
  CHECK(flipped < 48);
  SampleRng never(1, 1), always(1, 1);
  CHECK(random_hflip(img, never, 0.0f).pixels == img.pixels);
  CHECK(random_hflip(img, always, 1.0f).pixels == hflip(img).pixels);
}

TEST_CASE("bilinear resize matches naive references", "[data][transforms]") {
  for (ImageLayout layout : {ImageLayout::chw, ImageLayout::hwc}) {
    const Image img = test::noise_image(3, 5, 7, layout, 11);
    // Enlarging: plain bilinear, and antialiasing changes nothing.
    for (Antialias aa : {Antialias::off, Antialias::on}) {
      const Image up = resize(img, 9, 12, aa);
      CHECK(up.layout == layout);
      CHECK(max_error(up, [&](int64_t c, int64_t y, int64_t x) { return bilinear_ref(img, c, y, x, 9, 12); }) <= 0.501);
    }
    // Shrinking without antialiasing: 2x2 taps at the half-pixel positions.
    const Image big = test::noise_image(2, 13, 11, layout, 5);
    const Image down = resize(big, 4, 5, Antialias::off);
    CHECK(max_error(down, [&](int64_t c, int64_t y, int64_t x) { return bilinear_ref(big, c, y, x, 4, 5); }) <= 0.501);
    // Shrinking with antialiasing: the widened triangle filter.
    const Image aa = resize(big, 4, 5, Antialias::on);
    CHECK(max_error(aa, [&](int64_t c, int64_t y, int64_t x) { return antialias_ref(big, c, y, x, 4, 5); }) <= 0.501);
    // Mixed: taller and narrower at once.
    const Image mixed = resize(big, 20, 3, Antialias::on);
    CHECK(max_error(mixed, [&](int64_t c, int64_t y, int64_t x) { return antialias_ref(big, c, y, x, 20, 3); }) <= 0.501);
    // A same-size resize is the identity.
    CHECK(resize(big, 13, 11).pixels == big.pixels);
    // Resizing a region = resizing the cropped image.
    const Rect r{2, 3, 8, 6};
    CHECK(resize_region(big, r, 5, 9).pixels == resize(crop(big, r), 5, 9).pixels);
  }
  // A 2x2 image upsampled to 4x4 by hand: rows/cols at source positions -0.25 -> 0, 0.25, 0.75, 1.25 -> 1.
  Image tiny = Image::zeros(2, 2, 1, ImageLayout::chw);
  tiny.pixels = {0, 100, 200, 40};
  const Image up = resize(tiny, 4, 4, Antialias::off);
  CHECK(up.at(0, 0, 0) == 0);
  CHECK(up.at(0, 0, 1) == 25);   // 0.75 * 0 + 0.25 * 100
  CHECK(up.at(0, 0, 2) == 75);
  CHECK(up.at(0, 0, 3) == 100);
  CHECK(up.at(0, 3, 0) == 200);
  CHECK(up.at(0, 1, 1) == 59);   // 0.75 (0.75*0 + 0.25*100) + 0.25 (0.75*200 + 0.25*40) = 18.75 + 40 = 58.75
  CHECK_THROWS_WITH(resize_region(tiny, {1, 1, 2, 2}, 3, 3), HasSubstr("not inside"));
}

TEST_CASE("resize of the shorter side and centre crop follow torchvision geometry", "[data][transforms]") {
  const Image land = Image::zeros(375, 500, 3, ImageLayout::hwc);
  const Image r1 = resize_shorter(land, 256);
  CHECK(r1.height == 256);
  CHECK(r1.width == 341);  // int(256 * 500 / 375) = int(341.33)
  const Image port = Image::zeros(500, 333, 1, ImageLayout::hwc);
  const Image r2 = resize_shorter(port, 256);
  CHECK(r2.width == 256);
  CHECK(r2.height == 384);  // int(256 * 500 / 333) = int(384.38)

  // top = round((H - 224) / 2) with Python's half-to-even rounding.
  CHECK(center_crop_rect(257, 300, 224, 224) == Rect{16, 38, 224, 224});  // 16.5 -> 16
  CHECK(center_crop_rect(259, 224, 224, 224) == Rect{18, 0, 224, 224});   // 17.5 -> 18
  CHECK(center_crop_rect(256, 341, 224, 224) == Rect{16, 58, 224, 224});  // 58.5 -> 58
  // A crop larger than the image pads with zeros: (8 - 5) / 2 = 1 row before, 2 after.
  CHECK(center_crop_rect(5, 6, 8, 6) == Rect{-1, 0, 8, 6});
  const Image img = pattern(1, 5, 6, ImageLayout::chw);
  const Image c = center_crop(img, 8, 6);
  CHECK(c.at(0, 0, 3) == 0);
  CHECK(c.at(0, 1, 3) == img.at(0, 0, 3));
  CHECK(c.at(0, 5, 0) == img.at(0, 4, 0));
  CHECK(c.at(0, 6, 0) == 0);
  CHECK(c.at(0, 7, 5) == 0);
  const Image c2 = center_crop(pattern(2, 7, 9, ImageLayout::hwc), 3, 4);
  CHECK(c2.at(1, 0, 0) == pattern(2, 7, 9, ImageLayout::hwc).at(1, 2, 2));  // top 2, left round(2.5) = 2
}

TEST_CASE("random resized crop: draw order, fit, and the centre fallback", "[data][transforms]") {
  // Scale and ratio fixed: the window is 20x20 on a 40x40 image; top/left are the 3rd and 4th words.
  RandomResizedCropParams p;
  p.height = p.width = 8;
  p.scale_min = p.scale_max = 0.25f;
  p.ratio_min = p.ratio_max = 1.0f;
  const uint64_t seed = 5;
  for (int64_t index = 0; index < 8; ++index) {
    const uint64_t stream = data_stream(RngPurpose::augment, 1, index);
    SampleRng rng = SampleRng::for_sample(seed, 1, index);
    const Rect r = random_resized_crop_rect(40, 40, p, rng);
    CHECK(r.height == 20);
    CHECK(r.width == 20);
    CHECK(r.top == multiply_shift(philox_word(seed, stream, 2), 21));
    CHECK(r.left == multiply_shift(philox_word(seed, stream, 3), 21));
    CHECK(rng.draws() == 4);
  }
  // A 10x20 image cannot hold a square of its full area: all 10 tries fail (2 draws each), then the centre
  // crop with the ratio clamped to 1: 10x10 at left (20 - 10) / 2.
  p.scale_min = p.scale_max = 1.0f;
  SampleRng rng(3, 4);
  CHECK(random_resized_crop_rect(10, 20, p, rng) == Rect{0, 5, 10, 10});
  CHECK(rng.draws() == 20);
  // Tall image, ratio range [3/4, 4/3], no try can fit (scale 1 with ratio != 1... forced by attempts = 0):
  RandomResizedCropParams q;
  q.attempts = 0;
  SampleRng rng2(3, 4);
  CHECK(random_resized_crop_rect(100, 30, q, rng2) == Rect{30, 0, 40, 30});  // h = round(30 / 0.75) = 40
  CHECK(random_resized_crop_rect(30, 100, q, rng2) == Rect{0, 30, 30, 40});  // w = round(30 * 4/3) = 40
  CHECK(random_resized_crop_rect(30, 35, q, rng2) == Rect{0, 0, 30, 35});    // ratio inside the range
  // Default parameters: every chosen window lies inside the image with area and ratio in range.
  RandomResizedCropParams d;
  int fitted = 0;
  for (int64_t index = 0; index < 300; ++index) {
    SampleRng r = SampleRng::for_sample(11, 0, index);
    const Rect w = random_resized_crop_rect(120, 160, d, r);
    REQUIRE(w.top >= 0);
    REQUIRE(w.left >= 0);
    REQUIRE(w.top + w.height <= 120);
    REQUIRE(w.left + w.width <= 160);
    const double area = static_cast<double>(w.height) * w.width / (120.0 * 160.0);
    const double ratio = static_cast<double>(w.width) / w.height;
    if (r.draws() <= 20) {  // found by a try (not the fallback)
      ++fitted;
      CHECK(area > 0.07);
      CHECK(ratio > 0.7);
      CHECK(ratio < 1.4);
    }
  }
  CHECK(fitted == 300);
  // The image path resizes the chosen window.
  const Image img = test::noise_image(3, 40, 40, ImageLayout::hwc, 3);
  SampleRng r1 = SampleRng::for_sample(seed, 1, 0), r2 = SampleRng::for_sample(seed, 1, 0);
  p.scale_min = p.scale_max = 0.25f;
  const Image out = random_resized_crop(img, p, r1);
  CHECK(out.height == 8);
  CHECK(out.width == 8);
  CHECK(out.pixels == resize_region(img, random_resized_crop_rect(40, 40, p, r2), 8, 8).pixels);
}

TEST_CASE("normalisation and batch conversion write (N, C, H, W) f32", "[data][transforms]") {
  Image a = Image::zeros(2, 2, 3, ImageLayout::hwc);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < 2; ++y)
      for (int64_t x = 0; x < 2; ++x) a.at(c, y, x) = static_cast<uint8_t>(c == 0 ? 255 : 10 * (y * 2 + x) + c);
  const Normalize n = Normalize::cifar10();
  const Tensor t = to_tensor(a, n);
  REQUIRE(t.shape() == Shape{3, 2, 2});
  const auto v = t.to_vector<double>();
  CHECK(v[0] == Approx((1.0 - 0.4914) / 0.2470).epsilon(1e-6));           // channel 0 = 255
  CHECK(v[4 + 3] == Approx((31.0 / 255 - 0.4822) / 0.2435).epsilon(1e-6));  // channel 1, pixel (1, 1) = 31
  CHECK(v[8 + 2] == Approx((22.0 / 255 - 0.4465) / 0.2616).epsilon(1e-6));  // channel 2, pixel (1, 0) = 22
  const Tensor u = to_tensor(a, Normalize::unit());
  CHECK(u.to_vector<double>()[5] == Approx(11.0 / 255).epsilon(1e-6));  // channel 1, pixel (0, 1)

  const Image b = to_layout(a, ImageLayout::chw);
  const Tensor batch = to_batch({a, b, hflip(b)}, n);
  REQUIRE(batch.shape() == Shape{3, 3, 2, 2});
  const auto bv = batch.to_vector<double>();
  for (int i = 0; i < 12; ++i) {
    CHECK(bv[static_cast<std::size_t>(i)] == v[static_cast<std::size_t>(i)]);       // same pixels, either layout
    CHECK(bv[static_cast<std::size_t>(12 + i)] == v[static_cast<std::size_t>(i)]);
  }
  CHECK(bv[24 + 4 + 0] == v[4 + 1]);  // flipped: channel 1, (0, 0) <- (0, 1)
  CHECK_THROWS_WITH(to_batch({a, Image::zeros(3, 2, 3, ImageLayout::hwc)}, n), HasSubstr("one size"));
  CHECK_THROWS_WITH(to_tensor(Image::zeros(2, 2, 1, ImageLayout::hwc), n), HasSubstr("1 channels"));
}

TEST_CASE("composed recipes are deterministic per (seed, epoch, index)", "[data][transforms]") {
  const Image img = test::noise_image(3, 32, 32, ImageLayout::chw, 9);
  const Transform t = cifar_train_transform();
  SampleRng r1 = SampleRng::for_sample(1, 0, 5), r2 = SampleRng::for_sample(1, 0, 5);
  const Image a = t(img, r1);
  CHECK(a.pixels == t(img, r2).pixels);
  CHECK(r1.draws() == 3);  // top, left, flip
  // Same as doing the steps by hand with one stream.
  SampleRng r3 = SampleRng::for_sample(1, 0, 5);
  CHECK(a.pixels == random_hflip(random_crop(img, {32, 32, 4}, r3), r3).pixels);
  const Image big = test::noise_image(3, 300, 400, ImageLayout::hwc, 2);
  SampleRng r4 = SampleRng::for_sample(1, 0, 5);
  const Image tr = imagenet_train_transform(224)(big, r4);
  CHECK(tr.height == 224);
  CHECK(tr.width == 224);
  const Image ev = imagenet_eval_transform(256, 224)(big, r4);
  CHECK(ev.pixels == center_crop(resize_shorter(big, 256), 224, 224).pixels);
}
