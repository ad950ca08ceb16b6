// Test main for the `gpu` label: without a visible CUDA device it prints "no CUDA device: skipping" and
// exits with 77, which CTest reports as skipped (SKIP_RETURN_CODE). Works with Catch2 2.x and 3.x.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER  // Catch2 2.x: this translation unit also holds Catch's implementation
#include <catch2/catch.hpp>
#endif

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "hadatrain/tensor/device.h"

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

}  // namespace

int main(int argc, char** argv) {
  if (ht::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipping");
    return 77;
  }
  std::signal(SIGSEGV, print_stack);
  std::signal(SIGABRT, print_stack);
  return Catch::Session().run(argc, argv);
}
