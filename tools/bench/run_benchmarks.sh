#!/usr/bin/env bash
# Runs the benchmark suite on the GPU machine and writes one log per benchmark into OUT; prints the short
# result lines last. Groups (default: all): kernels (bench_kernels + PyTorch), grad (per-layer pipeline
# backward), train (training steps, exact and HLQ, + PyTorch), memory (ViT-B/16 batch 256 peak memory),
# data (loader and JPEG decode). BENCH_PIPELINES (default "exact hlq hlq_split") and BENCH_TORCH_VARIANTS
# (default "fp32 bf16"; ResNets add "bf16 + channels_last") narrow the train and memory groups. hlq_conv (not in
# the default set): HLQ's convolution options on ResNet training steps (conv_gx dgrad / columns, acbp_conv
# input_map; hlq projects the conv columns with the fused im2col kernel) and bench_kernels' hla block. Numbers
# go to docs/BENCHMARKS.md with the date, machine and command.
# Usage: tools/bench/run_benchmarks.sh BUILD_DIR OUT [group...]
set -uo pipefail
build=${1:?usage: run_benchmarks.sh BUILD_DIR OUT [group...]}
out=${2:?usage: run_benchmarks.sh BUILD_DIR OUT [group...]}
shift 2
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(kernels grad train memory data)
mkdir -p "$out"
has() { local g; for g in "${groups[@]}"; do [ "$g" = "$1" ] && return 0; done; return 1; }
run() {  # log-name command...
  local log="$out/$1.txt"
  shift
  echo "\$ $*" >"$log"
  "$@" >>"$log" 2>&1 || echo "(exit $?)" >>"$log"
}
torch_ok=0
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && torch_ok=1

if has kernels; then
  run bench_kernels "$build/tools/bench_kernels"
  [ $torch_ok = 1 ] && run bench_kernels_torch python3 tools/bench/bench_kernels_torch.py
fi
if has grad; then
  run bench_grad "$build/tools/bench_grad" 64
fi
if has train; then
  for m in resnet18 resnet34 vit_s4; do
    for p in ${BENCH_PIPELINES:-exact hlq hlq_split}; do run "bench_train_${m}_${p}" "$build/tools/bench_train" "$m" 256 bf16 "$p"; done
    # Each PyTorch variant in its own process: its times depend on what ran before it in the same process.
    if [ $torch_ok = 1 ]; then
      read -r -a variants <<<"${BENCH_TORCH_VARIANTS:-fp32 bf16}"
      [ "${m#vit}" = "$m" ] && variants+=("bf16 + channels_last")
      for v in "${variants[@]}"; do
        run "bench_train_torch_${m}_${v// /_}" python3 tools/bench/bench_train_torch.py "$m" 256 "$v"
      done
    fi
  done
fi
if has memory; then
  for p in ${BENCH_PIPELINES:-exact hlq hlq_split}; do run "bench_train_vit_b16_${p}" "$build/tools/bench_train" vit_b16 256 bf16 "$p"; done
  [ $torch_ok = 1 ] && run bench_train_torch_vit_b16 python3 tools/bench/bench_train_torch.py vit_b16 256 bf16
fi
if has hlq_conv; then
  run bench_kernels_hla "$build/tools/bench_kernels" --only hla
  for p in exact hlq hlq_cols hlq_map; do run "bench_train_resnet34_${p}" "$build/tools/bench_train" resnet34 256 bf16 "$p"; done
  for p in exact hlq hlq_cols; do run "bench_train_resnet50_${p}" "$build/tools/bench_train" resnet50 128 bf16 "$p"; done
fi
if has data && [ -x "$build/tools/bench_data" ]; then
  run bench_data "$build/tools/bench_data"
fi

echo "== benchmark results (full logs in $out) =="
grep -h -E "^(hadatrain|torch) " "$out"/bench_train*.txt 2>/dev/null
grep -h -E "^layer|exact bf16|  hlq  " "$out/bench_grad.txt" 2>/dev/null  # the header and the exact / hlq rows
exit 0
