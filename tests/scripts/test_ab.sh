#!/usr/bin/env bash
# tools/bench/ab.sh on a scratch project (a copy of the script beside a CMake project of two small programs, so the
# real tree is never patched): A and B each run their own binary, alternating, with their commits in the
# environment; B's test target runs and its failure fails the call; a patch that does not apply fails it.
# Usage: test_ab.sh AB_SCRIPT WORK_DIR
set -euo pipefail
script=${1:?usage: test_ab.sh AB_SCRIPT WORK_DIR}
work=${2:?usage: test_ab.sh AB_SCRIPT WORK_DIR}
rm -rf "$work"
mkdir -p "$work/tree/tools/bench" "$work/tree/tests"
cp "$script" "$work/tree/tools/bench/ab.sh"
cd "$work/tree"
cat >CMakeLists.txt <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(ab_scratch CXX)
add_subdirectory(tools)
add_subdirectory(tests)
EOF
mkdir -p tools
echo 'add_executable(probe probe.cpp)' >tools/CMakeLists.txt
cat >tools/probe.cpp <<'EOF'
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
  const char* c = std::getenv("HT_BENCH_COMMIT");
  std::printf("{\"name\": \"probe %s\", \"ours\": %d, \"commit\": \"%s\"}\n", argc > 1 ? argv[1] : "-", 1, c ? c : "");
  return 0;
}
EOF
echo 'add_executable(check check.cpp)' >tests/CMakeLists.txt
echo 'int main() { return 0; }' >tests/check.cpp
# Writes to PATCH_FILE the unified diff (paths a/PATH, b/PATH) that SED_EXPR makes of PATH; the original stays
# in PATCH_FILE.d/a
make_patch() {  # PATCH_FILE PATH SED_EXPR
  local d="$1.d"
  mkdir -p "$d/a/$(dirname "$2")" "$d/b/$(dirname "$2")"
  cp "$2" "$d/a/$2"
  sed "$3" "$2" >"$d/b/$2"
  (cd "$d" && diff -u "a/$2" "b/$2") >"$1" || true
}
make_patch "$work/b.patch" tools/probe.cpp 's/"ours\\": %d/"ours\\": %d0/'  # B prints 10 where A prints 1
make_patch "$work/fail.patch" tests/check.cpp 's/return 0;/return 3;/'
fail() { echo "test_ab: $*" >&2; exit 1; }

# A against B, two runs each, with B's test
A_COMMIT=aaa B_COMMIT=bbb OUT="$work/out" bash tools/bench/ab.sh --runs 2 --build "$work/build" --test check \
  "$work/b.patch" probe xyz >"$work/ab.log" 2>&1 || { cat "$work/ab.log"; fail "ab.sh failed on a patch that applies"; }
for i in 1 2; do
  grep -q '"name": "probe xyz", "ours": 1, "commit": "aaa"' "$work/out/A$i.out" || fail "A$i: $(cat "$work/out/A$i.out")"
  grep -q '"name": "probe xyz", "ours": 10, "commit": "bbb"' "$work/out/B$i.out" || fail "B$i: $(cat "$work/out/B$i.out")"
done
grep -q "ab: B passes check" "$work/ab.log" || fail "B's test did not run: $(cat "$work/ab.log")"
grep -A1 "^== B2" "$work/ab.log" | grep -q "probe xyz *10" || fail "no summary row for B2: $(cat "$work/ab.log")"
grep -q '%d0' tools/probe.cpp || fail "the tree is not left patched"

# B's test fails: the call fails
cp "$work/b.patch.d/a/tools/probe.cpp" tools/probe.cpp
if OUT="$work/out_fail" bash tools/bench/ab.sh --runs 1 --build "$work/build" --test check "$work/fail.patch" probe \
    >"$work/ab_fail.log" 2>&1; then
  fail "ab.sh passed although B's test fails"
fi
grep -q "ab: B fails check" "$work/ab_fail.log" || fail "no test failure reported: $(cat "$work/ab_fail.log")"

# a patch that does not apply (the tree already holds fail.patch): the call fails before any run
if OUT="$work/out_stale" bash tools/bench/ab.sh --runs 1 --build "$work/build" "$work/fail.patch" probe \
    >"$work/ab_stale.log" 2>&1; then
  fail "ab.sh passed with a patch that does not apply"
fi
grep -q "does not apply" "$work/ab_stale.log" || fail "no patch error: $(cat "$work/ab_stale.log")"
[ ! -e "$work/out_stale/A1.out" ] || fail "runs started although the patch does not apply"
echo "test_ab: ok"
