// Test main for the `gpu` label. Before Catch runs it asks the CUDA runtime how many devices there are:
//  - no CUDA device on this machine (cudaErrorNoDevice, or no driver installed at all: cudaErrorInsufficientDriver
//    with driver version 0, or the toolkit's stub libcuda): prints why and exits 77, which CTest reports as
//    skipped (SKIP_RETURN_CODE, set on gpu-labelled tests only). With HT_TEST_REQUIRE_CUDA=1 (tools/gpu_check.sh,
//    on the GPU machine) this is a failure instead (exit 1).
//  - fewer devices than HT_TEST_CUDA_DEVICES (default 1; tests/CMakeLists.txt sets 2 for the [multi_gpu] tests):
//    exit 77, also under HT_TEST_REQUIRE_CUDA (a machine with one GPU cannot run a two-GPU test).
//  - any other failure of the query (a driver older than the runtime, an initialisation error, ...): exit 1
//    with the error's name. A broken driver never reads as "no GPU".
// With the single argument --cuda-device-query the program runs only this check (exit 0: the tests could run).
// Works with Catch2 2.x and 3.x.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER  // Catch2 2.x: this translation unit also holds Catch's implementation
#include <catch2/catch.hpp>
#endif

#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// A crash in a GPU test (often inside the CUDA libraries) prints the native stack to stderr: Catch reports
// the signal, restores this handler and re-raises, so this runs last. Symbol names need -rdynamic (set in
// tests/CMakeLists.txt for the GPU tests).
void print_stack(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char msg[] = "\n--- native stack at the fatal signal ---\n";
  (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

constexpr int kSkip = 77;

// HT_TEST_CUDA_DEVICES: how many devices the selected tests need (a positive integer; default 1).
int devices_needed() {
  const char* v = std::getenv("HT_TEST_CUDA_DEVICES");
  if (v == nullptr || *v == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 1 || n > 64) {
    std::fprintf(stderr, "HT_TEST_CUDA_DEVICES=%s: expected a device count from 1 to 64\n", v);
    std::exit(1);
  }
  return static_cast<int>(n);
}

bool cuda_required() {
  const char* v = std::getenv("HT_TEST_REQUIRE_CUDA");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Returns -1 to run the tests, else the exit code (kSkip or 1) after printing why.
int check_devices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaGetLastError();
  const bool no_driver = (err == cudaErrorInsufficientDriver && driver == 0) || err == cudaErrorStubLibrary;
  if (err == cudaErrorNoDevice || no_driver || (err == cudaSuccess && count == 0)) {
    const char* why = err == cudaSuccess ? "0 devices" : cudaGetErrorName(err);
    if (cuda_required()) {
      std::fprintf(stderr, "no CUDA device (%s, driver version %d, runtime %d), and HT_TEST_REQUIRE_CUDA=1: failing\n",
                   why, driver, runtime);
      return 1;
    }
    std::printf("no CUDA device (%s): skipping\n", why);
    return kSkip;
  }
  if (err != cudaSuccess) {
    std::fprintf(stderr, "the CUDA device query failed: cudaGetDeviceCount returned %s (%s); driver version %d, runtime %d\n",
                 cudaGetErrorName(err), cudaGetErrorString(err), driver, runtime);
    return 1;
  }
  const int needed = devices_needed();
  if (count < needed) {
    std::printf("these tests need %d CUDA devices, %d visible: skipping\n", needed, count);
    return kSkip;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (const int rc = check_devices(); rc >= 0) return rc;
  // --cuda-device-query: only the check above (tools/gpu_check.sh runs it before the tests), exit 0 when it passed.
  if (argc == 2 && std::strcmp(argv[1], "--cuda-device-query") == 0) {
    int count = 0;
    (void)cudaGetDeviceCount(&count);
    std::printf("%d CUDA device%s\n", count, count == 1 ? "" : "s");
    return 0;
  }
  std::signal(SIGSEGV, print_stack);
  std::signal(SIGABRT, print_stack);
  return Catch::Session().run(argc, argv);
}
