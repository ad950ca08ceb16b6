#!/usr/bin/env bash
# Runs a libFuzzer target of tests/fuzz for a given time:
#   tools/fuzz.sh TARGET SECONDS [BUILD_DIR]     e.g. tools/fuzz.sh config 60
#   tools/fuzz.sh --build [BUILD_DIR]            builds every target, runs none
# TARGET is config, safetensors, idx, cifar, image, tokenizer or llama (tests/fuzz/fuzz_<TARGET>.cpp). The targets
# are built in BUILD_DIR (default build-fuzz/) by tests/fuzz/project with clang, libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer. The run starts from the committed seed corpus tests/fuzz/corpus/<TARGET>/
# (read only: new inputs go to BUILD_DIR/corpus/<TARGET>/); a crash, a leak or a sanitizer report stops it
# with a non-zero exit code and leaves the input as BUILD_DIR/crash-* (reproduce: BUILD_DIR/fuzz_<TARGET> FILE).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

build_only=0
if [ "${1:-}" = "--build" ]; then
  build_only=1
  build="${2:-$root/build-fuzz}"
else
  [ $# -ge 2 ] || usage
  target=$1 seconds=$2 build="${3:-$root/build-fuzz}"
  [ -f "$root/tests/fuzz/fuzz_$target.cpp" ] || { echo "fuzz.sh: no target '$target' (tests/fuzz/fuzz_$target.cpp)" >&2; exit 2; }
  [[ "$seconds" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2; }
fi
build="$(realpath -m "$build")"  # the run below works from inside it, so a relative BUILD_DIR must not stay relative

cxx="${FUZZ_CXX:-}"
if [ -z "$cxx" ]; then
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null; then cxx=$(command -v "$c"); break; fi
  done
fi
[ -n "$cxx" ] || { echo "fuzz.sh: clang++ not found (Debian and Ubuntu: tools/setup.sh --fuzz installs it)" >&2; exit 2; }
cc="${cxx/clang++/clang}"

if [ ! -f "$build/build.ninja" ]; then  # also after a configure that failed (a cache but no build files)
  mkdir -p "$build"
  cmake -S "$root/tests/fuzz/project" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
if [ "$build_only" = 1 ]; then
  exec cmake --build "$build" -j "$(nproc)"
fi
cmake --build "$build" -j "$(nproc)" --target "fuzz_$target"

seeds="$root/tests/fuzz/corpus/$target"
work="$build/corpus/$target"
mkdir -p "$work"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cd "$build"
# -rss_limit_mb / -malloc_limit_mb: an input that makes a reader allocate more than 2 GiB is a finding (a size
# taken from a header without a check), not an out-of-memory of the machine.
# FUZZ_SEED fixes libFuzzer's random seed and FUZZ_RUNS caps the number of inputs (CTest sets 1 and 4000: CI
# then tries the same inputs on every run, whatever the machine's speed, and a finding there replays); unset,
# each run draws its own seed and runs for SECONDS.
seed_arg=()
[ -n "${FUZZ_SEED:-}" ] && seed_arg=(-seed="$FUZZ_SEED")
[ -n "${FUZZ_RUNS:-}" ] && seed_arg+=(-runs="$FUZZ_RUNS")
exec "./fuzz_$target" "${seed_arg[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -malloc_limit_mb=2048 \
  -max_len=65536 -print_final_stats=1 "$work" "$seeds"
