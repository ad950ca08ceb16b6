#!/usr/bin/env bash
# The log of a launched job (Note [Logs of several ranks] in include/hadatrain/core/logging.h): every line names its
# rank, rank 0 logs the progress, the other ranks only warnings and errors, and a warning about the config that all
# ranks read (a --set that drops the file's keys) is given once, by rank 0, not by the launcher's check as well; the
# result line is rank 0's alone (the ranks' figures are the same).
#   launch_logs.sh HADATRAIN WORKDIR TRAIN_ARGS...
set -u
exe=$1 work=$2
shift 2
fail() { echo "FAIL: $*"; echo "--- $work/out"; cat "$work/out"; exit 1; }
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"

"$exe" launch --nproc-per-node 2 -- train "$@" --set run.out_dir="$work/run" --set dist.mode=ddp \
  --set dist.engine=gloo --set dist.timeout_s=30 --set optim.name=adamw >"$work/out" 2>&1 || fail "the launch failed"
grep -q '^\[[0-9:.]*\] \[rank 0\] \[info\] model: ' "$work/out" || fail "no info line of rank 0"
! grep -q '\[rank 1\] \[info\]' "$work/out" || fail "rank 1 logged info lines"
[ "$(grep -c "dropped the file's optim.momentum" "$work/out")" -eq 1 ] || fail "the config's warning is not given once"
grep -q "\[rank 0\] \[warning\] --set optim.name=adamw: dropped the file's optim.momentum" "$work/out" ||
  fail "rank 0 did not give the config's warning"
! grep -vE '^\[[0-9:.]*\] (\[rank [01]\] )?\[[a-z]+\] |^final test accuracy: ' "$work/out" | grep -q . ||
  fail "lines that are neither a rank's log nor a result: $(grep -vE '^\[[0-9:.]*\] (\[rank [01]\] )?\[[a-z]+\] |^final test accuracy: ' "$work/out")"
[ "$(grep -c '^final test accuracy: ' "$work/out")" -eq 1 ] || fail "not one result line (rank 0's)"
grep -q "^final test accuracy: .*(metrics: $work/run/metrics.jsonl)" "$work/out" || fail "the result line is not rank 0's"
echo "one job log: $(grep -c '\[rank 0\]' "$work/out") lines of rank 0, none of rank 1's progress"
