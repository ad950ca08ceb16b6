#!/usr/bin/env bash
# SIGTERM during `hadatrain train`, then `--resume`: the stopped run must exit 143 after writing a checkpoint
# of its last step (no temporaries left) and saying how to continue; the resumed run must log every step
# once and end with the same per-step losses, epoch train losses, test metrics and final accuracy as an
# uninterrupted run.
#   sigterm_resume.sh HADATRAIN CONFIG WORKDIR [LAUNCH...]
# With LAUNCH (e.g. `launch --nproc-per-node 2 -- --set dist.mode=ddp --set dist.engine=gloo`: the words up to `--`
# go before `train`, the rest after its options) every run is launched on several ranks and the SIGTERM goes to the
# launcher, which forwards it to every rank: all ranks must stop after the same step (Note [Agreeing on a stop] in
# src/train/distributed.cpp) and say so.
set -u
exe=$1 config=$2 work=$3
shift 3
launch=() extra=()
if [ $# -gt 0 ]; then
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do launch+=("$1"); shift; done
  launch+=("--")
  [ $# -gt 0 ] && shift
  extra=("$@")
fi
fail() { echo "FAIL: $*"; for f in "$work"/*.out; do echo "--- $f"; tail -n 20 "$f"; done; exit 1; }

rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
# 200 steps per epoch, 2 epochs; a checkpoint at each epoch's end, so the stop's checkpoint is its own.
common=(--config "$config" --set data.train_limit=12800 --set data.test_limit=1000 --set train.epochs=2
        --set train.log_every=1 --set checkpoint.every_epochs=1 --set checkpoint.keep_last=0 "${extra[@]}")
if [ ${#launch[@]} -gt 0 ]; then cmd=("$exe" "${launch[@]}" train); else cmd=("$exe" train); fi

"${cmd[@]}" "${common[@]}" --set run.out_dir="$work/whole" >"$work/whole.out" 2>&1 || fail "the uninterrupted run failed"

"${cmd[@]}" "${common[@]}" --set run.out_dir="$work/part" >"$work/part.out" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do  # up to 60 s for step 20 to be logged
  grep -q '"step": 20,' "$work/part/metrics.jsonl" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
kill -TERM "$pid" 2>/dev/null || fail "the run ended before it could be stopped"
wait "$pid"
rc=$?
[ "$rc" -eq 143 ] || fail "expected exit code 143 after SIGTERM, got $rc"
lines=$(grep -E '^stopped by SIGTERM after step [0-9]+; checkpoint written: ' "$work/part.out") ||
  fail "no 'stopped by SIGTERM after step N; checkpoint written: DIR' line"
grep -q -- '--resume' "$work/part.out" || fail "the stop message does not say how to resume"
steps=$(sed -E 's/^stopped by SIGTERM after step ([0-9]+);.*/\1/' <<<"$lines" | sort -u)
ranks=$(( ${#launch[@]} > 0 ? $(grep -c '' <<<"$lines") : 1 ))
[ "$(grep -c '' <<<"$steps")" -eq 1 ] || fail "the ranks stopped after different steps: $steps"
if [ ${#launch[@]} -gt 0 ]; then
  n=$(grep -o -- '--nproc-per-node [0-9]*' <<<"${launch[*]}" | grep -o '[0-9]*$')
  [ "$ranks" -eq "$n" ] || fail "$ranks of $n ranks said they stopped"
  ! grep -q 'launch: rank [0-9]* exited with code' "$work/part.out" || fail "the launcher took the stop for a failure"
fi
step=$steps
[ "$step" -ge 20 ] && [ "$step" -lt 400 ] || fail "stopped at step $step, expected one in [20, 400)"
[ -f "$work/part/checkpoints/step_$step/state.json" ] || fail "no checkpoint step_$step"
[ "$(head -n 1 "$work/part/checkpoints/latest")" = "step_$step" ] || fail "latest does not point at step_$step"
leftovers=$(find "$work/part" -name '*.tmp*')
[ -z "$leftovers" ] || fail "temporaries left: $leftovers"
echo "stopped at step $step with exit code 143"

"${cmd[@]}" "${common[@]}" --set run.out_dir="$work/part" --resume >"$work/resume.out" 2>&1 || fail "the resumed run failed"
grep -q "resumed from .*step_$step at step $step" "$work/resume.out" || fail "the resume did not start from step_$step"

# Per-step losses and learning rates (timing fields dropped), each step once; the train_loss and test metrics
# of each evaluation (the checkpoint keeps the loss sum of the epoch the stop split).
train_records() { grep '"type": "train"' "$1" | sed -E 's/("lr": [^,]*),.*/\1/'; }
eval_records() { grep '"type": "eval"' "$1" | sed -E 's/, "epoch_seconds".*//'; }
diff <(train_records "$work/whole/metrics.jsonl") <(train_records "$work/part/metrics.jsonl") >"$work/train.diff" ||
  fail "per-step train records differ from the uninterrupted run: $(head -n 6 "$work/train.diff")"
diff <(eval_records "$work/whole/metrics.jsonl") <(eval_records "$work/part/metrics.jsonl") >"$work/eval.diff" ||
  fail "test metrics differ from the uninterrupted run: $(cat "$work/eval.diff")"
final() { grep -o 'final test accuracy: [^(]*([^)]*) after [0-9]* steps' "$1"; }
[ -n "$(final "$work/whole.out")" ] && [ "$(final "$work/whole.out")" = "$(final "$work/resume.out")" ] ||
  fail "final accuracy differs: '$(final "$work/whole.out")' vs '$(final "$work/resume.out")'"
echo "resumed run matches the uninterrupted one: $(final "$work/resume.out")"
