// Timing shared by the CUDA benchmark programs (bench_grad, bench_layers, bench_train): the median of `reps`
// runs of f, each between two CUDA events on the default stream (median_ms_on: on `stream`, for work issued
// there, e.g. a step graph's replays), after `warmup` untimed runs and a device synchronisation (then
// `after_warmup`, e.g. to reset the peak-memory counter); median_ms_prepared with untimed work before each run.
// Also what a record names its run by: shell_line (a command's output, e.g. the commit), env_or and command_line.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ht::bench {

// The median of f's runs, each after prepare() (issued on `stream` before the first event, so its work is not
// timed; e.g. a forward whose saved state one backward consumes).
template <class P, class F>
double median_ms_prepared_on(cudaStream_t stream, P&& prepare, F&& f, int warmup = 3, int reps = 20,
                             void (*after_warmup)() = nullptr) {
  for (int i = 0; i < warmup; ++i) {
    prepare();
    f();
  }
  cudaDeviceSynchronize();
  if (after_warmup) after_warmup();
  std::vector<float> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < reps; ++i) {
    prepare();
    cudaEventRecord(a, stream);
    f();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class P, class F>
double median_ms_prepared(P&& prepare, F&& f, int warmup = 3, int reps = 20) {
  return median_ms_prepared_on(nullptr, prepare, f, warmup, reps);
}

template <class F>
double median_ms_on(cudaStream_t stream, F&& f, int warmup = 3, int reps = 20, void (*after_warmup)() = nullptr) {
  return median_ms_prepared_on(stream, [] {}, f, warmup, reps, after_warmup);
}

template <class F>
double median_ms(F&& f, int warmup = 3, int reps = 20, void (*after_warmup)() = nullptr) {
  return median_ms_on(nullptr, f, warmup, reps, after_warmup);
}

// The standard output of `cmd` (popen) without its trailing newlines and spaces; empty when it cannot run.
inline std::string shell_line(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The environment variable `name`, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// argv as a shell would read it back: an empty argument, or one with a character outside [A-Za-z0-9_./=:+,-], in
// double quotes (with ", \, $ and ` escaped), so that `bench_halo "" "halo2 fp8"` is recorded as typed.
inline std::string command_line(int argc, char** argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./=:+,-") == std::string::npos;
    if (i > 0) line += ' ';
    if (plain) {
      line += a;
      continue;
    }
    line += '"';
    for (char c : a) {
      if (c == '"' || c == '\\' || c == '$' || c == '`') line += '\\';
      line += c;
    }
    line += '"';
  }
  return line;
}

}  // namespace ht::bench
