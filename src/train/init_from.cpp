// model.init_from: pretrained weights into a freshly built model (train/init_from.h).
#include "hadatrain/train/init_from.h"

#include <algorithm>
#include <cmath>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "hadatrain/core/error.h"
#include "hadatrain/core/name_list.h"
#include "hadatrain/grad/pipeline.h"
#include "hadatrain/io/checkpoint_files.h"
#include "hadatrain/io/safetensors.h"
#include "hadatrain/tensor/factory.h"

namespace ht::train {
namespace {

namespace fs = std::filesystem;

std::string leaf(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

std::string owner(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

// The cubic convolution kernel with a = -0.5 (PyTorch's antialiased bicubic and PIL's).
double cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// out x in weights of one axis: row i holds output sample i's taps (zero outside its window).
std::vector<double> axis_weights(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double widen = std::max(scale, 1.0);  // shrinking widens the kernel (antialiasing)
  const double support = 2.0 * widen;
  std::vector<double> w(static_cast<std::size_t>(in * out), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    double total = 0.0;
    for (int64_t j = lo; j < hi; ++j) total += cubic((static_cast<double>(j) - center + 0.5) / widen);
    for (int64_t j = lo; j < hi; ++j)
      w[static_cast<std::size_t>(i * in + j)] =
          total != 0.0 ? cubic((static_cast<double>(j) - center + 0.5) / widen) / total : 0.0;
  }
  return w;
}

// The classifier: the module holding the model's last registered parameter (ResNet fc, ViT head, the MLP's
// last Linear).
std::string classifier_of(nn::Module& model) {
  const auto params = model.named_parameters();
  return params.empty() ? "" : owner(params.back().first);
}

int64_t square_side(int64_t n) {
  const auto s = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  return s * s == n ? s : -1;
}

std::string list(const std::vector<std::string>& names) { return first_names(names, 12); }

}  // namespace

fs::path resolve_pretrained(const fs::path& path) {
  std::error_code ec;
  HT_CHECK(fs::exists(path, ec),
           "model.init_from: {} does not exist (expected a .safetensors file or a folder holding model.safetensors; "
           "docs/reproduction.md says where pretrained weights come from)",
           path.string());
  // A checkpoint pointer file (checkpoints/latest, checkpoints/best): the checkpoint it names.
  if (const fs::path named = io::resolve_checkpoint_pointer(path); named != path) return named;
  if (!fs::is_directory(path, ec)) return path;
  if (fs::exists(path / "model.safetensors.index.json", ec) || fs::exists(path / "model.safetensors", ec)) return path;
  // A run's checkpoint folder (step_<N> folders): its latest checkpoint.
  const auto step = io::latest_checkpoint_step(path);
  HT_CHECK(step.has_value(),
           "model.init_from: the folder {} holds neither model.safetensors, model.safetensors.index.json nor "
           "step_<N> checkpoints",
           path.string());
  return io::checkpoint_dir(path, *step);
}

std::map<std::string, Tensor> read_pretrained(const fs::path& path) {
  const fs::path source = resolve_pretrained(path);
  std::error_code ec;
  if (!fs::is_directory(source, ec)) return io::load_safetensors(source).tensors;
  if (fs::exists(source / "model.safetensors.index.json", ec)) return io::load_sharded_safetensors(source).tensors;
  return io::load_safetensors(source / "model.safetensors").tensors;
}

std::map<std::string, Tensor> strip_wrapper_prefix(std::map<std::string, Tensor> source) {
  for (bool again = true; again && !source.empty();) {
    again = false;
    for (const std::string prefix : {"module.", "_orig_mod.", "model."}) {
      const bool all = std::all_of(source.begin(), source.end(), [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; });
      if (!all) continue;
      std::map<std::string, Tensor> out;
      for (auto& [k, v] : source) out.emplace(k.substr(prefix.size()), std::move(v));
      source = std::move(out);
      again = true;
    }
  }
  return source;
}

Tensor resample_pos_embed(const Tensor& pos_embed, int64_t prefix, int64_t gh, int64_t gw, int64_t new_h, int64_t new_w) {
  HT_CHECK(pos_embed.dim() == 3 && pos_embed.size(0) == 1 && pos_embed.size(1) == prefix + gh * gw,
           "resample_pos_embed: expected (1, {} + {}x{}, D), got {}", prefix, gh, gw, pos_embed.describe());
  HT_CHECK(new_h > 0 && new_w > 0, "resample_pos_embed: the new grid {}x{} is empty", new_h, new_w);
  const int64_t D = pos_embed.size(2);
  const std::vector<double> src = pos_embed.to(Device::cpu()).to_vector<double>();  // (1, prefix + gh*gw, D)
  const std::vector<double> wy = axis_weights(gh, new_h), wx = axis_weights(gw, new_w);
  std::vector<double> out(static_cast<std::size_t>((prefix + new_h * new_w) * D), 0.0);
  std::copy(src.begin(), src.begin() + prefix * D, out.begin());
  // Rows first (along x), then columns (along y), as the separable antialiased kernels run.
  std::vector<double> tmp(static_cast<std::size_t>(gh * new_w * D), 0.0);  // (gh, new_w, D)
  for (int64_t y = 0; y < gh; ++y)
    for (int64_t x = 0; x < new_w; ++x)
      for (int64_t j = 0; j < gw; ++j) {
        const double w = wx[static_cast<std::size_t>(x * gw + j)];
        if (w == 0.0) continue;
        const double* s = src.data() + (prefix + y * gw + j) * D;
        double* t = tmp.data() + (y * new_w + x) * D;
        for (int64_t d = 0; d < D; ++d) t[d] += w * s[d];
      }
  for (int64_t y = 0; y < new_h; ++y)
    for (int64_t i = 0; i < gh; ++i) {
      const double w = wy[static_cast<std::size_t>(y * gh + i)];
      if (w == 0.0) continue;
      for (int64_t x = 0; x < new_w; ++x) {
        const double* t = tmp.data() + (i * new_w + x) * D;
        double* o = out.data() + (prefix + y * new_w + x) * D;
        for (int64_t d = 0; d < D; ++d) o[d] += w * t[d];
      }
    }
  return from_vector(out, {1, prefix + new_h * new_w, D}, {DType::f64}).to(pos_embed.dtype());
}

std::vector<std::string> InitFromReport::lines() const {
  std::vector<std::string> out;
  out.push_back(fmt::format("model.init_from {}: {} tensor(s) loaded, {} missing, {} unexpected, {} re-initialised, "
                            "{} resampled",
                            source, loaded.size(), missing.size(), unexpected.size(), reinitialised.size(),
                            resampled.size()));
  if (!reinitialised.empty()) out.push_back(fmt::format("  re-initialised (fresh initialisation kept): {}", list(reinitialised)));
  if (!resampled.empty()) out.push_back(fmt::format("  resampled: {}", list(resampled)));
  if (!missing.empty()) out.push_back(fmt::format("  missing (fresh initialisation kept): {}", list(missing)));
  if (!unexpected.empty()) out.push_back(fmt::format("  unexpected (ignored): {}", list(unexpected)));
  return out;
}

InitFromReport init_from(nn::Module& model, const std::map<std::string, Tensor>& source, const std::string& source_name,
                         const InitFromOptions& options) {
  InitFromReport r;
  r.source = source_name;
  const std::string classifier = classifier_of(model);
  const std::map<std::string, Tensor> target = model.state_dict();
  for (const std::string& pattern : options.reset) {
    const bool any = std::any_of(target.begin(), target.end(), [&](const auto& kv) { return grad::glob_match(pattern, kv.first); });
    HT_CHECK(any, "model.init_from_reset: the pattern '{}' matches no tensor of the model", pattern);
  }
  auto is_reset = [&](const std::string& name) {
    return std::any_of(options.reset.begin(), options.reset.end(), [&](const std::string& p) { return grad::glob_match(p, name); });
  };
  const bool class_token = target.count("cls_token") != 0;
  std::map<std::string, Tensor> values;
  for (const auto& [name, slot] : target) {
    const auto it = source.find(name);
    if (it == source.end()) {
      r.missing.push_back(name);
      continue;
    }
    const Tensor& t = it->second;
    if (is_reset(name)) {
      r.reinitialised.push_back(fmt::format("{} (model.init_from_reset)", name));
      continue;
    }
    if (t.shape() == slot.shape()) {
      values.emplace(name, t);
      r.loaded.push_back(name);
      continue;
    }
    const bool same_rank = t.dim() == slot.dim() && t.dim() >= 1;
    bool rest_equal = same_rank;
    for (int64_t d = 1; rest_equal && d < t.dim(); ++d) rest_equal = t.size(d) == slot.size(d);
    if (owner(name) == classifier && !classifier.empty() && rest_equal) {
      r.reinitialised.push_back(fmt::format("{} {} -> {}", name, to_string(t.shape()), to_string(slot.shape())));
      continue;
    }
    if (leaf(name) == "pos_embed" && t.dim() == 3 && slot.dim() == 3 && t.size(0) == 1 && slot.size(0) == 1 &&
        t.size(2) == slot.size(2)) {
      const int64_t prefix = class_token ? 1 : 0;
      const int64_t g_src = square_side(t.size(1) - prefix), g_dst = square_side(slot.size(1) - prefix);
      HT_CHECK(g_src > 0 && g_dst > 0,
               "model.init_from {}: '{}' has shape {} in the file and {} in the model; with {} prefix token(s) neither "
               "is a square patch grid, so it cannot be resampled",
               source_name, name, to_string(t.shape()), to_string(slot.shape()), prefix);
      values.emplace(name, resample_pos_embed(t, prefix, g_src, g_src, g_dst, g_dst));
      r.resampled.push_back(fmt::format("{} {} -> {} (grid {}x{} -> {}x{})", name, to_string(t.shape()), to_string(slot.shape()), g_src,
                                        g_src, g_dst, g_dst));
      r.loaded.push_back(name);
      continue;
    }
    HT_FAIL("model.init_from {}: '{}' has shape {} in the file and {} in the model", source_name, name, to_string(t.shape()),
            to_string(slot.shape()));
  }
  for (const auto& [name, t] : source)
    if (target.count(name) == 0) r.unexpected.push_back(name);
  // A file none of whose tensors the model has is another model's (or names them under a prefix we do not strip):
  // training would start from scratch while the config says it starts from these weights.
  HT_CHECK(!r.loaded.empty() || (r.missing.empty() && r.unexpected.empty()),
           "model.init_from {}: none of its {} tensor(s) is a tensor of the model (the model's {} are missing, "
           "e.g. {}; the file's are unexpected, e.g. {}): it holds another model, or names its tensors otherwise",
           source_name, source.size(), target.size(), r.missing.empty() ? "-" : r.missing.front(),
           r.unexpected.empty() ? "-" : r.unexpected.front());
  model.load_state_dict(values, nn::StrictLoad::no);
  return r;
}

InitFromReport init_from_path(nn::Module& model, const fs::path& path, const InitFromOptions& options) {
  return init_from(model, strip_wrapper_prefix(read_pretrained(path)), path.string(), options);
}

}  // namespace ht::train
