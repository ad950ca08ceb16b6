// Image file decoding (JPEG through libjpeg-turbo; PNG through libpng when the build found it) and a JPEG
// encoder for tests and fixtures. Decoded images are RGB, HWC, u8. The format is taken from the file's
// first bytes, never from its name (ImageNet holds a PNG named .JPEG and CMYK JPEGs): see docs/data.md.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "hadatrain/data/image.h"

namespace ht::data {

enum class ImageFormat : uint8_t { jpeg, png, unknown };

// FF D8 FF -> jpeg; 89 50 4E 47 0D 0A 1A 0A -> png; anything else -> unknown.
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

// True when this build links libpng and decodes PNG files.
bool png_decoding_available();

struct DecodeOptions {
  // 0: full size. Otherwise libjpeg may decode at 1/2, 1/4 or 1/8 scale (its DCT scaling, much faster) as
  // long as both sides stay >= min_side. Ignored for PNG.
  int64_t min_side = 0;
};

// Decodes JPEG or PNG bytes to an RGB HWC image. Grayscale becomes RGB by replication; CMYK and YCCK JPEGs
// are converted with R = (255 - C)(255 - K) / 255 etc., reading Adobe-marked files as inverted CMYK. PNGs give
// Pillow's convert("RGB") pixels: no gamma correction, 16-bit samples' high byte, alpha dropped
// (Note [PNG as PIL decodes it] in image_codec.cpp, which names the one difference, 16-bit grey). Errors
// (corrupt or truncated data, unknown format, PNG without libpng) throw ht::Error naming `name`.
// A truncated JPEG ("premature end of data") is an error; libjpeg's other recoverable warnings (e.g.
// extraneous bytes before a marker, common in ImageNet) are not, as in PIL.
Image decode_image(std::span<const uint8_t> bytes, const std::string& name, const DecodeOptions& opts = {});

// Reads and decodes a file.
Image read_image(const std::filesystem::path& file, const DecodeOptions& opts = {});
// The whole file as bytes (throws naming the file when it cannot be read).
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& file);

enum class JpegColor : uint8_t {
  rgb,         // input: 3-channel RGB, stored as YCbCr
  gray,        // input: 1 channel
  cmyk,        // input: 4-channel CMYK (0 = no ink); stored plainly, no Adobe marker
  cmyk_adobe,  // input: 4-channel CMYK; stored inverted with an Adobe marker (what Photoshop writes)
  ycck_adobe,  // input: 4-channel CMYK; stored as inverted YCCK with an Adobe marker
};

struct JpegEncodeOptions {
  int quality = 95;
  JpegColor color = JpegColor::rgb;
};

// Encodes an image (either layout) to JPEG bytes.
std::vector<uint8_t> encode_jpeg(const Image& img, const JpegEncodeOptions& opts = {});

}  // namespace ht::data
