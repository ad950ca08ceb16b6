// RandAugment (data/rand_augment.h, data/image_ops.h): every op against hand-computed pixels, the two
// policies' magnitude-to-argument maps, timm's string form, the per-sample draws (determinism, frequencies,
// jitter), the loader (any worker count, resume) and the data.rand_augment config keys and their errors.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "hadatrain/core/config_reader.h"
#include "hadatrain/data/dataset.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/data/rand_augment.h"
#include "hadatrain/train/trainer_config.h"
#include "support/catch.h"
#include "support/image_testing.h"
#include "support/testing.h"

using namespace ht;
using namespace ht::data;
using ht::test::error_of;

namespace {

// A one-channel h x w image from rows of values.
Image gray(const std::vector<std::vector<int>>& rows) {
  Image img = Image::zeros(static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size()), 1, ImageLayout::hwc);
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) img.at(0, y, x) = static_cast<uint8_t>(rows[y][x]);
  return img;
}

std::vector<std::vector<int>> rows_of(const Image& img, int64_t c = 0) {
  std::vector<std::vector<int>> r(static_cast<std::size_t>(img.height), std::vector<int>(static_cast<std::size_t>(img.width)));
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) r[y][x] = img.at(c, y, x);
  return r;
}

Image rgb(int64_t h, int64_t w, const std::vector<std::array<int, 3>>& px) {
  Image img = Image::zeros(h, w, 3, ImageLayout::hwc);
  for (int64_t i = 0; i < h * w; ++i)
    for (int64_t c = 0; c < 3; ++c) img.at(c, i / w, i % w) = static_cast<uint8_t>(px[i][c]);
  return img;
}

const WarpOptions kNearest{Resample::nearest, {7}};
const WarpOptions kBilinear{Resample::bilinear, {7}};

}  // namespace

TEST_CASE("rotations by multiples of 90 degrees move pixels exactly", "[data][rand_augment]") {
  const Image in = gray({{1, 2, 3}, {11, 12, 13}, {21, 22, 23}});
  for (const WarpOptions& w : {kNearest, kBilinear}) {
    // Counter-clockwise: the right column becomes the top row.
    CHECK(rows_of(rotate(in, 90, w)) == std::vector<std::vector<int>>{{3, 13, 23}, {2, 12, 22}, {1, 11, 21}});
    CHECK(rows_of(rotate(in, -90, w)) == std::vector<std::vector<int>>{{21, 11, 1}, {22, 12, 2}, {23, 13, 3}});
    CHECK(rows_of(rotate(in, 180, w)) == std::vector<std::vector<int>>{{23, 22, 21}, {13, 12, 11}, {3, 2, 1}});
    CHECK(rotate(in, 0, w).pixels == in.pixels);
  }
  // A 2x4 image turned by 90 keeps its size: the corners that leave it take the fill.
  const Image wide = gray({{1, 2, 3, 4}, {5, 6, 8, 9}});
  CHECK(rows_of(rotate(wide, 90, kNearest)) == std::vector<std::vector<int>>{{7, 3, 8, 7}, {7, 2, 6, 7}});
  // CHW and HWC agree channel by channel.
  const Image hwc = test::noise_image(3, 5, 4, ImageLayout::hwc, 3);
  const Image chw = to_layout(hwc, ImageLayout::chw);
  const Image a = rotate(hwc, 17, kBilinear), b = rotate(chw, 17, kBilinear);
  CHECK(to_layout(b, ImageLayout::hwc).pixels == a.pixels);
}

TEST_CASE("shear and translate with nearest shift rows and columns exactly", "[data][rand_augment]") {
  const Image in = gray({{1, 2, 3, 4}, {11, 12, 13, 14}, {21, 22, 23, 24}, {31, 32, 33, 34}});
  // shear_x 0.5: row y reads column floor(x + 0.5 + 0.5 (y + 0.5)) = x + 0, 1, 1, 2 for y = 0..3.
  CHECK(rows_of(shear_x(in, 0.5, kNearest)) ==
        std::vector<std::vector<int>>{{1, 2, 3, 4}, {12, 13, 14, 7}, {22, 23, 24, 7}, {33, 34, 7, 7}});
  // shear_y -0.5: column x reads row floor(y + 0.5 - 0.5 (x + 0.5)) = y + 0, -1, -1, -2.
  CHECK(rows_of(shear_y(in, -0.5, kNearest)) ==
        std::vector<std::vector<int>>{{1, 7, 7, 7}, {11, 2, 3, 7}, {21, 12, 13, 4}, {31, 22, 23, 14}});
  // The content moves right by 1 and up by 1.
  for (const WarpOptions& w : {kNearest, kBilinear})
    CHECK(rows_of(translate(in, 1, -1, w)) ==
          std::vector<std::vector<int>>{{7, 11, 12, 13}, {7, 21, 22, 23}, {7, 31, 32, 33}, {7, 7, 7, 7}});
  // Bilinear half-pixel shift (PIL): the mean of a pixel and its left neighbour, truncated (10 + 11 / 2 = 15.5 ->
  // 15); at the left edge the point is still inside the image and the edge pixel repeats (no fill).
  const Image row = gray({{10, 21, 30}});
  CHECK(rows_of(translate(row, 0.5, 0, {Resample::bilinear, {}})) == std::vector<std::vector<int>>{{10, 15, 25}});
  // Beyond half a pixel the left column's source point leaves the image: the fill.
  CHECK(rows_of(translate(row, 0.75, 0, kBilinear)) == std::vector<std::vector<int>>{{7, 12, 23}});
  // One fill value per channel.
  const Image two = rgb(1, 2, {{{1, 2, 3}}, {{4, 5, 6}}});
  const Image moved = translate(two, 1, 0, {Resample::nearest, {100, 110, 120}});
  CHECK(moved.pixels == std::vector<uint8_t>{100, 110, 120, 1, 2, 3});
  CHECK_THROWS_WITH(translate(two, 1, 0, {Resample::nearest, {1, 2}}), HasSubstr("2 fill values for a 3-channel"));
}

TEST_CASE("posterize, solarize, solarize_add and invert map values by their formulas", "[data][rand_augment]") {
  const Image in = gray({{0, 100, 127, 128, 183, 200, 255}});
  CHECK(rows_of(posterize(in, 3))[0] == std::vector<int>{0, 96, 96, 128, 160, 192, 224});  // keep 3 high bits
  CHECK(rows_of(posterize(in, 1))[0] == std::vector<int>{0, 0, 0, 128, 128, 128, 128});
  CHECK(rows_of(posterize(in, 0))[0] == std::vector<int>{0, 0, 0, 0, 0, 0, 0});
  CHECK(posterize(in, 8).pixels == in.pixels);
  CHECK(rows_of(solarize(in, 128))[0] == std::vector<int>{0, 100, 127, 127, 72, 55, 0});
  CHECK(solarize(in, 256).pixels == in.pixels);
  CHECK(solarize(in, 0).pixels == invert(in).pixels);
  CHECK(rows_of(invert(in))[0] == std::vector<int>{255, 155, 128, 127, 72, 55, 0});
  CHECK(rows_of(solarize_add(in, 50))[0] == std::vector<int>{50, 150, 177, 128, 183, 200, 255});
  CHECK(rows_of(solarize_add(in, 200))[0] == std::vector<int>{200, 255, 255, 128, 183, 200, 255});
  CHECK_THROWS_WITH(posterize(in, 9), HasSubstr("bits must be in [0, 8]"));
}

TEST_CASE("auto_contrast stretches each channel; equalize follows PIL's histogram lookup", "[data][rand_augment]") {
  // Channel 0 spans [50, 150]; channel 1 is constant (unchanged); channel 2 spans [0, 255] (unchanged).
  const Image in = rgb(1, 3, {{{50, 9, 0}}, {{100, 9, 128}}, {{150, 9, 255}}});
  const Image ac = auto_contrast(in);
  CHECK(rows_of(ac, 0)[0] == std::vector<int>{0, 127, 255});  // 50 * 2.55 = 127.5, truncated
  CHECK(rows_of(ac, 1)[0] == std::vector<int>{9, 9, 9});
  CHECK(rows_of(ac, 2)[0] == std::vector<int>{0, 128, 255});
  // PIL's table in doubles: 25 * (255 / 25) = 254.99999999999997, so the maximum maps to 254 (Pillow 9.4 gives
  // [0, 102, 254] for this row).
  CHECK(rows_of(auto_contrast(gray({{0, 10, 25}})))[0] == std::vector<int>{0, 102, 254});

  // 1020 pixels: 510 of value 10, 255 of 20, 255 of 30. step = (1020 - 255) / 255 = 3, n starts at 1:
  // 10 -> 1 / 3 = 0, 20 -> (1 + 510) / 3 = 170, 30 -> (1 + 765) / 3 = 255.
  Image h = Image::zeros(30, 34, 1, ImageLayout::hwc);
  for (std::size_t i = 0; i < h.pixels.size(); ++i) h.pixels[i] = i < 510 ? 10 : i < 765 ? 20 : 30;
  const Image eq = equalize(h);
  for (std::size_t i = 0; i < eq.pixels.size(); ++i)
    REQUIRE(eq.pixels[i] == (i < 510 ? 0 : i < 765 ? 170 : 255));
  // Too few pixels below the top value for a step: unchanged.
  const Image small = gray({{0, 64, 128, 255}});
  CHECK(equalize(small).pixels == small.pixels);
}

TEST_CASE("brightness, color, contrast and sharpness blend with their degenerate images", "[data][rand_augment]") {
  const Image g = gray({{0, 100, 101, 200}});
  CHECK(rows_of(adjust_brightness(g, 1.5f))[0] == std::vector<int>{0, 150, 151, 255});
  CHECK(rows_of(adjust_brightness(g, 0.5f))[0] == std::vector<int>{0, 50, 50, 100});  // 50.5 truncated
  CHECK(adjust_brightness(g, 1.0f).pixels == g.pixels);

  // Red (255, 0, 0) has luma (255 * 19595 + 32768) >> 16 = 76; grey (100, 100, 100) is its own luma.
  const Image c = rgb(1, 2, {{{255, 0, 0}}, {{100, 100, 100}}});
  CHECK(adjust_color(c, 0.0f).pixels == std::vector<uint8_t>{76, 76, 76, 100, 100, 100});
  CHECK(adjust_color(c, 0.5f).pixels == std::vector<uint8_t>{165, 38, 38, 100, 100, 100});  // 76 + 89.5
  CHECK(adjust_color(c, 2.0f).pixels == std::vector<uint8_t>{255, 0, 0, 100, 100, 100});
  CHECK(adjust_color(g, 0.0f).pixels == g.pixels);

  // Lumas 0 and 200: mean 100; lumas 0 and 201: mean 100.5, rounded to 101.
  const Image k = rgb(1, 2, {{{0, 0, 0}}, {{200, 200, 200}}});
  CHECK(adjust_contrast(k, 0.5f).pixels == std::vector<uint8_t>{50, 50, 50, 150, 150, 150});
  CHECK(adjust_contrast(k, 2.0f).pixels == std::vector<uint8_t>{0, 0, 0, 255, 255, 255});
  CHECK(adjust_contrast(k, 0.0f).pixels == std::vector<uint8_t>{100, 100, 100, 100, 100, 100});
  CHECK(rows_of(adjust_contrast(gray({{0, 201}}), 0.0f))[0] == std::vector<int>{101, 101});

  // Sharpness: the centre smooths to (5 * 130) / 13 = 50; the border keeps its values.
  const Image s = gray({{0, 0, 0}, {0, 130, 0}, {0, 0, 0}});
  CHECK(rows_of(adjust_sharpness(s, 0.0f)) == std::vector<std::vector<int>>{{0, 0, 0}, {0, 50, 0}, {0, 0, 0}});
  CHECK(rows_of(adjust_sharpness(s, 0.5f))[1] == std::vector<int>{0, 90, 0});
  CHECK(rows_of(adjust_sharpness(s, 2.0f))[1] == std::vector<int>{0, 210, 0});
  // An interior pixel among varied neighbours: (1+2+3+4+5*50+6+7+8+9) / 13 = 290 / 13 = 22.3 -> 22.
  const Image v = gray({{1, 2, 3}, {4, 50, 6}, {7, 8, 9}});
  CHECK(adjust_sharpness(v, 0.0f).at(0, 1, 1) == 22);
  CHECK_THROWS_WITH(adjust_color(Image::zeros(2, 2, 2, ImageLayout::hwc), 0.5f), HasSubstr("1- or 3-channel"));
}

TEST_CASE("each policy's op list and magnitude-to-argument map", "[data][rand_augment]") {
  RandAugmentOptions timm = RandAugmentOptions::timm_defaults();
  const auto tops = rand_augment_ops(timm);
  REQUIRE(tops.size() == 15);
  CHECK(std::find(tops.begin(), tops.end(), RandAugmentOp::invert) != tops.end());
  RandAugmentOptions tv = RandAugmentOptions::torchvision_defaults();
  const auto vops = rand_augment_ops(tv);
  REQUIRE(vops.size() == 14);
  CHECK(std::find(vops.begin(), vops.end(), RandAugmentOp::invert) == vops.end());
  CHECK(std::find(vops.begin(), vops.end(), RandAugmentOp::solarize_add) == vops.end());
  CHECK(vops.front() == RandAugmentOp::identity);

  const Image img = test::noise_image(3, 12, 10, ImageLayout::hwc, 5);
  auto step = [](RandAugmentOp op, double level, bool negate = false) {
    return RandAugmentStep{op, true, level, negate};
  };
  auto run = [&](const RandAugmentOptions& o, const RandAugmentStep& s) { return apply_rand_augment_step(img, s, o).pixels; };
  // timm, m9 (level 0.9), inc1.
  CHECK(run(timm, step(RandAugmentOp::posterize, 0.9)) == posterize(img, 1).pixels);  // 4 - int(3.6)
  CHECK(run(timm, step(RandAugmentOp::solarize, 0.9)) == solarize(img, 26).pixels);   // 256 - int(230.4)
  CHECK(run(timm, step(RandAugmentOp::solarize_add, 0.9)) == solarize_add(img, 99).pixels);
  // Factors 1 -+ 0.9 level (0.19, 1.81), 27 degrees, shear 0.27, translation 0.45 level x the side (4.05, 4.86 px).
  CHECK(run(timm, step(RandAugmentOp::brightness, 0.9, true)) ==
        adjust_brightness(img, static_cast<float>(1.0 - 0.9 * 0.9)).pixels);
  CHECK(run(timm, step(RandAugmentOp::sharpness, 0.9)) == adjust_sharpness(img, static_cast<float>(1.0 + 0.9 * 0.9)).pixels);
  CHECK(run(timm, step(RandAugmentOp::rotate, 0.9, true)) == rotate(img, -(30.0 * 0.9), timm.warp).pixels);
  CHECK(run(timm, step(RandAugmentOp::shear_y, 0.9)) == shear_y(img, 0.3 * 0.9, timm.warp).pixels);
  CHECK(run(timm, step(RandAugmentOp::translate_x, 0.9)) == translate(img, 0.45 * 0.9 * 10, 0, timm.warp).pixels);
  CHECK(run(timm, step(RandAugmentOp::translate_y, 0.9, true)) ==
        translate(img, 0, -(0.45 * 0.9 * 12), timm.warp).pixels);
  CHECK(run(timm, step(RandAugmentOp::translate_x, 0.9)) != translate(img, 4, 0, timm.warp).pixels);  // sub-pixel
  CHECK(run(timm, {RandAugmentOp::invert, false, 0.9, false}) == img.pixels);  // not applied
  // timm inc0: Posterize int(4 level) bits, Solarize threshold int(256 level), enhance 0.1 + 1.8 level unsigned.
  timm.increasing = false;
  CHECK(run(timm, step(RandAugmentOp::posterize, 0.9)) == posterize(img, 3).pixels);
  CHECK(run(timm, step(RandAugmentOp::solarize, 0.9)) == solarize(img, 230).pixels);
  CHECK(run(timm, step(RandAugmentOp::color, 0.9, true)) == adjust_color(img, static_cast<float>(0.1 + 1.8 * 0.9)).pixels);
  // torchvision, magnitude 9 of 31 bins (level 0.3).
  const double l = 9.0 / 30.0;
  CHECK(run(tv, step(RandAugmentOp::posterize, l)) == posterize(img, 7).pixels);   // 8 - round(1.2)
  CHECK(run(tv, step(RandAugmentOp::solarize, l)) == solarize(img, 179).pixels);   // values >= 178.5
  CHECK(run(tv, step(RandAugmentOp::translate_x, l, true)) == translate(img, -1, 0, tv.warp).pixels);  // int(1.36)
  CHECK(run(tv, step(RandAugmentOp::contrast, l, true)) == adjust_contrast(img, static_cast<float>(1.0 - 0.9 * l)).pixels);
  CHECK(run(tv, step(RandAugmentOp::identity, l)) == img.pixels);
}

TEST_CASE("timm's RandAugment strings", "[data][rand_augment]") {
  const RandAugmentOptions a = parse_rand_augment("rand-m9-mstd0.5-inc1");
  CHECK(a.policy == RandAugmentPolicy::timm);
  CHECK(a.magnitude == 9);
  CHECK(a.magnitude_std == 0.5);
  CHECK(a.increasing);
  CHECK(a.num_ops == 2);
  CHECK(a.prob == 0.5);
  const RandAugmentOptions b = parse_rand_augment("rand-n3-p1.0");
  CHECK(b.num_ops == 3);
  CHECK(b.prob == 1.0);
  CHECK(b.magnitude == 10);  // timm's default magnitude
  CHECK_FALSE(b.increasing);
  CHECK(b.magnitude_std == 0);
  CHECK_THROWS_WITH(parse_rand_augment("rand-m9-x7"), HasSubstr("part 'x7' of 'rand-m9-x7': unknown part"));
  CHECK_THROWS_WITH(parse_rand_augment("rand-m11"), HasSubstr("part 'm11' of 'rand-m11': the magnitude must be in [0, 10]"));
  CHECK_THROWS_WITH(parse_rand_augment("rand-inc2"), HasSubstr("inc must be 0 or 1"));
  CHECK_THROWS_WITH(parse_rand_augment("rand-mstd"), HasSubstr("expected a number after 'mstd'"));
  CHECK_THROWS_WITH(parse_rand_augment("augmix-m5"), HasSubstr("not a RandAugment string"));
}

TEST_CASE("the draws: deterministic per sample, uniform over ops, timm's jitter and signs", "[data][rand_augment]") {
  const RandAugmentOptions o = RandAugmentOptions::timm_defaults();
  const Image img = test::noise_image(3, 24, 20, ImageLayout::hwc, 11);
  auto sample = [&](int64_t index) {
    SampleRng rng = SampleRng::for_sample(42, 3, index);
    return rand_augment(img, o, rng).pixels;
  };
  CHECK(sample(5) == sample(5));
  // Different samples draw different ops: 16 samples give many distinct op sequences.
  std::set<std::vector<int>> sequences;
  int changed = 0;
  for (int64_t i = 0; i < 16; ++i) {
    SampleRng rng = SampleRng::for_sample(42, 3, i);
    std::vector<int> seq;
    for (const RandAugmentStep& s : draw_rand_augment(o, rng)) seq.push_back(s.applied ? static_cast<int>(s.op) : -1);
    sequences.insert(seq);
    changed += sample(i) != img.pixels;
  }
  CHECK(sequences.size() >= 10);
  CHECK(changed >= 8);

  // Frequencies over many samples: each of the 15 ops ~1/15, applied ~1/2, the level ~ N(0.9, 0.05) clipped
  // at 1, signed ops negated ~1/2.
  std::map<RandAugmentOp, int> count;
  int applied = 0, negated = 0, signed_ops = 0;
  double sum = 0, sum2 = 0;
  const int n = 6000;
  for (int64_t i = 0; i < n / 2; ++i) {
    SampleRng rng = SampleRng::for_sample(1, 0, i);
    for (const RandAugmentStep& s : draw_rand_augment(o, rng)) {
      ++count[s.op];
      if (!s.applied) continue;
      ++applied;
      sum += s.level;
      sum2 += s.level * s.level;
      const bool is_signed = s.op == RandAugmentOp::rotate || s.op == RandAugmentOp::brightness ||
                             s.op == RandAugmentOp::shear_x || s.op == RandAugmentOp::translate_y;
      if (is_signed) {
        ++signed_ops;
        negated += s.negate;
      }
      if (s.op == RandAugmentOp::equalize) CHECK_FALSE(s.negate);
    }
  }
  REQUIRE(count.size() == 15);
  for (const auto& [op, k] : count) CHECK(std::abs(k - n / 15) < 90);  // 400 +- 4.5 sigma
  CHECK(std::abs(applied - n / 2) < 180);
  const double mean = sum / applied, sd = std::sqrt(sum2 / applied - mean * mean);
  CHECK(mean == Approx(0.899).margin(0.004));  // clipping at 1 pulls the mean of N(0.9, 0.05) down a little
  CHECK(sd == Approx(0.049).margin(0.004));
  CHECK(std::abs(negated - signed_ops / 2) < 4.5 * std::sqrt(signed_ops / 4.0));

  // torchvision: every op runs at the fixed level 9 / 30.
  SampleRng rng = SampleRng::for_sample(1, 0, 0);
  for (const RandAugmentStep& s : draw_rand_augment(RandAugmentOptions::torchvision_defaults(), rng)) {
    CHECK(s.applied);
    CHECK(s.level == 9.0 / 30.0);
  }
}

namespace {

// Sample i: a 12x10 RGB noise image seeded by i, label i % 5.
class NoiseDataset final : public Dataset {
 public:
  int64_t size() const override { return 40; }
  Sample get(int64_t i, SampleRng&) const override {
    return {test::noise_image(3, 12, 10, ImageLayout::hwc, static_cast<uint32_t>(i) + 1), i % 5};
  }
};

std::vector<std::vector<float>> all_batches(std::shared_ptr<const Dataset> ds, int workers, int epochs,
                                            LoaderPosition start = {}) {
  LoaderOptions o;
  o.batch_size = 6;
  o.num_workers = workers;
  o.prefetch = 3;
  o.seed = 77;
  DataLoader loader(std::move(ds), o, start);
  std::vector<std::vector<float>> out;
  for (int e = 0; e < epochs; ++e)
    while (auto b = loader.next()) out.push_back(b->at("image").to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("through the loader: the same batches for any worker count and after a resume", "[data][rand_augment]") {
  const auto base = std::make_shared<NoiseDataset>();
  const auto ds = with_transform(base, compose({random_hflip_transform(0.5f),
                                                rand_augment_transform(RandAugmentOptions::timm_defaults())}));
  const auto full = all_batches(ds, 0, 2);  // 7 batches per epoch
  REQUIRE(full.size() == 14);
  CHECK(all_batches(ds, 3, 2) == full);
  const auto rest = all_batches(ds, 2, 1, {1, 3});
  REQUIRE(rest.size() == 4);
  for (std::size_t i = 0; i < rest.size(); ++i) CHECK(rest[i] == full[10 + i]);
  // The augmentation changes the images.
  CHECK(all_batches(with_transform(base, random_hflip_transform(0.5f)), 0, 1)[0] != full[0]);
}

TEST_CASE("data.rand_augment: a section, timm's string, and errors naming the key", "[data][rand_augment][config]") {
  auto read = [](const std::string& yaml) {
    return train::read_trainer_config(ConfigReader::from_string(yaml, "ra.yaml")).data.rand_augment;
  };
  CHECK_FALSE(read("data: {batch_size: 8}\n").has_value());
  const auto s = read("data:\n  rand_augment: \"rand-m7-mstd0.5-inc1\"\n");
  REQUIRE(s.has_value());
  CHECK(s->magnitude == 7);
  CHECK(s->increasing);
  // One fill value per channel of CIFAR's RGB images (the default dataset, Fashion-MNIST, has one channel).
  const auto t = read("data:\n  dataset: cifar10\n  root: /x\n"
                      "  rand_augment: {policy: torchvision, magnitude: 9, interpolation: nearest, fill: [1, 2, 3]}\n");
  REQUIRE(t.has_value());
  CHECK(t->policy == RandAugmentPolicy::torchvision);
  CHECK(t->prob == 1.0);
  CHECK(t->magnitude_std == 0);
  CHECK(t->warp.resample == Resample::nearest);
  CHECK(t->warp.fill == std::vector<uint8_t>{1, 2, 3});
  const auto d = read("data:\n  rand_augment: {}\n");  // a section of defaults: timm's rand-m9-mstd0.5-inc1
  REQUIRE(d.has_value());
  CHECK(d->magnitude == 9);
  CHECK(d->magnitude_std == 0.5);
  CHECK(d->prob == 0.5);

  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: rand-m9-x7\n"); }),
             HasSubstr("data.rand_augment: part 'x7' of 'rand-m9-x7': unknown part"));
  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: {magnitude: 11}\n"); }),
             HasSubstr("data.rand_augment.magnitude: expected a number in [0, 10], got 11"));
  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: {policy: torchvision, magnitude: 31}\n"); }),
             HasSubstr("data.rand_augment.magnitude: expected a number in [0, 30], got 31"));
  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: {policy: torchvision, increasing: true}\n"); }),
             HasSubstr("data.rand_augment.increasing: applies to policy timm only"));
  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: {num_op: 2}\n"); }),
             HasSubstr("data.rand_augment.num_op: unknown key"));
  CHECK_THAT(error_of([&] { read("data:\n  rand_augment: {fill: [256]}\n"); }), HasSubstr("data.rand_augment.fill"));
}
