// Mixup / CutMix with soft targets (data/mix.h).
#include "hadatrain/data/mix.h"

#include <algorithm>
#include <cmath>

#include "hadatrain/core/error.h"
#include "hadatrain/tensor/factory.h"

namespace ht::data {
namespace {

double uniform_open(SampleRng& rng) {  // (0, 1): never 0, so logs and powers stay finite
  return (static_cast<double>(rng.next_u32() >> 8) + 0.5) * (1.0 / 16777216.0);
}

double normal(SampleRng& rng) {  // Box-Muller, one value per two draws
  const double u1 = uniform_open(rng), u2 = uniform_open(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

double sample_gamma(double a, SampleRng& rng) {
  if (a < 1.0) return sample_gamma(a + 1.0, rng) * std::pow(uniform_open(rng), 1.0 / a);
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double z = normal(rng);
    const double v0 = 1.0 + c * z;
    if (v0 <= 0.0) continue;
    const double v = v0 * v0 * v0, u = uniform_open(rng);
    if (std::log(u) < 0.5 * z * z + d - d * v + d * std::log(v)) return d * v;
  }
}

}  // namespace

double sample_beta(double a, SampleRng& rng) {
  HT_CHECK(a > 0, "sample_beta: alpha must be > 0, got {}", a);
  const double x = sample_gamma(a, rng), y = sample_gamma(a, rng);
  return x / (x + y);
}

MixDraw cutmix_box(double lam, int64_t cy, int64_t cx, int64_t h, int64_t w, bool correct_lam) {
  const double ratio = std::sqrt(1.0 - lam);
  const auto cut_h = static_cast<int64_t>(static_cast<double>(h) * ratio);
  const auto cut_w = static_cast<int64_t>(static_cast<double>(w) * ratio);
  MixDraw d;
  d.cutmix = true;
  d.y0 = std::clamp<int64_t>(cy - cut_h / 2, 0, h);
  d.y1 = std::clamp<int64_t>(cy + cut_h / 2, 0, h);
  d.x0 = std::clamp<int64_t>(cx - cut_w / 2, 0, w);
  d.x1 = std::clamp<int64_t>(cx + cut_w / 2, 0, w);
  d.lam = correct_lam ? 1.0 - static_cast<double>((d.y1 - d.y0) * (d.x1 - d.x0)) / static_cast<double>(h * w) : lam;
  return d;
}

MixDraw draw_mix(const MixOptions& o, int64_t h, int64_t w, SampleRng& rng) {
  MixDraw d;
  const bool mixup = o.mixup_alpha > 0, cutmix = o.cutmix_alpha > 0;
  if ((!mixup && !cutmix) || !(rng.uniform() < o.prob)) return d;
  const bool use_cutmix = mixup && cutmix ? rng.uniform() < o.switch_prob : cutmix;
  const double lam = sample_beta(use_cutmix ? o.cutmix_alpha : o.mixup_alpha, rng);
  if (!use_cutmix) {
    d.lam = lam;
    return d;
  }
  const int64_t cy = rng.randint(0, h - 1), cx = rng.randint(0, w - 1);
  return cutmix_box(lam, cy, cx, h, w, o.correct_lam);
}

Tensor apply_mix(Tensor& image, const std::vector<int64_t>& labels, const std::vector<MixDraw>& draws,
                 int64_t num_classes, double label_smoothing) {
  HT_CHECK(image.dim() == 4 && image.dtype() == DType::f32 && image.is_cpu() && image.is_contiguous(),
           "mix: expected a contiguous f32 CPU image batch (B, C, H, W), got {}", image.describe());
  const int64_t B = image.size(0), C = image.size(1), H = image.size(2), W = image.size(3);
  HT_CHECK(static_cast<int64_t>(labels.size()) == B, "mix: {} labels for a batch of {}", labels.size(), B);
  HT_CHECK(draws.size() == 1 || static_cast<int64_t>(draws.size()) == B,
           "mix: {} draws for a batch of {} (expected 1 or one per sample)", draws.size(), B);
  const Tensor orig = image.clone();  // every sample mixes with the unmixed mirror
  const float* src = orig.data<float>();
  float* dst = image.data<float>();
  const int64_t per = C * H * W;
  std::vector<double> lam(static_cast<std::size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    const MixDraw& d = draws.size() == 1 ? draws[0] : draws[static_cast<std::size_t>(i)];
    const int64_t j = B - 1 - i;
    lam[static_cast<std::size_t>(i)] = d.lam;
    if (d.lam == 1.0 && !d.cutmix) continue;
    if (d.cutmix) {
      for (int64_t c = 0; c < C; ++c)
        for (int64_t y = d.y0; y < d.y1; ++y)
          for (int64_t x = d.x0; x < d.x1; ++x) {
            const int64_t k = (c * H + y) * W + x;
            dst[i * per + k] = src[j * per + k];
          }
    } else {
      const auto a = static_cast<float>(d.lam), b = static_cast<float>(1.0 - d.lam);  // torch's f32 scalars
      for (int64_t k = 0; k < per; ++k) {
        const float own = src[i * per + k] * a;
        const float other = src[j * per + k] * b;
        dst[i * per + k] = own + other;
      }
    }
  }
  // (B, classes): lam * smoothed one-hot(y_i) + (1 - lam) * smoothed one-hot(y_{B-1-i}), in f32 like timm.
  const auto off = static_cast<float>(label_smoothing / static_cast<double>(num_classes));
  const auto on = static_cast<float>(1.0 - label_smoothing + label_smoothing / static_cast<double>(num_classes));
  Tensor target = empty({B, num_classes}, {DType::f32});
  float* t = target.data<float>();
  for (int64_t i = 0; i < B; ++i) {
    const int64_t yi = labels[static_cast<std::size_t>(i)], yj = labels[static_cast<std::size_t>(B - 1 - i)];
    HT_CHECK(yi >= 0 && yi < num_classes, "mix: label {} of row {} is outside [0, {})", yi, i, num_classes);
    const auto a = static_cast<float>(lam[static_cast<std::size_t>(i)]);
    const auto b = static_cast<float>(1.0 - lam[static_cast<std::size_t>(i)]);
    for (int64_t c = 0; c < num_classes; ++c) {
      const float own = (c == yi ? on : off) * a;
      const float other = (c == yj ? on : off) * b;
      t[i * num_classes + c] = own + other;
    }
  }
  return target;
}

void mix_batch(Batch& batch, const MixOptions& o) {
  HT_CHECK(o.num_classes > 0, "mix: num_classes must be set");
  Tensor image = batch.at(batch_key::image);
  const std::vector<int64_t> labels = batch.at(batch_key::label).to_vector<int64_t>();
  SampleRng rng(o.seed, data_stream(RngPurpose::mix, batch.position.epoch, batch.position.batch));
  const int64_t B = image.size(0), H = image.size(2), W = image.size(3);
  std::vector<MixDraw> draws;
  for (int64_t i = 0; i < (o.mode == MixMode::batch ? 1 : B); ++i) draws.push_back(draw_mix(o, H, W, rng));
  Tensor target = apply_mix(image, labels, draws, o.num_classes, o.label_smoothing);
  batch.set(batch_key::soft_target, std::move(target));
}

}  // namespace ht::data
