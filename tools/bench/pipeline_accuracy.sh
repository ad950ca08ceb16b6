#!/usr/bin/env bash
# Accuracy of the gradient pipelines on real data: trains configs/fashion_mnist_resnet18{,_hlq,_lbp_wht,_luq}.yaml
# (same recipe and seed; every Linear and Conv2d through the named pipeline) concurrently on one GPU, then
# prints each run's final test accuracy and mean epoch time and draws the curves with tools/plot_metrics.py.
# Usage: tools/bench/pipeline_accuracy.sh BUILD_DIR OUT [extra --set arguments for every run]
set -uo pipefail
build=${1:?usage: pipeline_accuracy.sh BUILD_DIR OUT [--set k=v ...]}
out=${2:?usage: pipeline_accuracy.sh BUILD_DIR OUT [--set k=v ...]}
shift 2
mkdir -p "$out"
pids=()
for p in "" _hlq _lbp_wht _luq; do
  name=fashion_mnist_resnet18$p
  "$build/tools/hadatrain" train --config "configs/$name.yaml" --set run.out_dir="$out/$name" \
    --set checkpoint.every_epochs=0 "$@" >"$out/$name.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
printf "%-32s %10s %14s\n" run "test top-1" "s per epoch"
for p in "" _hlq _lbp_wht _luq; do
  name=fashion_mnist_resnet18$p
  acc=$(grep -oE "final test accuracy: [0-9.]+%" "$out/$name.log" | grep -oE "[0-9.]+%")
  ept=$(python3 - "$out/$name/metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
    t = [r["epoch_seconds"] for r in rows if "epoch_seconds" in r]
    print(f"{sum(t) / len(t):.1f}" if t else "?")
except Exception:
    print("?")
PY
)
  printf "%-32s %10s %14s\n" "$name" "${acc:-failed}" "$ept"
done
# Through the script's own interpreter line (Debian's python3 with python3-matplotlib), not whichever python3 is
# first on PATH; a failure to draw is reported, not hidden.
if "$(dirname "$0")/../plot_metrics.py" --out "$out/pipelines.png" --label exact --label hlq --label lbp_wht \
    --label luq "$out"/fashion_mnist_resnet18{,_hlq,_lbp_wht,_luq}/metrics.jsonl >/dev/null; then
  echo "curves: $out/pipelines.png"
else
  echo "curves: not drawn (tools/plot_metrics.py failed, above)" >&2
  rc=1
fi
exit $rc
