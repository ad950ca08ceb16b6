// The run's log lines, JSONL records and progress line (run_log.h).
#include "run_log.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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

}  // namespace

RunLog::RunLog(RunLogOptions o)
    : o_(std::move(o)), metrics_(o_.metrics_path, o_.mode), tty_(isatty(STDOUT_FILENO) == 1), last_draw_(Clock::now()) {}

void RunLog::train(const TrainWindow& w) {
  spdlog::info("epoch {}/{} step {} ({}/{}) loss {:.4f} lr {:.4g} {:.0f} {}/s data_wait {:.2f}", w.epoch + 1, o_.epochs,
               w.step, w.batch, o_.steps_per_epoch, w.loss, w.lr, w.throughput, o_.unit, w.data_wait);
  MetricsRecord rec("train");
  rec.add("step", w.step).add("epoch", w.epoch + 1).add("loss", w.loss).add("lr", w.lr);
  rec.add(o_.unit + "_per_s", w.throughput);
  rec.add("data_wait", w.data_wait);
  rec.add("host_peak_mb", peak_host_mb());
  if (const double gpu = peak_gpu_mb(o_.device); gpu >= 0) rec.add("gpu_peak_mb", gpu);
  if (w.grad_norm) rec.add("grad_norm", *w.grad_norm);
  metrics_.write(rec);
}

void RunLog::eval(int64_t step, int64_t epoch, double seconds, double train_loss, const EvalResult& ev) {
  spdlog::info("epoch {}/{} done in {:.1f} s: train loss {:.4f}, {}", epoch + 1, o_.epochs, seconds, train_loss,
               ev.summary);
  MetricsRecord rec("eval");
  rec.add("step", step).add("epoch", epoch + 1).add("train_loss", train_loss).add("test_loss", ev.loss);
  for (const EvalMetric& m : ev.metrics)
    std::visit([&](auto v) { rec.add("test_" + m.name, v); }, m.value);
  rec.add("epoch_seconds", seconds).add("host_peak_mb", peak_host_mb());
  metrics_.write(rec);
}

void RunLog::progress(int64_t step, int64_t epoch, int64_t batch, double loss, double throughput) {
  if (!tty_) return;
  const Clock::time_point now = Clock::now();
  if (!first_) first_.emplace(step, now);
  const bool epoch_end = batch == o_.steps_per_epoch;
  if (std::chrono::duration<double>(now - last_draw_).count() < 0.2 && !epoch_end) return;
  last_draw_ = now;
  // Time left from this process's own pace (steps since the first one shown); evaluations are not counted.
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
  fmt::print("\r{}{}", line, std::string(drawn_ > line.size() ? drawn_ - line.size() : 0, ' '));
  std::fflush(stdout);
  drawn_ = line.size();
}

void RunLog::clear_progress() {
  if (!tty_ || drawn_ == 0) return;
  fmt::print("\r{}\r", std::string(drawn_, ' '));
  std::fflush(stdout);
  drawn_ = 0;
}

}  // namespace ht::train
