#!/usr/bin/env bash
# `hadatrain eval` under `hadatrain launch` (Note [Sharded evaluation] in src/train/distributed.cpp): the ranks share
# one evaluation and rank 0 alone reports it, so the launch prints one result line (saying how many ranks shared
# it) and writes one --json file, whose figures are those of the same evaluation in one process (the counts
# exactly, the loss within 1e-6 relative).
#   launch_eval.sh HADATRAIN WORKDIR EVAL_ARGS...
set -u
exe=$1 work=$2
shift 2
fail() { echo "FAIL: $*"; for f in "$work"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"

"$exe" eval "$@" --json "$work/one.json" >"$work/one.out" 2>&1 || fail "eval in one process failed"
"$exe" launch --nproc-per-node 2 -- eval "$@" --set dist.engine=gloo --set dist.timeout_s=30 --json "$work/two.json" \
  >"$work/two.out" 2>&1 || fail "eval under launch failed"

result='[0-9]+ samples(, evaluated by [0-9]+ ranks)?\)$'  # the result line, not the log's "(... test samples, ...)"
results=$(grep -cE "$result" "$work/two.out")
[ "$results" -eq 1 ] || fail "the launch printed $results result lines, expected 1 (rank 0's)"
grep -q "(100 samples, evaluated by 2 ranks)" "$work/two.out" || fail "the result line does not say the 2 ranks shared it"
grep -q "evaluating this rank's rows" "$work/two.out" || fail "the ranks did not join"
value() { sed -n "s/^  \"$1\": \\(.*[^,]\\),\\{0,1\\}\$/\\1/p" "$2"; }
for key in checkpoint step weights total correct acc top5; do
  [ "$(value "$key" "$work/one.json")" = "$(value "$key" "$work/two.json")" ] ||
    fail "$key: $(value "$key" "$work/two.json") under launch, $(value "$key" "$work/one.json") in one process"
done
awk -v a="$(value loss "$work/one.json")" -v b="$(value loss "$work/two.json")" \
  'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(a != "" && d <= 1e-6 * m) }' ||
  fail "loss $(value loss "$work/two.json") under launch, $(value loss "$work/one.json") in one process"
echo "one evaluation over 2 ranks: $(grep -E "$result" "$work/two.out")"
