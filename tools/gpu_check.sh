#!/usr/bin/env bash
# GPU check, run on the GPU machine from the repository root: configures a Release build with the CUDA
# backend for Hopper (sm_90a) in build-gpu/, builds everything with all cores, runs the `gpu` test label,
# then the `cpu` label, copies the logs into $OUT (default ./gpu_out), runs the kernel benchmarks
# (tools/bench/run_benchmarks.sh, group `kernels`; GPU_CHECK_BENCH lists other groups, "" skips them;
# GPU_CHECK_CPU=0 skips the cpu label) and prints a per-label summary table last (the device tool returns only
# the tail of the output).
# Exit code: 0 when no test failed; 1 at once when nvidia-smi fails or lists no GPU, or when the CUDA runtime's
# device query fails or finds no device (every gpu test would fail too: HT_TEST_REQUIRE_CUDA=1).
# Usage: tools/gpu_check.sh [extra ctest args, e.g. -R test_gpu_copy]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines

# This runs on the GPU machine: no GPU, or a driver that cannot be queried, is an error, never a skip.
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1; then
  cat "$OUT/gpu.txt"
  echo "gpu_check: nvidia-smi failed (above): the NVIDIA driver cannot be queried on this machine"
  exit 1
fi
cat "$OUT/gpu.txt"
if [ ! -s "$OUT/gpu.txt" ]; then
  echo "gpu_check: nvidia-smi lists no GPU"
  exit 1
fi
# Every gpu test fails (instead of skipping) when the CUDA runtime finds no device (tests/support/gpu_main.cpp).
export HT_TEST_REQUIRE_CUDA=1

gen=()
command -v ninja >/dev/null && [ ! -f build-gpu/CMakeCache.txt ] && gen=(-G Ninja)
t0=$(date +%s)
if ! cmake -S . -B build-gpu "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    >"$OUT/configure.log" 2>&1; then
  tail -40 "$OUT/configure.log"
  echo "gpu_check: configure failed (log: $OUT/configure.log)"
  exit 1
fi
grep -E "CUDA|cuDNN|Catch2" "$OUT/configure.log" | head -5
if ! cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1; then
  grep -m30 -E "error|FAILED" "$OUT/build.log"
  tail -20 "$OUT/build.log"
  echo "gpu_check: build failed (log: $OUT/build.log)"
  exit 1
fi
t1=$(date +%s)
echo "build: $((t1 - t0)) s"

# The CUDA runtime's own device query, as the tests make it: a driver/runtime mismatch or an initialisation
# error fails here with the error's name (tests/support/gpu_main.cpp).
if ! build-gpu/tests/test_gpu_device --cuda-device-query >"$OUT/device_query.log" 2>&1; then
  cat "$OUT/device_query.log"
  echo "gpu_check: the CUDA device query failed (above; log: $OUT/device_query.log)"
  exit 1
fi
cat "$OUT/device_query.log"

# The GPU tests first (a few at a time: they share one device), then the CPU suite in the same build.
ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 900 -j4 "$@" >"$OUT/ctest-gpu.log" 2>&1
rc_gpu=$?
cp build-gpu/Testing/Temporary/LastTest.log "$OUT/LastTest-gpu.log" 2>/dev/null
rc_cpu=0
if [ "${GPU_CHECK_CPU:-1}" != 0 ]; then  # GPU_CHECK_CPU=0 skips the cpu label (CI runs it)
  ctest --test-dir build-gpu -L cpu --output-on-failure --timeout 900 -j"$(nproc)" "$@" >"$OUT/ctest-cpu.log" 2>&1
  rc_cpu=$?
else
  : >"$OUT/ctest-cpu.log"
fi
cp build-gpu/Testing/Temporary/LastTest.log "$OUT/LastTest-cpu.log" 2>/dev/null
t2=$(date +%s)

# Summary: one row per label from ctest's per-test result lines.
summary() {  # label log
  local log=$2
  local passed failed skipped
  passed=$(grep -cE "Test +#[0-9]+: .* Passed" "$log")
  failed=$(grep -cE "Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception|Not Run)" "$log")
  skipped=$(grep -cE "Test +#[0-9]+: .*\*\*\*Skipped" "$log")
  printf "%-6s %7s %7s %8s\n" "$1" "$passed" "$failed" "$skipped"
  grep -E "Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception|Not Run)" "$log" | sed -E 's/^.*Test +#[0-9]+: ([^ ]+).*\*\*\*/         failed: \1 /'
}
if [ "$rc_gpu" -ne 0 ] || [ "$rc_cpu" -ne 0 ]; then
  echo
  echo "== first failures (full output in $OUT/ctest-gpu.log and ctest-cpu.log) =="
  grep -hE -A4 "FAILED:|due to unexpected exception|\*\*\*(Failed|Timeout|Exception)" "$OUT/ctest-gpu.log" \
    "$OUT/ctest-cpu.log" | head -40
fi
bench_groups=${GPU_CHECK_BENCH-kernels}
if [ -n "$bench_groups" ]; then
  # shellcheck disable=SC2086
  tools/bench/run_benchmarks.sh build-gpu "$OUT/bench" $bench_groups >"$OUT/bench.log" 2>&1
  echo "benchmarks ($bench_groups): logs in $OUT/bench"
fi
echo
echo "== gpu_check summary ($(head -1 "$OUT/gpu.txt"); tests $((t2 - t1)) s) =="
printf "%-6s %7s %7s %8s\n" label passed failed skipped
summary gpu "$OUT/ctest-gpu.log"
summary cpu "$OUT/ctest-cpu.log"
[ "$rc_gpu" -eq 0 ] && [ "$rc_cpu" -eq 0 ]
