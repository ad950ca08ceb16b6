// kernel_trace: the GPU time of every kernel a process runs, summed per kernel name, printed when it exits.
//
//   CUDA_INJECTION64_PATH=build-gpu/tools/libht_kernel_trace.so build-gpu/tools/bench_train vit_b16 256 bf16 exact
//
// The CUDA driver loads this library through CUDA_INJECTION64_PATH and calls InitializeInjection() at cuInit, before
// the program's first CUDA call; the library asks CUPTI for a record of each kernel (start and end on the GPU's
// clock, also for kernels launched by a graph replay) and, at exit, prints one line per kernel name: launches, total
// and mean time, share of all kernel time. For profiling machines without Nsight Systems; the summary goes to stderr,
// or to the file HT_KERNEL_TRACE_OUT names. HT_KERNEL_TRACE_TOP caps the lines (default 60). Kernels of every phase
// of the program are counted (warm-up, eager steps, graph replays): compare shares, or set HT_KERNEL_TRACE_STEPS to
// the number of steps the program ran for a column of milliseconds per step.
#include <cupti.h>

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

// The kernel record of this CUPTI: the start, end and name fields every version has.
#if CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
#else
using KernelRecord = CUpti_ActivityKernel9;
#endif

struct Totals {
  long long launches = 0;
  unsigned long long ns = 0;
};

std::mutex g_mu;
std::map<std::string, Totals>* g_totals = nullptr;  // leaked: read by the atexit handler after static destruction
constexpr size_t kBufferBytes = 8u << 20;

std::string demangled(const char* name) {
  if (name == nullptr) return "(unnamed)";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  // Template arguments make names long; the kernel's own name and its first arguments are what tell them apart.
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    auto* k = reinterpret_cast<KernelRecord*>(rec);
    Totals& t = (*g_totals)[demangled(k->name)];
    t.launches += 1;
    t.ns += k->end - k->start;
  }
  std::free(buffer);
}

void report() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::pair<std::string, Totals>> rows(g_totals->begin(), g_totals->end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  unsigned long long all = 0;
  for (const auto& r : rows) all += r.second.ns;
  const char* path = std::getenv("HT_KERNEL_TRACE_OUT");
  FILE* out = path != nullptr ? std::fopen(path, "w") : stderr;
  if (out == nullptr) out = stderr;
  const char* top_env = std::getenv("HT_KERNEL_TRACE_TOP");
  const size_t top = top_env != nullptr ? static_cast<size_t>(std::atol(top_env)) : 60;
  std::fprintf(out, "kernel_trace: %zu kernel names, %.3f ms of kernel time in all\n", rows.size(), all / 1e6);
  const char* steps_env = std::getenv("HT_KERNEL_TRACE_STEPS");
  const double steps = steps_env != nullptr ? std::atof(steps_env) : 0.0;
  if (steps > 0) std::fprintf(out, "per step (%g steps): %.3f ms\n", steps, all / 1e6 / steps);
  std::fprintf(out, "%10s %12s %10s %10s %6s  %s\n", "launches", "total ms", "mean us", "ms/step", "share", "kernel");
  for (size_t i = 0; i < rows.size() && i < top; ++i) {
    const Totals& t = rows[i].second;
    std::fprintf(out, "%10lld %12.3f %10.2f %10.3f %5.1f%%  %s\n", t.launches, t.ns / 1e6, t.ns / 1e3 / t.launches,
                 steps > 0 ? t.ns / 1e6 / steps : 0.0, all > 0 ? 100.0 * t.ns / all : 0.0, rows[i].first.c_str());
  }
  if (out != stderr) std::fclose(out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  g_totals = new std::map<std::string, Totals>();
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity; no trace\n");
    return 0;
  }
  std::atexit(report);
  return 1;
}
