// 8-bit images as plain pixel buffers: HWC (what decoders produce) or CHW (what CIFAR records hold).
// Transforms take either layout and keep it; the batch converter writes (N, C, H, W) f32.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ht::data {

enum class ImageLayout : uint8_t {
  hwc,  // pixel (y, x) holds its channels next to each other (libjpeg, PNG)
  chw,  // one plane per channel, each row-major (CIFAR records, tensors)
};

// Element strides of an image, in bytes of u8 (equal to elements).
struct ImageStrides {
  int64_t c, y, x;
};

// An 8-bit image of height x width pixels with `channels` channels, stored in `layout` order.
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  ImageLayout layout = ImageLayout::hwc;
  std::vector<uint8_t> pixels;  // height * width * channels bytes

  static Image zeros(int64_t height, int64_t width, int64_t channels, ImageLayout layout);

  int64_t numel() const { return height * width * channels; }
  bool empty() const { return numel() == 0; }
  ImageStrides strides() const {
    return layout == ImageLayout::hwc ? ImageStrides{1, width * channels, channels}
                                      : ImageStrides{height * width, width, 1};
  }
  int64_t offset(int64_t c, int64_t y, int64_t x) const {
    const ImageStrides s = strides();
    return c * s.c + y * s.y + x * s.x;
  }
  uint8_t at(int64_t c, int64_t y, int64_t x) const { return pixels[static_cast<std::size_t>(offset(c, y, x))]; }
  uint8_t& at(int64_t c, int64_t y, int64_t x) { return pixels[static_cast<std::size_t>(offset(c, y, x))]; }
  bool same_geometry(const Image& o) const {
    return height == o.height && width == o.width && channels == o.channels;
  }
  std::string describe() const;  // "3x32x32 (chw)"
};

// The same pixels in the other layout (a copy; returns a copy when the layout already matches).
Image to_layout(const Image& img, ImageLayout layout);

// One item of a dataset: an image and its class index.
struct Sample {
  Image image;
  int64_t label = 0;
};

}  // namespace ht::data
