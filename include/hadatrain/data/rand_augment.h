// RandAugment (Cubuk et al. 2020) on u8 images, as timm's rand_augment_transform or torchvision's
// RandAugment: each sample gets `num_ops` operations drawn uniformly (with repetition) from the policy's
// list, each applied with probability `prob` at a magnitude that may be jittered per op. It runs after the
// crop and flip and before normalisation (docs/data.md), drawing from the sample's SampleRng, so the result
// depends only on (seed, epoch, sample index) (Note [Data randomness]).
//
// Note [RandAugment policies]
// Both policies map a magnitude to a level in [0, 1] and each op's level to its argument; signed ops negate
// their argument with probability 1/2.
//   timm (rand-mM-nN-mstdS-incI-pP): level = clamp(m', 0, 10) / 10, m' = M, or a normal draw N(M, S) when
//     S > 0 (per op). Ops (_RAND_INCREASING_TRANSFORMS, inc1): AutoContrast, Equalize, Invert, Rotate
//     (30 level degrees, signed), PosterizeIncreasing (4 - int(4 level) bits), SolarizeIncreasing
//     (threshold 256 - int(256 level)), SolarizeAdd (add int(110 level) below 128), ColorIncreasing,
//     ContrastIncreasing, BrightnessIncreasing, SharpnessIncreasing (factor max(0.1, 1 + 0.9 level), signed),
//     ShearX/Y (0.3 level, signed), TranslateXRel/YRel (0.45 level x the side, signed, sub-pixel). inc0
//     (_RAND_TRANSFORMS) has Posterize (int(4 level) bits), Solarize (threshold int(256 level)) and the four
//     enhancements at factor 0.1 + 1.8 level, unsigned, instead. timm's list includes Invert; torchvision's
//     does not, and has no SolarizeAdd.
//   torchvision (RandAugment(num_ops, magnitude, num_magnitude_bins)): level = m' / (bins - 1). Ops: Identity,
//     ShearX/Y (0.3 level, signed), TranslateX/Y (int(150/331 level x the side) pixels, signed), Rotate
//     (30 level, signed), Brightness, Color, Contrast, Sharpness (factor 1 + 0.9 level, signed), Posterize
//     (8 - round(4 level) bits), Solarize (inverts values >= 255 (1 - level)), AutoContrast, Equalize.
//     torchvision applies every chosen op at a fixed magnitude: prob 1, magnitude_std 0 (the defaults here).
//
// Draws, in order, for each of the num_ops ops: the op, randint(0, ops - 1) (one word); when prob < 1, one
// uniform word (the op runs when it is < prob; a skipped op draws nothing more); when magnitude_std > 0, two
// words (Box-Muller normal); for a signed op, one word (negated when it is < 0.5).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hadatrain/data/image_ops.h"
#include "hadatrain/data/transforms.h"

namespace ht::data {

enum class RandAugmentPolicy : uint8_t { timm, torchvision };

enum class RandAugmentOp : uint8_t {
  identity, auto_contrast, equalize, invert, rotate, posterize, solarize, solarize_add,
  color, contrast, brightness, sharpness, shear_x, shear_y, translate_x, translate_y,
};
const char* op_name(RandAugmentOp op);

struct RandAugmentOptions {
  RandAugmentPolicy policy = RandAugmentPolicy::timm;
  int num_ops = 2;
  double magnitude = 9;          // timm: 0..10; torchvision: 0..num_magnitude_bins - 1
  double magnitude_std = 0.5;    // per-op normal jitter of the magnitude (0 = fixed), clipped to the range
  double prob = 0.5;             // probability that a chosen op runs
  bool increasing = true;        // timm: the inc1 op list (Note [RandAugment policies])
  int num_magnitude_bins = 31;   // torchvision only
  WarpOptions warp;              // resampling and fill of the geometric ops

  // The timm defaults, rand-m9-mstd0.5-inc1 (timm's ImageNet recipes).
  static RandAugmentOptions timm_defaults() { return {}; }
  // torchvision's RandAugment() with the classification reference's bilinear interpolation.
  static RandAugmentOptions torchvision_defaults();
  // The largest magnitude of the policy (10, or num_magnitude_bins - 1).
  double max_magnitude() const;
  // Throws an ht::Error naming the first bad field.
  void check() const;
};

// timm's config string "rand-m9-mstd0.5-inc1": parts after "rand" are m (magnitude), n (num_ops), mstd, inc
// (0 or 1) and p (prob), in any order; what a part omits takes timm's default (m 10, n 2, mstd 0, inc 0,
// p 0.5). Resampling and fill are left at their defaults. Throws ht::Error naming an unknown or bad part.
RandAugmentOptions parse_rand_augment(const std::string& spec);

// The policy's op list, in the order randint indexes it.
std::vector<RandAugmentOp> rand_augment_ops(const RandAugmentOptions& o);

// One drawn op of a sample: what runs and at which argument (already signed).
struct RandAugmentStep {
  RandAugmentOp op = RandAugmentOp::identity;
  bool applied = false;
  double level = 0;  // magnitude / max_magnitude after jitter and clipping
  bool negate = false;
};

// The draws of one sample, in the documented order, without touching an image.
std::vector<RandAugmentStep> draw_rand_augment(const RandAugmentOptions& o, SampleRng& rng);
// Runs one step on `img` (a step that is not applied returns the image).
Image apply_rand_augment_step(const Image& img, const RandAugmentStep& step, const RandAugmentOptions& o);
// draw_rand_augment, then each step in turn.
Image rand_augment(Image img, const RandAugmentOptions& o, SampleRng& rng);
Transform rand_augment_transform(RandAugmentOptions o);

}  // namespace ht::data
