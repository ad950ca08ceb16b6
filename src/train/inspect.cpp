// inspect_grads: per-layer error of each gradient pipeline against exact on one batch (train/inspect.h).
#include "hadatrain/train/inspect.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hadatrain/autograd/saved_tensor.h"
#include "hadatrain/core/config_reader.h"
#include "hadatrain/data/loader.h"
#include "hadatrain/nn/layers.h"
#include "hadatrain/nn/pipelines.h"
#include "hadatrain/ops/ops.h"
#include "hadatrain/ops/unfold.h"
#include "hadatrain/train/pipeline_config.h"
#include "hadatrain/train/task.h"
#include "batch_source.h"
#include "causal_lm_setup.h"
#include "trainer_setup.h"

namespace ht::train {
namespace {

// What one layer's product saw during the exact pass.
struct Capture {
  Tensor x, w, y, g_y, g_x, g_w;  // x (B, L, I), w (O, I), y and g_y (B, L, O), exact g_x, g_w
  grad::ProductInfo info;
  // Training defers this input (rebuilt by its op or kept by another one, Note [Rebuilt inputs]): the pipeline's
  // backward then reads the input itself, which changes what HLQ's conv_gw wgrad_simulated computes.
  bool deferred = false;
};

// An exact pipeline that records its operands and gradients (named "capture" so layers route through it).
class CapturePipeline final : public grad::Pipeline {
 public:
  explicit CapturePipeline(std::shared_ptr<Capture> c) : c_(std::move(c)), exact_(grad::make_pipeline({})) {}
  std::string name() const override { return "capture"; }
  grad::ForwardResult forward(const Tensor& x, const Tensor& w, const grad::ProductInfo& info,
                              const grad::NoiseKey& key, grad::SaveForBackward save) override {
    // Detached: the product op makes y's tensor the output of a node that holds this pipeline, which holds the
    // capture, so an attached y would keep every layer's capture and node alive (a reference cycle).
    c_->x = x.detach();
    c_->w = w.detach();
    // Both gradients of every layer are inspected, also where training asks for one (the stem's image needs none):
    // keep what both read (Note [What a product keeps] in grad/pipeline.h).
    grad::ProductInfo both = info;
    both.x_grad = both.w_grad = true;
    c_->info = both;
    c_->deferred = static_cast<bool>(info.rebuild) || kept_for_backward(info.image.defined() ? info.image : x);
    // The inspected pipelines run after this backward released every node's saved tensors, so nothing can be
    // rebuilt then: they are given the input as shared instead (see inspect_grads).
    c_->info.rebuild = {};
    grad::ForwardResult r = exact_->forward(x, w, both, key, save);
    c_->y = r.y.detach();
    return r;
  }
  grad::Grads backward(grad::SavedState& s, const Tensor& g_y, grad::Wanted) override {
    c_->g_y = g_y;
    grad::Grads g = exact_->backward(s, g_y, {true, true});
    c_->g_x = g.x;
    c_->g_w = g.w;
    return g;
  }

 private:
  std::shared_ptr<Capture> c_;
  std::shared_ptr<grad::Pipeline> exact_;
};

// (relative error, cosine) of a against the reference r, in f64.
std::pair<double, double> compare(const Tensor& a, const Tensor& r) {
  const Tensor a64 = a.to(DType::f64), r64 = r.to(DType::f64);
  const double rr = sum(mul(r64, r64)).item(), aa = sum(mul(a64, a64)).item(), ar = sum(mul(a64, r64)).item();
  const Tensor d = sub(a64, r64);
  const double dd = sum(mul(d, d)).item();
  const double rel = rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
  const double cosine = aa > 0 && rr > 0 ? ar / std::sqrt(aa * rr) : (aa == rr ? 1.0 : 0.0);
  return {rel, cosine};
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

}  // namespace

double crest_factor(const Tensor& v) {
  if (v.numel() == 0) return 0;
  const Tensor v64 = v.to(DType::f64);
  const double peak = max(abs(v64)).item(), ms = sum(mul(v64, v64)).item() / static_cast<double>(v.numel());
  return ms > 0 ? peak / std::sqrt(ms) : 0;
}

InspectedPipeline inspected_pipeline(const TrainerConfig& cfg, const std::string& entry) {
  InspectedPipeline p;
  p.label = trimmed(entry);
  if (!p.label.empty() && p.label.front() == '{') {
    ConfigReader r = ConfigReader::from_string(p.label, fmt::format("--pipelines entry '{}'", p.label));
    if (!r.has("name")) r.fail("name", "a pipeline entry needs a name, e.g. {name: hlq, acbp_bits: 4}");
    p.spec = read_pipeline_spec(r);
    r.finish();
  } else if (cfg.grad_pipeline.default_spec.name == p.label) {
    p.spec = cfg.grad_pipeline.default_spec;
  } else {
    p.spec.name = p.label;
  }
  grad::make_pipeline(p.spec);  // an unknown name throws here, before any work
  return p;
}

std::vector<std::string> split_pipeline_list(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  auto flush = [&] {
    if (std::string e = trimmed(cur); !e.empty()) out.push_back(std::move(e));
    cur.clear();
  };
  for (const char ch : list) {
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') {
      HT_CHECK(depth > 0, "--pipelines '{}': '{}' without its opening bracket", list, ch);
      --depth;
    }
    if (ch == ',' && depth == 0) flush();
    else cur += ch;
  }
  HT_CHECK(depth == 0, "--pipelines '{}': an unclosed brace or bracket", list);
  flush();
  return out;
}

std::vector<LayerGradReport> inspect_grads(const TrainerConfig& config, const InspectOptions& opts) {
  HT_CHECK(!opts.pipelines.empty(), "inspect-grads: no pipelines given");
  const TrainerConfig cfg = with_source_seq_len(config);  // data.seq_len left to model.init_from's positions
  const Device device = cfg.train.device;
  check_device(device);
  const Datasets ds = make_datasets(cfg);
  Generator init_gen(cfg.run.seed);
  auto model = make_model(cfg, ds, init_gen, std::make_shared<Generator>(cfg.run.seed ^ 0xD50F'0000'0000'0000ull));
  model->to(cfg.train.dtype);
  model->to(device);
  model->train();

  // Every Linear / Conv2d records through a capture pipeline.
  auto clock = std::make_shared<grad::StepClock>();
  clock->step = static_cast<int64_t>(opts.step);
  std::vector<nn::BoundLayer> layers = nn::bind_pipelines(*model, cfg.grad_pipeline, clock);
  std::vector<std::shared_ptr<Capture>> captures;
  for (auto& l : layers) {
    captures.push_back(std::make_shared<Capture>());
    l.binding->pipeline = std::make_shared<CapturePipeline>(captures.back());
  }

  // The first training batch and the loss of the task the config trains (image classification, or causal
  // language modelling for an LLaMA on text), as a training step computes them.
  const std::unique_ptr<BatchSource> loader = make_loader(cfg, ds, Split::train);
  const auto batch = loader->next();
  HT_CHECK(batch.has_value(), "inspect-grads: the training set of {} is empty", dataset_name(cfg.data.dataset));
  const std::unique_ptr<Task> task = make_task(cfg, *model);
  task->check_batch(*batch);
  task->loss(*model, batch->to(device)).backward();
  task->check_deferred(device);

  std::vector<LayerGradReport> report;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Capture& c = *captures[i];
    if (!c.g_y.defined()) continue;  // a layer the batch did not reach
    LayerGradReport r;
    r.name = layers[i].name;
    r.type = layers[i].type;
    r.B = c.x.size(0);
    r.L = c.x.size(1);
    r.I = c.x.size(2);
    r.O = c.w.size(0);
    r.x_crest = crest_factor(c.x);
    r.w_crest = crest_factor(c.w);
    r.gy_crest = crest_factor(c.g_y);
    for (const InspectedPipeline& ip : opts.pipelines) {
      auto p = grad::make_pipeline(ip.spec);
      const grad::NoiseKey key = layers[i].binding->key_now();
      // A conv product enters as the layer did (forward_conv with its input map), so that what the pipeline
      // saves and computes is what training would (HLQ's acbp_conv, conv_gx).
      auto forward = [&] {
        return c.info.image.defined() ? p->forward_conv(c.w, c.info, key, grad::SaveForBackward::yes)
                                      : p->forward(c.x, c.w, c.info, key, grad::SaveForBackward::yes);
      };
      // The saved bytes of a forward that keeps its own copy (ACBP's compression, as with acbp_rebuild and
      // acbp_share off); the gradients of what training computes: for a deferred input, a forward that finds it
      // kept elsewhere (acbp_share), whose backward reads it as training's rebuild would (the same bits).
      grad::ForwardResult f = forward();
      grad::Grads g;
      if (c.deferred) {
        const SavedTensor hold(c.info.image.defined() ? c.info.image : c.x);
        grad::ForwardResult d = forward();
        g = p->backward(*d.saved, c.g_y, {true, true});
      } else {
        g = p->backward(*f.saved, c.g_y, {true, true});
      }
      PipelineGradError e;
      e.pipeline = ip.label;
      e.name = ip.spec.name;
      e.exact = p->exact_forward() && p->exact_backward();
      // g_x in the columns' space, or in the image's when the pipeline returns that (conv_gx: dgrad_simulated).
      const Tensor gx_ref =
          g.x_is_image ? fold2d(c.g_x, Fold2dParams{c.info.image.size(1), c.info.image.size(2), c.info.image.size(3),
                                                    c.info.window})
                       : c.g_x;
      std::tie(e.y_rel_err, e.y_cosine) = compare(f.y, c.y);
      std::tie(e.gx_rel_err, e.gx_cosine) = compare(g.x, gx_ref);
      std::tie(e.gw_rel_err, e.gw_cosine) = compare(g.w, c.g_w);
      e.saved_bytes = f.saved->bytes;
      r.results.push_back(e);
    }
    report.push_back(std::move(r));
  }
  return report;
}

std::string format_grad_report(const std::vector<LayerGradReport>& report) {
  std::size_t pw = 8;  // the pipeline column: as wide as the longest label
  for (const auto& r : report)
    for (const auto& e : r.results) pw = std::max(pw, e.pipeline.size());
  std::string out =
      fmt::format("{:<28} {:<7} {:>22} {:>16} {:<{}} {:>10} {:>10} {:>9} {:>10} {:>9} {:>11}\n", "layer", "type",
                  "B x L x I -> O", "crest x/W/g_y", "pipeline", pw, "Y relerr", "g_x relerr", "g_x cos", "g_w relerr",
                  "g_w cos", "saved KiB");
  for (const auto& r : report) {
    const std::string shape = fmt::format("{}x{}x{} -> {}", r.B, r.L, r.I, r.O);
    const std::string crest = fmt::format("{:.1f}/{:.1f}/{:.1f}", r.x_crest, r.w_crest, r.gy_crest);
    bool first = true;
    for (const auto& e : r.results) {
      out += fmt::format("{:<28} {:<7} {:>22} {:>16} {:<{}} {:>10.4f} {:>10.4f} {:>9.5f} {:>10.4f} {:>9.5f} {:>11.1f}\n",
                         first ? r.name : "", first ? r.type : "", first ? shape : "", first ? crest : "",
                         e.pipeline, pw, e.y_rel_err, e.gx_rel_err, e.gx_cosine, e.gw_rel_err, e.gw_cosine,
                         static_cast<double>(e.saved_bytes) / 1024.0);
      first = false;
    }
  }
  // Totals over the layers: the activation memory each pipeline's saved state needs for this batch.
  // The share is against the first exact pipeline.
  std::vector<std::pair<std::string, int64_t>> totals;
  std::string exact_label;
  for (const auto& r : report)
    for (const auto& e : r.results) {
      if (exact_label.empty() && e.exact) exact_label = e.pipeline;
      auto it = std::find_if(totals.begin(), totals.end(), [&](const auto& t) { return t.first == e.pipeline; });
      if (it == totals.end()) totals.emplace_back(e.pipeline, e.saved_bytes);
      else it->second += e.saved_bytes;
    }
  const auto exact = std::find_if(totals.begin(), totals.end(), [&](const auto& t) { return t.first == exact_label; });
  out += "saved by the Linear/Conv2d products of this batch:";
  for (const auto& [name, bytes] : totals) {
    out += fmt::format(" {} {:.2f} MiB", name, static_cast<double>(bytes) / (1 << 20));
    if (exact != totals.end() && exact->second > 0 && name != exact_label)
      out +=
          fmt::format(" ({:.0f} % of exact)", 100.0 * static_cast<double>(bytes) / static_cast<double>(exact->second));
    out += ";";
  }
  out.back() = '\n';
  return out;
}

std::string grad_report_json(const std::vector<LayerGradReport>& report) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : report) {
    nlohmann::json layer{{"layer", r.name}, {"type", r.type}, {"B", r.B},          {"L", r.L},
                         {"I", r.I},        {"O", r.O},       {"x_crest", r.x_crest}, {"w_crest", r.w_crest},
                         {"gy_crest", r.gy_crest}};
    nlohmann::json res = nlohmann::json::array();
    for (const auto& e : r.results)
      res.push_back({{"pipeline", e.pipeline},
                     {"name", e.name},
                     {"y_rel_err", e.y_rel_err},
                     {"y_cosine", e.y_cosine},
                     {"gx_rel_err", e.gx_rel_err},
                     {"gx_cosine", e.gx_cosine},
                     {"gw_rel_err", e.gw_rel_err},
                     {"gw_cosine", e.gw_cosine},
                     {"saved_bytes", e.saved_bytes}});
    layer["results"] = res;
    j.push_back(layer);
  }
  return j.dump(2) + "\n";
}

}  // namespace ht::train
