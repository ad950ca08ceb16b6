// Mixup and CutMix with soft targets, timm's Mixup semantics (timm/data/mixup.py): each sample is mixed with
// its mirror in the batch (row i with row B-1-i, the batch flipped along dim 0).
//   - Whether a batch (mode batch) or a sample (mode elem) is mixed at all: probability `prob`. When both
//     alphas are > 0, CutMix is chosen with probability `switch_prob`, else Mixup; with one alpha > 0, that one.
//   - lam ~ Beta(alpha, alpha) for the chosen method.
//   - Mixup: x = lam x + (1 - lam) x_flipped (in f32, as torch's x.mul_(lam).add_(x_flipped.mul_(1 - lam))).
//   - CutMix: a box of cut = int(side * sqrt(1 - lam)) per side around a centre drawn uniformly in [0, side),
//     clipped to the image, is pasted from the mirror sample; with correct_lam (timm's default) lam becomes
//     1 - box area / image area.
//   - Targets: smoothed one-hot rows (off = smoothing / classes, on = 1 - smoothing + off), mixed with the same
//     lam: target = lam y + (1 - lam) y_flipped, (B, classes) f32 under batch_key::soft_target.
// Every draw comes from the batch's own stream, SampleRng(seed, data_stream(mix, epoch, batch)) (Note [Data
// randomness]), so the mixed batches are the same for any worker count and after a resume. A batch of odd
// size mixes its middle sample with itself (timm requires even batches; our last batch may be odd).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "hadatrain/data/loader.h"
#include "hadatrain/data/sample_rng.h"

namespace ht::data {

namespace batch_key {
inline constexpr std::string_view soft_target = "soft_target";  // (B, classes) f32, rows sum to 1
}

enum class MixMode { batch, elem };  // one draw per batch (timm's default), or one per sample

struct MixOptions {
  double mixup_alpha = 0.8;  // 0: no Mixup
  double cutmix_alpha = 1.0;  // 0: no CutMix
  double prob = 1.0;          // probability that a batch (sample) is mixed at all
  double switch_prob = 0.5;   // with both alphas > 0: probability of CutMix
  double label_smoothing = 0.1;
  MixMode mode = MixMode::batch;
  bool correct_lam = true;  // CutMix: lam from the clipped box's area
  int64_t num_classes = 0;
  uint64_t seed = 0;  // the loader's seed
};

// What was drawn for one batch (mode batch) or one sample (mode elem).
struct MixDraw {
  double lam = 1.0;  // the weight of the sample itself (after correct_lam for CutMix)
  bool cutmix = false;
  int64_t y0 = 0, y1 = 0, x0 = 0, x1 = 0;  // CutMix box, [y0, y1) x [x0, x1)
};

// One Beta(a, a) draw (a > 0) from two Gamma(a) draws (Marsaglia-Tsang; a < 1 by Gamma(a + 1) * u^(1/a)).
double sample_beta(double a, SampleRng& rng);
// The draw for an image of h x w: mixed or not, method, lam, box.
MixDraw draw_mix(const MixOptions& o, int64_t h, int64_t w, SampleRng& rng);
// The CutMix box of timm's rand_bbox for the given lam and centre (cy, cx), with lam corrected when asked.
MixDraw cutmix_box(double lam, int64_t cy, int64_t cx, int64_t h, int64_t w, bool correct_lam);

// Mixes image (B, C, H, W) f32 in place with the given draws (one for the batch, or one per sample) and
// returns the soft targets (B, classes) f32 for the labels (B).
Tensor apply_mix(Tensor& image, const std::vector<int64_t>& labels, const std::vector<MixDraw>& draws,
                 int64_t num_classes, double label_smoothing);

// The loader's batch_transform: draws from the batch's stream, mixes image, sets soft_target.
void mix_batch(Batch& batch, const MixOptions& o);

}  // namespace ht::data
