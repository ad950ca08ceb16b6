// RandAugment: the two policies' op lists and magnitude-to-argument maps (Note [RandAugment policies] in
// rand_augment.h), the per-sample draws, and the parser of timm's "rand-m9-mstd0.5-inc1" strings.
#include "hadatrain/data/rand_augment.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numbers>

#include "hadatrain/core/error.h"

namespace ht::data {
namespace {

using Op = RandAugmentOp;

bool is_enhance(Op op) { return op == Op::color || op == Op::contrast || op == Op::brightness || op == Op::sharpness; }
bool is_geometric(Op op) {
  return op == Op::rotate || op == Op::shear_x || op == Op::shear_y || op == Op::translate_x || op == Op::translate_y;
}

// Whether the op's argument takes a random sign under the policy.
bool is_signed(Op op, const RandAugmentOptions& o) {
  if (is_geometric(op)) return true;
  if (is_enhance(op)) return o.policy == RandAugmentPolicy::torchvision || o.increasing;
  return false;
}

// A normal draw from two words (Box-Muller; 1 - u keeps the logarithm finite).
double normal(SampleRng& rng) {
  const double u1 = 1.0 - static_cast<double>(rng.uniform());
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Image apply_timm(const Image& img, Op op, double level, double sign, const RandAugmentOptions& o) {
  switch (op) {
    case Op::posterize: {
      const int b = static_cast<int>(level * 4);
      return posterize(img, o.increasing ? 4 - b : b);
    }
    case Op::solarize: {
      const int t = std::min(256, static_cast<int>(level * 256));
      return solarize(img, o.increasing ? 256 - t : t);
    }
    case Op::solarize_add: return solarize_add(img, std::min(128, static_cast<int>(level * 110)));
    case Op::translate_x: return translate(img, sign * 0.45 * level * static_cast<double>(img.width), 0, o.warp);
    case Op::translate_y: return translate(img, 0, sign * 0.45 * level * static_cast<double>(img.height), o.warp);
    default: break;
  }
  HT_ASSERT(is_enhance(op), "rand_augment: {} has no timm argument", op_name(op));
  const auto f = static_cast<float>(o.increasing ? std::max(0.1, 1.0 + sign * 0.9 * level) : 0.1 + 1.8 * level);
  switch (op) {
    case Op::color: return adjust_color(img, f);
    case Op::contrast: return adjust_contrast(img, f);
    case Op::brightness: return adjust_brightness(img, f);
    default: return adjust_sharpness(img, f);
  }
}

Image apply_torchvision(const Image& img, Op op, double level, double sign, const RandAugmentOptions& o) {
  switch (op) {
    case Op::posterize: return posterize(img, 8 - static_cast<int>(std::nearbyint(4 * level)));
    case Op::solarize: return solarize(img, static_cast<int>(std::ceil(255.0 * (1.0 - level))));
    case Op::translate_x:
      return translate(img, sign * std::trunc(150.0 / 331.0 * static_cast<double>(img.width) * level), 0, o.warp);
    case Op::translate_y:
      return translate(img, 0, sign * std::trunc(150.0 / 331.0 * static_cast<double>(img.height) * level), o.warp);
    default: break;
  }
  HT_ASSERT(is_enhance(op), "rand_augment: {} has no torchvision argument", op_name(op));
  const auto f = static_cast<float>(1.0 + sign * 0.9 * level);
  switch (op) {
    case Op::color: return adjust_color(img, f);
    case Op::contrast: return adjust_contrast(img, f);
    case Op::brightness: return adjust_brightness(img, f);
    default: return adjust_sharpness(img, f);
  }
}

// Reads a finite number that fills all of `text` into `out`; false otherwise.
bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(out);
}

}  // namespace

const char* op_name(RandAugmentOp op) {
  switch (op) {
    case Op::identity: return "Identity";
    case Op::auto_contrast: return "AutoContrast";
    case Op::equalize: return "Equalize";
    case Op::invert: return "Invert";
    case Op::rotate: return "Rotate";
    case Op::posterize: return "Posterize";
    case Op::solarize: return "Solarize";
    case Op::solarize_add: return "SolarizeAdd";
    case Op::color: return "Color";
    case Op::contrast: return "Contrast";
    case Op::brightness: return "Brightness";
    case Op::sharpness: return "Sharpness";
    case Op::shear_x: return "ShearX";
    case Op::shear_y: return "ShearY";
    case Op::translate_x: return "TranslateX";
    case Op::translate_y: return "TranslateY";
  }
  return "?";
}

RandAugmentOptions RandAugmentOptions::torchvision_defaults() {
  RandAugmentOptions o;
  o.policy = RandAugmentPolicy::torchvision;
  o.magnitude = 9;
  o.magnitude_std = 0;
  o.prob = 1.0;
  o.increasing = false;
  return o;
}

double RandAugmentOptions::max_magnitude() const {
  return policy == RandAugmentPolicy::timm ? 10.0 : static_cast<double>(num_magnitude_bins - 1);
}

void RandAugmentOptions::check() const {
  HT_CHECK(num_ops >= 1 && num_ops <= 64, "rand_augment: num_ops must be in [1, 64], got {}", num_ops);
  HT_CHECK(policy == RandAugmentPolicy::timm || num_magnitude_bins >= 2,
           "rand_augment: num_magnitude_bins must be >= 2, got {}", num_magnitude_bins);
  HT_CHECK(magnitude >= 0 && magnitude <= max_magnitude(), "rand_augment: magnitude must be in [0, {}], got {}",
           max_magnitude(), magnitude);
  HT_CHECK(std::isfinite(magnitude_std) && magnitude_std >= 0,
           "rand_augment: magnitude_std must be finite and >= 0, got {}", magnitude_std);
  HT_CHECK(prob >= 0 && prob <= 1, "rand_augment: prob must be in [0, 1], got {}", prob);
}

RandAugmentOptions parse_rand_augment(const std::string& spec) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = spec.find('-', start);
    parts.push_back(spec.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  if (parts.front() != "rand")
    throw Error(fmt::format("'{}' is not a RandAugment string: expected 'rand-' followed by parts such as "
                            "m9, n2, mstd0.5, inc1, p0.5 (timm's form)", spec));
  // timm's defaults for what the string leaves out.
  RandAugmentOptions o;
  o.magnitude = 10;
  o.num_ops = 2;
  o.magnitude_std = 0;
  o.increasing = false;
  o.prob = 0.5;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const std::size_t digit = part.find_first_of("0123456789.");
    const std::string key = part.substr(0, digit == std::string::npos ? part.size() : digit);
    const std::string text = digit == std::string::npos ? "" : part.substr(digit);
    double v = 0;
    auto bad = [&](const std::string& why) {
      return Error(fmt::format("part '{}' of '{}': {}", part, spec, why));
    };
    const bool known = key == "m" || key == "n" || key == "mstd" || key == "inc" || key == "p";
    if (!known) throw bad("unknown part (RandAugment strings take m, n, mstd, inc and p)");
    if (!parse_number(text, v)) throw bad("expected a number after '" + key + "'");
    const bool integral = v == std::floor(v);
    if (key == "m") {
      if (v < 0 || v > 10) throw bad("the magnitude must be in [0, 10]");
      o.magnitude = v;
    } else if (key == "n") {
      if (!integral || v < 1 || v > 64) throw bad("the number of ops must be an integer in [1, 64]");
      o.num_ops = static_cast<int>(v);
    } else if (key == "mstd") {
      if (v < 0) throw bad("the magnitude std must be >= 0");
      o.magnitude_std = v;
    } else if (key == "inc") {
      if (v != 0 && v != 1) throw bad("inc must be 0 or 1");
      o.increasing = v == 1;
    } else {
      if (v < 0 || v > 1) throw bad("the probability must be in [0, 1]");
      o.prob = v;
    }
  }
  return o;
}

std::vector<RandAugmentOp> rand_augment_ops(const RandAugmentOptions& o) {
  if (o.policy == RandAugmentPolicy::torchvision)
    return {Op::identity, Op::shear_x, Op::shear_y, Op::translate_x, Op::translate_y, Op::rotate, Op::brightness,
            Op::color, Op::contrast, Op::sharpness, Op::posterize, Op::solarize, Op::auto_contrast, Op::equalize};
  return {Op::auto_contrast, Op::equalize,   Op::invert,     Op::rotate,   Op::posterize,
          Op::solarize,      Op::solarize_add, Op::color,    Op::contrast, Op::brightness,
          Op::sharpness,     Op::shear_x,    Op::shear_y,    Op::translate_x, Op::translate_y};
}

std::vector<RandAugmentStep> draw_rand_augment(const RandAugmentOptions& o, SampleRng& rng) {
  const std::vector<Op> ops = rand_augment_ops(o);
  const double top = o.max_magnitude();
  std::vector<RandAugmentStep> steps(static_cast<std::size_t>(o.num_ops));
  for (RandAugmentStep& s : steps) {
    s.op = ops[static_cast<std::size_t>(rng.randint(0, static_cast<int64_t>(ops.size()) - 1))];
    s.applied = o.prob >= 1.0 || rng.uniform() < o.prob;
    if (!s.applied) continue;
    double m = o.magnitude;
    if (o.magnitude_std > 0) m += o.magnitude_std * normal(rng);
    s.level = std::clamp(m, 0.0, top) / top;
    if (is_signed(s.op, o)) s.negate = rng.uniform() < 0.5f;
  }
  return steps;
}

Image apply_rand_augment_step(const Image& img, const RandAugmentStep& step, const RandAugmentOptions& o) {
  if (!step.applied) return img;
  const double level = step.level, sign = step.negate ? -1.0 : 1.0;
  switch (step.op) {
    case Op::identity: return img;
    case Op::auto_contrast: return auto_contrast(img);
    case Op::equalize: return equalize(img);
    case Op::invert: return invert(img);
    case Op::rotate: return rotate(img, sign * 30.0 * level, o.warp);
    case Op::shear_x: return shear_x(img, sign * 0.3 * level, o.warp);
    case Op::shear_y: return shear_y(img, sign * 0.3 * level, o.warp);
    default: break;
  }
  return o.policy == RandAugmentPolicy::timm ? apply_timm(img, step.op, level, sign, o)
                                             : apply_torchvision(img, step.op, level, sign, o);
}

Image rand_augment(Image img, const RandAugmentOptions& o, SampleRng& rng) {
  for (const RandAugmentStep& s : draw_rand_augment(o, rng)) img = apply_rand_augment_step(img, s, o);
  return img;
}

Transform rand_augment_transform(RandAugmentOptions o) {
  o.check();
  return [o = std::move(o)](Image img, SampleRng& rng) { return rand_augment(std::move(img), o, rng); };
}

}  // namespace ht::data
