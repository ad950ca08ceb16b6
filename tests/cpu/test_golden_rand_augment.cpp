// RandAugment's image operations (data/image_ops.h) against Pillow, pixel for pixel: the fixture is written by
// tools/golden/pil_rand_augment.py (numpy and Pillow only) and holds a 13x11 RGB image and Pillow's output for
// each op and argument: autocontrast, equalize, invert, posterize, solarize (including torchvision's float
// threshold), the four ImageEnhance blends, and rotate / shear / translate with nearest and bilinear resampling
// and a fill colour.
// HT_FIXTURES: rand_augment_pil.safetensors
#include <cstring>
#include <functional>
#include <string>

#include "hadatrain/data/image_ops.h"
#include "hadatrain/io/safetensors.h"
#include "support/catch.h"
#include "support/image_testing.h"

using namespace ht;
using namespace ht::data;

namespace {

// The number of values of `ours` that differ from Pillow's `name` (0 expected), reported with the first one.
int64_t mismatches(const io::SafetensorsContents& f, const std::string& name, const Image& ours) {
  return test::mismatches(name, test::image_of(f.at(name)), ours, "Pillow");
}

}  // namespace

TEST_CASE("RandAugment's ops equal Pillow's pixel for pixel", "[data][rand_augment][golden]") {
  const io::SafetensorsContents f = io::load_safetensors("tests/fixtures/rand_augment_pil.safetensors");
  const Image in = test::image_of(f.at("in"));
  CHECK(mismatches(f, "autocontrast", auto_contrast(in)) == 0);
  CHECK(mismatches(f, "equalize", equalize(in)) == 0);
  CHECK(mismatches(f, "invert", invert(in)) == 0);
  for (int bits : {1, 3, 7}) CHECK(mismatches(f, "posterize_" + std::to_string(bits), posterize(in, bits)) == 0);
  CHECK(mismatches(f, "solarize_26", solarize(in, 26)) == 0);
  CHECK(mismatches(f, "solarize_100", solarize(in, 100)) == 0);
  CHECK(mismatches(f, "solarize_178.5", solarize(in, 179)) == 0);
  const std::pair<const char*, std::function<Image(const Image&, float)>> blends[] = {
      {"brightness", adjust_brightness}, {"color", adjust_color}, {"contrast", adjust_contrast},
      {"sharpness", adjust_sharpness}};
  for (const auto& [name, op] : blends)
    for (const char* factor : {"0.19", "0.6", "1.3", "1.81"})
      CHECK(mismatches(f, std::string(name) + "_" + factor, op(in, std::stof(factor))) == 0);
  for (const auto& [rname, rs] : {std::pair{"nearest", Resample::nearest}, std::pair{"bilinear", Resample::bilinear}}) {
    const WarpOptions w{rs, {7, 8, 9}};
    const std::string r = rname;
    CHECK(mismatches(f, "rotate_27_" + r, rotate(in, 27, w)) == 0);
    CHECK(mismatches(f, "rotate_-9_" + r, rotate(in, -9, w)) == 0);
    CHECK(mismatches(f, "rotate_90_" + r, rotate(in, 90, w)) == 0);
    CHECK(mismatches(f, "shear_x_0.27_" + r, shear_x(in, 0.27, w)) == 0);
    CHECK(mismatches(f, "shear_x_-0.09_" + r, shear_x(in, -0.09, w)) == 0);
    CHECK(mismatches(f, "shear_y_0.27_" + r, shear_y(in, 0.27, w)) == 0);
    CHECK(mismatches(f, "shear_y_-0.09_" + r, shear_y(in, -0.09, w)) == 0);
    CHECK(mismatches(f, "translate_3.4_0_" + r, translate(in, 3.4, 0, w)) == 0);
    CHECK(mismatches(f, "translate_0_-4.05_" + r, translate(in, 0, -4.05, w)) == 0);
    CHECK(mismatches(f, "translate_-2_1_" + r, translate(in, -2, 1, w)) == 0);
  }
}
