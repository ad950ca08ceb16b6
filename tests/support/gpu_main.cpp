// Test main for the `gpu` label: without a visible CUDA device it prints "no CUDA device: skipping" and
// exits with 77, which CTest reports as skipped (SKIP_RETURN_CODE). Works with Catch2 2.x and 3.x.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER  // Catch2 2.x: this translation unit also holds Catch's implementation
#include <catch2/catch.hpp>
#endif

#include <cstdio>

#include "hadatrain/tensor/device.h"

int main(int argc, char** argv) {
  if (ht::cuda_device_count() == 0) {
    std::puts("no CUDA device: skipping");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
