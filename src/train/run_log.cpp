// The run's log lines, JSONL records and progress line (run_log.h).
#include "run_log.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "hadatrain/io/atomic_file.h"

#ifdef HADATRAIN_CUDA
#include "hadatrain/cuda/caching_allocator.h"
#endif

namespace ht::train {
namespace {

// Peak GPU memory allocated through the caching allocator on `device` (MiB), or a negative value when the
// run is not on CUDA (the field is then left out).
double peak_gpu_mb(Device device) {
#ifdef HADATRAIN_CUDA
  if (device.is_cuda()) return static_cast<double>(cuda::memory_stats(device.index).peak_allocated_bytes) / (1 << 20);
#endif
  (void)device;
  return -1.0;
}

double peak_host_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// "45s", "3m12s", "2h05m".
std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

// Note [Metrics after a resume]
// A resumed run continues metrics.jsonl, which may hold what the checkpoint does not: records of steps after
// the checkpoint (the interrupted process logged them before it was killed; the resumed run logs those steps
// again) and, after a kill or a full disk in the middle of a write, a cut-off last line. Before appending, the
// file is rewritten (atomically) with the whole records the resumed run will not write again: train records
// up to the checkpoint's step, and eval records before it, or at it unless the resumed run evaluates there
// again. Lines that are not JSON objects (the cut-off line) are dropped with a warning naming the line. So
// after any fault and a resume the file is valid JSONL and logs each step once.
// A record's "type" and "step", when it has both.
std::optional<std::pair<std::string, int64_t>> type_and_step(const nlohmann::json& rec) {
  const auto s = rec.find("step");
  const auto type = rec.find("type");
  if (s == rec.end() || !s->is_number_integer() || type == rec.end() || !type->is_string()) return std::nullopt;
  return std::pair{type->get<std::string>(), s->get<int64_t>()};
}

void trim_metrics_for_resume(const std::string& path, int64_t step, bool evaluates_at_step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  std::string kept;
  int64_t dropped_later = 0, line_no = 0;
  std::size_t pos = 0;
  while (pos < all.size()) {
    const std::size_t end = all.find('\n', pos);
    const bool whole = end != std::string::npos;
    const std::string line = all.substr(pos, whole ? end - pos : std::string::npos);
    pos = whole ? end + 1 : all.size();
    ++line_no;
    if (line.empty()) continue;
    const nlohmann::json rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!whole || !rec.is_object()) {
      spdlog::warn("{}:{}: removed a {} record (the previous process stopped while writing it)", path, line_no,
                   whole ? "damaged" : "cut-off");
      continue;
    }
    if (const auto key = type_and_step(rec)) {
      const auto& [type, at] = *key;
      const bool later = type == "eval" ? (at > step || (at == step && evaluates_at_step)) : at > step;
      if (later) {
        ++dropped_later;
        continue;
      }
    }
    kept += line;
    kept += '\n';
  }
  if (dropped_later > 0)
    spdlog::info("{}: removed {} record(s) after the checkpoint's step {}; the resumed run logs those steps again",
                 path, dropped_later, step);
  if (kept.size() != all.size()) io::write_file_atomic(path, kept);
}

const std::string& prepared_metrics_path(const RunLogOptions& o) {
  if (o.mode == MetricsMode::append) trim_metrics_for_resume(o.metrics_path, o.resume_step, o.evaluates_at_resume_step);
  return o.metrics_path;
}

}  // namespace

bool metrics_has_eval_at(const std::string& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (rec.is_object() && type_and_step(rec) == std::pair<std::string, int64_t>{"eval", step}) return true;
  }
  return false;
}

RunLog::RunLog(RunLogOptions o)
    : o_(std::move(o)), metrics_(prepared_metrics_path(o_), o_.mode), tty_(isatty(STDERR_FILENO) == 1), last_draw_(Clock::now()) {}

void RunLog::train(const TrainWindow& w) {
  spdlog::info("epoch {}/{} step {} ({}/{}) loss {:.4f} lr {:.4g} {:.0f} {}/s data_wait {:.2f}{}", w.epoch + 1,
               o_.epochs, w.step, w.batch, o_.steps_per_epoch, w.loss, w.lr, w.throughput, o_.unit, w.data_wait,
               w.mfu ? fmt::format(" mfu {:.3f}", *w.mfu) : "");
  MetricsRecord rec("train");
  rec.add("step", w.step).add("epoch", w.epoch + 1).add("loss", w.loss).add("lr", w.lr);
  rec.add(o_.unit + "_per_s", w.throughput);
  rec.add("data_wait", w.data_wait);
  rec.add("host_peak_mb", peak_host_mb());
  if (const double gpu = peak_gpu_mb(o_.device); gpu >= 0) rec.add("gpu_peak_mb", gpu);
  if (w.grad_norm) rec.add("grad_norm", *w.grad_norm);
  if (w.mfu) rec.add("mfu", *w.mfu);
  for (const auto& [k, v] : w.extra) rec.add(k, v);
  metrics_.write(rec);
}

void RunLog::eval(const EvalAt& at, const EvalResult& ev, const EvalResult* average) {
  const std::string averaged = average != nullptr ? "; weight average: " + average->summary : std::string();
  const bool mid_epoch = at.point == EvalPoint::mid_epoch;
  if (mid_epoch)
    spdlog::info("step {} (epoch {}/{}, {}/{}): train loss so far {:.4f}, {}{}", at.step, at.epoch + 1, o_.epochs,
                 at.batch, o_.steps_per_epoch, at.train_loss, ev.summary, averaged);
  else
    spdlog::info("epoch {}/{} done in {:.1f} s: train loss {:.4f}, {}{}", at.epoch + 1, o_.epochs, at.seconds,
                 at.train_loss, ev.summary, averaged);
  MetricsRecord rec("eval");
  rec.add("step", at.step).add("epoch", at.epoch + 1).add("train_loss", at.train_loss).add("test_loss", ev.loss);
  for (const EvalMetric& m : ev.metrics)
    std::visit([&](auto v) { rec.add("test_" + m.name, v); }, m.value);
  if (average != nullptr) {
    rec.add("ema_test_loss", average->loss);
    for (const EvalMetric& m : average->metrics)
      std::visit([&](auto v) { rec.add("ema_test_" + m.name, v); }, m.value);
  }
  // epoch_seconds only at an epoch's end, so that their sum over the records is the run's training time.
  if (!mid_epoch) rec.add("epoch_seconds", at.seconds);
  rec.add("host_peak_mb", peak_host_mb());
  metrics_.write(rec);
}

void RunLog::progress(int64_t step, int64_t epoch, int64_t batch, double loss, double throughput) {
  if (!tty_) return;
  const Clock::time_point now = Clock::now();
  if (!first_) first_.emplace(step, now);
  const bool epoch_end = batch == o_.steps_per_epoch;
  if (std::chrono::duration<double>(now - last_draw_).count() < 0.2 && !epoch_end) return;
  last_draw_ = now;
  // Time left from this process's own pace since the first step shown: the evaluations and checkpoints in that time
  // are part of the pace, so the estimate expects those to come at the rate they came.
  std::string left = "--";
  const int64_t done = step - first_->first;
  const double elapsed = std::chrono::duration<double>(now - first_->second).count();
  if (done > 0 && elapsed > 0) left = duration_text(elapsed / static_cast<double>(done) *
                                                    static_cast<double>(std::max<int64_t>(o_.total_steps - step, 0)));
  const double epoch_fraction =
      static_cast<double>(epoch) + static_cast<double>(batch) / static_cast<double>(std::max<int64_t>(o_.steps_per_epoch, 1));
  const std::string line =
      fmt::format(" step {}/{} | epoch {:.2f}/{} | loss {:.4f} | {:.0f} {}/s | {} left", step, o_.total_steps,
                  epoch_fraction, o_.epochs, loss, throughput, o_.unit, left);
  // Pad over a longer previous line.
  fmt::print(stderr, "\r{}{}", line, std::string(drawn_ > line.size() ? drawn_ - line.size() : 0, ' '));
  std::fflush(stderr);
  drawn_ = line.size();
}

void RunLog::clear_progress() {
  if (!tty_ || drawn_ == 0) return;
  fmt::print(stderr, "\r{}\r", std::string(drawn_, ' '));
  std::fflush(stderr);
  drawn_ = 0;
}

}  // namespace ht::train
