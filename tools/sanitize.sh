#!/usr/bin/env bash
# Builds the CPU build with AddressSanitizer and UndefinedBehaviorSanitizer in build-asan/ (RelWithDebInfo, no
# CUDA) and runs the cpu test label under them; any report fails the test that triggered it. Takes about 20 minutes
# on 2 cores, so CI does not run it: run it before landing changes to memory handling, parsers or the autograd
# engine. Extra arguments go to ctest (e.g. -R test_config).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/setup.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHADATRAIN_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
exec ctest --test-dir build-asan -L cpu --output-on-failure -j2 --timeout 900 "$@"
