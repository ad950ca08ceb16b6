// PNG decoding (data/image_codec.h) against Pillow's Image.open(f).convert("RGB"), pixel for pixel: the fixture
// is written by tools/golden/pil_png.py (numpy and Pillow only), which writes each PNG byte by byte and stores it
// with Pillow's output. The cases cover every colour type at every bit depth (grey 1/2/4/8/16, palette 1/2/4/8,
// grey + alpha, RGB and RGBA at 8 and 16), gAMA chunks other than sRGB's, sRGB and sBIT chunks, tRNS
// transparency and Adam7 interlacing (Note [PNG as PIL decodes it] in src/data/image_codec.cpp).
// HT_FIXTURES: png_pil.safetensors
#include <cstring>
#include <string>
#include <vector>

#include "hadatrain/data/image_codec.h"
#include "hadatrain/io/safetensors.h"
#include "support/catch.h"
#include "support/image_testing.h"

using namespace ht;
using namespace ht::data;
using ht::test::image_of;
using ht::test::mismatches;

TEST_CASE("PNG decoding equals Pillow's convert(\"RGB\") pixel for pixel", "[data][image][golden]") {
  const io::SafetensorsContents f = io::load_safetensors("tests/fixtures/png_pil.safetensors");
  std::vector<std::string> names;
  for (const auto& [key, t] : f.tensors)
    if (key.size() > 4 && key.compare(key.size() - 4, 4, ".png") == 0) names.push_back(key.substr(0, key.size() - 4));
  REQUIRE(names.size() == 32);
  for (const std::string& name : names) {
    const Tensor& file = f.at(name + ".png");  // (bytes) u8
    const std::span<const uint8_t> bytes(file.data<uint8_t>(), static_cast<std::size_t>(file.numel()));
    if (!png_decoding_available()) {
      CHECK_THROWS_WITH(decode_image(bytes, name), HasSubstr("without libpng"));
      continue;
    }
    const Image ours = decode_image(bytes, name);
    const Image pil = image_of(f.at(name + ".rgb"));
    if (f.contains(name + ".high_byte")) {
      // 16-bit grey: the high byte, where Pillow clamps the 16-bit value to 255.
      CHECK(mismatches(name, image_of(f.at(name + ".high_byte")), ours) == 0);
      CHECK(mismatches(name + " (Pillow)", pil, ours) > 0);
    } else {
      CHECK(mismatches(name, pil, ours) == 0);
    }
  }
}
