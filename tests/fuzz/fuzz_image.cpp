// Fuzz target: the image decoders' wrapper (data/image_codec.h: format sniffing, libjpeg-turbo and libpng
// through decode_image) at full size and with DCT scaling. Input: the file's bytes.
#include <cstddef>
#include <cstdint>
#include <span>

#include "hadatrain/core/error.h"
#include "hadatrain/data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  for (const int64_t min_side : {0, 8}) {
    try {
      const ht::data::Image img = ht::data::decode_image(bytes, "fuzz input", {.min_side = min_side});
      if (img.pixels.size() != static_cast<std::size_t>(img.height * img.width * img.channels)) std::abort();
    } catch (const ht::Error&) {
    }
  }
  return 0;
}
