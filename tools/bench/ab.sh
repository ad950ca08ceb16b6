#!/usr/bin/env bash
# A/B comparison of one change in one call on the GPU machine, where no .git travels: A is the tree as it is, B the
# tree with PATCH applied (a unified diff with paths from the repository root, e.g. `git diff A B -- src include >
# .device/b.patch`, carried in an ignored folder). Configures BUILD (Release, sm_90a) if needed, builds TARGET (a
# tool under BUILD/tools) for A and keeps a copy of it, applies PATCH (git apply, else patch -p1), builds TARGET and
# each --test target again (only what PATCH touches recompiles), runs B's tests, then runs A and B alternately, A
# first, RUNS times each, each in its own process: timings compare only within one call and one machine, and the
# alternation spreads a drift of the clocks over both. The tree is left with PATCH applied.
#   HT_BENCH_COMMIT and HADATRAIN_COMMIT are set to A_COMMIT or B_COMMIT (environment; default "A" and "B") for
#   each run, so result records (bench_halo's JSON lines) carry the commit they measured.
# Output under OUT (default ./ab_out): A1.out, B1.out, ... (stdout of each run, stderr in .err), tests.log, build
# logs; last, per run, each JSON line's name, `ours` and speed-up (bench_halo's records), or the run's last lines.
# Exit code: 1 if a build, the patch or a test fails; else 0.
# Usage: tools/bench/ab.sh [--runs N] [--build DIR] [--test TEST_TARGET]... PATCH TARGET [ARGS...]
#   e.g. tools/bench/ab.sh --runs 2 --test test_gpu_halo .device/b.patch bench_halo up_proj "halo2 fp8" llama3_8b
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
usage="usage: tools/bench/ab.sh [--runs N] [--build DIR] [--test TEST_TARGET]... PATCH TARGET [ARGS...]"
runs=2 build=build-gpu tests=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=${2:?$usage}; shift 2 ;;
    --build) build=${2:?$usage}; shift 2 ;;
    --test) tests+=("${2:?$usage}"); shift 2 ;;
    --*) echo "ab: unknown option '$1' ($usage)" >&2; exit 2 ;;
    *) break ;;
  esac
done
patch_file=${1:?$usage}
target=${2:?$usage}
shift 2
[ -f "$patch_file" ] || { echo "ab: no patch file '$patch_file'" >&2; exit 2; }
case "$runs" in '' | *[!0-9]* | 0) echo "ab: --runs takes a positive integer, not '$runs'" >&2; exit 2 ;; esac
OUT=${OUT:-$PWD/ab_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines
bin_dir=$(mktemp -d)
trap 'rm -rf "$bin_dir"' EXIT  # the two binaries, on every exit

build_targets() {  # log-name target...
  local log="$OUT/$1.log"
  shift
  if ! cmake --build "$build" -j"$(nproc)" --target "$@" >"$log" 2>&1; then
    grep -m20 -E "error|FAILED" "$log"
    echo "ab: building $* failed (log: $log)"
    exit 1
  fi
}

t0=$(date +%s)
if [ ! -f "$build/CMakeCache.txt" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if ! cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      >"$OUT/configure.log" 2>&1; then
    tail -30 "$OUT/configure.log"
    echo "ab: configure failed (log: $OUT/configure.log)"
    exit 1
  fi
fi
build_targets build_A "$target"
cp "$build/tools/$target" "$bin_dir/A"
echo "ab: A built in $(($(date +%s) - t0)) s"

# git looks for no repository above this tree (one around a scratch copy would make it skip the patch's paths)
export GIT_CEILING_DIRECTORIES="$(dirname "$PWD")"
if command -v git >/dev/null && git apply --check "$patch_file" 2>/dev/null; then
  git apply "$patch_file"
elif command -v patch >/dev/null && patch -p1 --dry-run -s <"$patch_file" >/dev/null; then
  patch -p1 -s <"$patch_file"
else
  echo "ab: $patch_file does not apply to this tree (git apply and patch -p1 both refuse it)"
  exit 1
fi
build_targets build_B "$target" "${tests[@]}"
cp "$build/tools/$target" "$bin_dir/B"
echo "ab: B built in $(($(date +%s) - t0)) s"

failed=0
for t in "${tests[@]}"; do
  if HT_TEST_REQUIRE_CUDA=1 "$build/tests/$t" >>"$OUT/tests.log" 2>&1; then
    echo "ab: B passes $t"
  else
    echo "ab: B fails $t (log: $OUT/tests.log)"
    failed=1
  fi
done
[ $failed = 0 ] || exit 1

for i in $(seq "$runs"); do
  for v in A B; do
    commit=${A_COMMIT:-A}
    [ $v = B ] && commit=${B_COMMIT:-B}
    HT_BENCH_COMMIT=$commit HADATRAIN_COMMIT=$commit "$bin_dir/$v" "$@" >"$OUT/$v$i.out" 2>"$OUT/$v$i.err" \
      || echo "ab: run $v$i exited with $? (stderr: $OUT/$v$i.err)"
  done
done
echo "ab: runs done in $(($(date +%s) - t0)) s"

for i in $(seq "$runs"); do
  for v in A B; do
    echo "== $v$i"
    python3 - "$OUT/$v$i.out" <<'PY'
import json
import sys

rows = []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    if line.startswith("{"):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "name" in r and "ours" in r:
            rows.append(f'{r["name"][:72]:72s} {r["ours"]:9.4g} {r.get("speedup_vs_exact_bf16", "")}')
if rows:
    print("\n".join(rows))
else:
    print("".join(open(sys.argv[1], encoding="utf-8", errors="replace").readlines()[-5:]), end="")
PY
  done
done
