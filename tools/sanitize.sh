#!/usr/bin/env bash
# Sanitizer runs of the CPU build (RelWithDebInfo, no CUDA); any report fails the test that triggered it. CI does not
# run them: run them before landing changes to memory handling, parsers, threads or the autograd engine.
#   tools/sanitize.sh [ctest args]          AddressSanitizer + UndefinedBehaviorSanitizer in build-asan/, the cpu
#                                            test label (about 20 minutes on 2 cores), e.g. -R test_config
#   tools/sanitize.sh --thread [ctest args] ThreadSanitizer in build-tsan/, the tests that run threads (the loaders'
#                                            workers, the token store's tokenisers, the trainer, the communicators
#                                            and the ranks of tests/dist); OpenBLAS runs one thread, as its own
#                                            threads are not instrumented and their synchronisation looks like races
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/setup.sh
if [ "${1:-}" = "--thread" ]; then
  shift
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHADATRAIN_WITH_CUDA=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread"
  targets=(test_loader test_text_loader test_text_store test_trainer)
  for f in tests/dist/test_dist_*.cpp; do
    [ "$f" = tests/dist/test_dist_resnet.cpp ] || targets+=("$(basename "$f" .cpp)")
  done
  cmake --build build-tsan -j "$(nproc)" --target "${targets[@]}"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  export OPENBLAS_NUM_THREADS=1
  # test_dist_resnet (ResNet-18 on the CPU) outlasts its CTest timeout under ThreadSanitizer; its ranks run the code
  # test_dist_fsdp and test_dist_trainer run.
  exec ctest --test-dir build-tsan -L cpu -E '^test_dist_resnet$' --output-on-failure -j2 \
    -R '^(test_loader|test_text_loader|test_text_store|test_trainer|test_dist_.*)$' "$@"
fi
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHADATRAIN_WITH_CUDA=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build build-asan -j "$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
exec ctest --test-dir build-asan -L cpu --output-on-failure -j2 --timeout 900 "$@"
