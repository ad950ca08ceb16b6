// Image augmentations and conversions for vision training, on u8 images in HWC or CHW layout (outputs keep
// the input's layout). Random transforms draw from the sample's SampleRng in a documented order, so results
// are reproducible from (seed, epoch, sample index) (Note [Data randomness]). Geometry follows torchvision
// (RandomCrop, RandomHorizontalFlip, RandomResizedCrop, Resize, CenterCrop); see docs/data.md.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "hadatrain/data/image.h"
#include "hadatrain/data/sample_rng.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::data {

// A rectangle in pixel coordinates of an image: rows [top, top + height), columns [left, left + width).
struct Rect {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
  friend bool operator==(const Rect&, const Rect&) = default;
};

// ---- deterministic geometry ----

// The pixels of `r`; parts of `r` outside the image are zero (this is how padding is done).
Image crop(const Image& img, const Rect& r);
// Mirror left-right.
Image hflip(const Image& img);

enum class Antialias : uint8_t {
  off,  // plain bilinear: 2x2 taps at source position (dst + 0.5) * in / out - 0.5, clamped at the border
  on,   // when shrinking, a triangle filter widened by the scale (PIL / torchvision antialias=True);
        // identical to `off` when enlarging
};

// Bilinear resize of the region `src` of `img` (which must lie inside the image) to out_h x out_w.
// Computed in f32, rounded to the nearest u8.
Image resize_region(const Image& img, const Rect& src, int64_t out_h, int64_t out_w, Antialias aa = Antialias::on);
Image resize(const Image& img, int64_t out_h, int64_t out_w, Antialias aa = Antialias::on);
// torchvision Resize(size): the shorter side becomes `size`, the longer one int(size * long / short).
Image resize_shorter(const Image& img, int64_t size, Antialias aa = Antialias::on);

// torchvision CenterCrop: top = round_half_even((H - out_h) / 2), likewise left; an image smaller than the
// crop is zero-padded ((out - in) / 2 before, the rest after).
Rect center_crop_rect(int64_t height, int64_t width, int64_t out_h, int64_t out_w);
Image center_crop(const Image& img, int64_t out_h, int64_t out_w);

// ---- random geometry (each says what it draws, in order) ----

// torchvision RandomCrop(size, padding): the image is zero-padded by `padding` on every side, then an
// out_h x out_w window is chosen: draws top = randint(0, H + 2p - out_h), then left = randint(0, W + 2p - out_w).
// The returned rectangle is in unpadded coordinates (top and left may be negative).
struct RandomCropParams {
  int64_t height = 32;
  int64_t width = 32;
  int64_t padding = 4;
};
Rect random_crop_rect(int64_t height, int64_t width, const RandomCropParams& p, SampleRng& rng);
Image random_crop(const Image& img, const RandomCropParams& p, SampleRng& rng);

// Flips with probability p: draws one uniform u and flips when u < p.
Image random_hflip(Image img, SampleRng& rng, float p = 0.5f);

// torchvision RandomResizedCrop: up to `attempts` tries, each drawing s = uniform(scale_min, scale_max) and
// r = exp(uniform(log ratio_min, log ratio_max)); w = round(sqrt(A s r)), h = round(sqrt(A s / r)) (half to
// even, as Python's round); a try that fits draws top = randint(0, H - h), left = randint(0, W - w). When no
// try fits: the centre crop with the aspect ratio clamped into [ratio_min, ratio_max]. The chosen region is
// resized to height x width.
struct RandomResizedCropParams {
  int64_t height = 224;
  int64_t width = 224;
  float scale_min = 0.08f;
  float scale_max = 1.0f;
  float ratio_min = 3.0f / 4.0f;
  float ratio_max = 4.0f / 3.0f;
  int attempts = 10;
  Antialias antialias = Antialias::on;
};
Rect random_resized_crop_rect(int64_t height, int64_t width, const RandomResizedCropParams& p, SampleRng& rng);
Image random_resized_crop(const Image& img, const RandomResizedCropParams& p, SampleRng& rng);

// ---- normalisation and batches ----

// Per-channel normalisation: out = (pixel / 255 - mean[c]) / std[c]. Empty mean and std mean "scale to [0, 1]
// only". Presets hold the usual dataset statistics.
struct Normalize {
  std::vector<float> mean;
  std::vector<float> std;
  static Normalize unit() { return {}; }
  static Normalize cifar10() { return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}}; }
  static Normalize cifar100() { return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}}; }
  static Normalize imagenet() { return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}}; }
  // Checks that the statistics fit an image of `channels` channels (throws otherwise).
  void check(int64_t channels) const;
};

// Writes the normalised image as (C, H, W) f32 to out[0 .. C*H*W).
void normalize_into(const Image& img, const Normalize& norm, float* out);
// (C, H, W) f32.
Tensor to_tensor(const Image& img, const Normalize& norm);
// (N, C, H, W) f32; every image must have the same height, width and channels.
Tensor to_batch(const std::vector<Image>& images, const Normalize& norm);

// ---- composable pipelines ----

// A (possibly random) image transform. Must be callable from several threads at once.
using Transform = std::function<Image(Image, SampleRng&)>;

Transform compose(std::vector<Transform> steps);
Transform random_crop_transform(RandomCropParams p);
Transform random_hflip_transform(float p = 0.5f);
Transform random_resized_crop_transform(RandomResizedCropParams p);
Transform resize_shorter_transform(int64_t size, Antialias aa = Antialias::on);
// Bilinear resize to height x width (antialiased when shrinking), e.g. CIFAR's 32x32 up to a pretrained
// model's 224x224.
Transform resize_transform(int64_t height, int64_t width);
Transform center_crop_transform(int64_t out_h, int64_t out_w);

// The standard recipes: CIFAR train = RandomCrop(32, padding 4) + flip; ImageNet train = RandomResizedCrop
// (size) + flip; ImageNet eval = Resize(resize) + CenterCrop(crop).
Transform cifar_train_transform();
Transform imagenet_train_transform(int64_t size = 224);
Transform imagenet_eval_transform(int64_t resize = 256, int64_t crop = 224);

}  // namespace ht::data
