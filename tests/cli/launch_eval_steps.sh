#!/usr/bin/env bash
# train.eval_every_steps under `hadatrain launch` (2 Gloo ranks, dist.mode ddp) against the same run in one process
# (Note [Step evaluations] in src/train/trainer.cpp, Note [Sharded evaluation] in src/train/distributed.cpp): the
# evaluations come at the same steps; rank 0 alone logs them and writes the checkpoints and `best` (rank 1 logs no
# info line, and the records in its own rank1/metrics.jsonl hold rank 0's figures);
# `best` names the first checkpoint with the highest top-1 among the evaluated ones, as in one process; and each
# recorded evaluation is what `hadatrain eval --checkpoint` of that step's checkpoint gives in one process: the counts
# exactly, the loss within 1e-6 relative (the ranks sum their rows' losses apart and then add the two sums, another
# order of the same additions).
#   launch_eval_steps.sh HADATRAIN WORKDIR TRAIN_ARGS...
set -u
exe=$1 work=$2
shift 2
fail() { echo "FAIL: $*"; for f in "$work"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
args=("$@" --set train.max_steps=8 --set train.eval_every_steps=2 --set checkpoint.every_steps=2
      --set checkpoint.keep_last=0)

"$exe" train "${args[@]}" --set run.out_dir="$work/one" >"$work/one.out" 2>&1 || fail "the run in one process failed"
"$exe" launch --nproc-per-node 2 -- train "${args[@]}" --set run.out_dir="$work/two" --set dist.mode=ddp \
  --set dist.engine=gloo --set dist.timeout_s=30 >"$work/two.out" 2>&1 || fail "the launch failed"

# A metrics record's value: "key": value.
field() { sed -n "s/.*\"$1\": \\([^,}]*\\).*/\\1/p"; }
evals() { grep '"type": "eval"' "$1/metrics.jsonl"; }
steps_one=$(evals "$work/one" | field step | tr '\n' ' ')
steps_two=$(evals "$work/two" | field step | tr '\n' ' ')
[ "$steps_one" = "2 4 6 8 " ] || fail "one process evaluated at steps $steps_one, expected 2 4 6 8"
[ "$steps_two" = "$steps_one" ] || fail "the launch evaluated at steps $steps_two, one process at $steps_one"
# Rank 1 writes no checkpoint or pointer; its own records (rank1/, docs/distributed.md) hold the same figures.
[ "$(find "$work/two" -path '*rank1*' \( -name 'step_*' -o -name best -o -name latest \) | wc -l)" -eq 0 ] ||
  fail "rank 1 wrote checkpoints: $(find "$work/two/rank1")"
[ "$(evals "$work/two/rank1" | field test_correct)" = "$(evals "$work/two" | field test_correct)" ] ||
  fail "rank 1 recorded other evaluations than rank 0"
[ "$(grep -c '\[rank 0\] \[info\] step [0-9]* (epoch' "$work/two.out")" -eq 2 ] ||
  fail "rank 0 did not log the 2 evaluations inside epochs (steps 2 and 6)"
! grep -q '\[rank 1\] \[info\]' "$work/two.out" || fail "rank 1 logged info lines"

# best: the first step with the highest test_acc (every evaluated step has a checkpoint).
best_of() { evals "$1" | awk '{ s = $0; sub(/.*"step": /, "", s); sub(/,.*/, "", s); a = $0;
  sub(/.*"test_acc": /, "", a); sub(/,.*/, "", a); if (n++ == 0 || a + 0 > best + 0) { best = a; step = s } }
  END { print "step_" step }'; }
want=$(best_of "$work/two")
[ "$(cat "$work/two/checkpoints/best")" = "$want" ] ||
  fail "the launch's best is $(cat "$work/two/checkpoints/best"), its evaluations give $want"
[ "$want" != step_8 ] || fail "best is the last checkpoint: the test cannot tell a stale best (change optim.lr)"
[ "$(cat "$work/one/checkpoints/best")" = "$want" ] ||
  fail "one process's best is $(cat "$work/one/checkpoints/best"), the launch's $want"

# Each recorded evaluation is its checkpoint's.
value() { sed -n "s/^  \"$1\": \\(.*[^,]\\),\\{0,1\\}\$/\\1/p" "$2"; }
for step in 2 4 6 8; do
  rec=$(evals "$work/two" | grep "\"step\": $step,")
  "$exe" eval "$@" --checkpoint "$work/two/checkpoints/step_$step" --json "$work/eval$step.json" \
    >"$work/eval$step.out" 2>&1 || fail "eval of step_$step failed"
  for key in correct total; do
    [ "$(echo "$rec" | field "test_$key")" = "$(value "$key" "$work/eval$step.json")" ] ||
      fail "step $step: test_$key $(echo "$rec" | field "test_$key") recorded, $(value "$key" "$work/eval$step.json") by eval"
  done
  awk -v a="$(value loss "$work/eval$step.json")" -v b="$(echo "$rec" | field test_loss)" \
    'BEGIN { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; exit !(a != "" && b != "" && d <= 1e-6 * m) }' ||
    fail "step $step: test_loss $(echo "$rec" | field test_loss) recorded, $(value loss "$work/eval$step.json") by eval"
done
echo "evaluations at steps $steps_two under launch as in one process; best $want; each equals eval --checkpoint"
