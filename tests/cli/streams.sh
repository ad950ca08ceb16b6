#!/usr/bin/env bash
# Note [Log on stderr] (core/logging.h): stdout carries a command's results alone, stderr its log. A short run's
# stdout is its result line, and the eval of its checkpoint prints the evaluation's line alone.
#   streams.sh HADATRAIN WORKDIR TRAIN_ARGS...
set -u
exe=$1 work=$2
shift 2
fail() { echo "FAIL: $*"; for f in "$work"/*.out "$work"/*.err; do echo "--- $f"; cat "$f"; done; exit 1; }
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
lines() { grep -c '' "$1"; }

"$exe" train "$@" --set run.out_dir="$work/run" --set checkpoint.every_steps=2 >"$work/train.out" 2>"$work/train.err" ||
  fail "the run failed"
[ "$(lines "$work/train.out")" -eq 1 ] && grep -q '^final test accuracy: ' "$work/train.out" ||
  fail "train's stdout is not its result line alone"
grep -q '^\[[0-9:.]*\] \[info\] model: ' "$work/train.err" || fail "train's log is not on stderr"

"$exe" eval "$@" --checkpoint "$work/run/checkpoints" >"$work/eval.out" 2>"$work/eval.err" || fail "the eval failed"
[ "$(lines "$work/eval.out")" -eq 1 ] && grep -q '^test loss [0-9.]*, top-1 [0-9.]*%.*([0-9]* samples)$' "$work/eval.out" ||
  fail "eval's stdout is not its result line alone"
grep -q '\[info\]' "$work/eval.err" || fail "eval's log is not on stderr"

echo "ok: results on stdout, $(lines "$work/train.err") + $(lines "$work/eval.err") log lines on stderr"
