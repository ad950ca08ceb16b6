#!/usr/bin/env bash
# Runs the benchmark suite on the GPU machine and writes one log per benchmark into OUT; prints the short
# result lines last. Groups (default: all): kernels (bench_kernels + PyTorch's ops), grad (per-layer pipeline
# backward), train (our training steps against PyTorch's fastest form, tools/bench/peer_compare.py: OUT/steps.jsonl
# and OUT/memory.jsonl), memory (ViT-B/16 batch 256 peak memory of exact, HLQ and both with recompute_output),
# data (loader and JPEG decode). BENCH_PIPELINES (default "exact") lists the pipelines of the train group;
# BENCH_MODELS (MODEL:BATCH,...) narrows its models. hlq_conv (not in the default set): HLQ's convolution options
# on ResNet training steps (the default low-precision conv products against their simulated forms, for
# comparison only; acbp_conv input_map) and bench_kernels' hla block. llama and halo (not in the default set
# either): the 1B LLaMA step per pipeline against our exact step (tools/bench/llama_steps.py: OUT/llama_steps.jsonl,
# pipelines BENCH_LLAMA_PIPELINES, default halo0_fp8 halo1_fp8 halo2_fp8 hlq) and HALO per layer at the 8B and 1B
# shapes (bench_halo: OUT/halo_8b.jsonl, OUT/halo_1b.jsonl), all records for the results page. halo_kernels (not in
# the default set): the HALO-2 fp8 passes alone on the 8B up_proj's operands (bench_halo with HT_BENCH_KERNELS=only:
# OUT/halo_kernels.txt, each rotating quantiser's absmax and quantise passes apart) and, where Nsight Compute is
# installed, the same run under it (clocks and caches untouched; OUT/halo_ncu.csv and, one line per kernel from
# tools/bench/ncu_summary.py, OUT/halo_ncu.txt: instructions, issue use, DRAM bytes).
# Results go to the results page: python3 tools/bench/results_page.py --merge OUT/steps.jsonl OUT/memory.jsonl
# (and OUT/llama_steps.jsonl, OUT/halo_*.jsonl)
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
  if [ $torch_ok = 1 ]; then
    models=()
    [ -n "${BENCH_MODELS:-}" ] && models=(--models "$BENCH_MODELS")
    python3 tools/bench/peer_compare.py "$build" "$out" ${models[@]+"${models[@]}"} --pipelines "$(echo ${BENCH_PIPELINES:-exact} | tr ' ' ,)" \
      >"$out/peer_compare.txt" 2>&1 || echo "(peer_compare: some result is missing; $out/peer_compare.log)" >>"$out/peer_compare.txt"
  else
    echo "train: no CUDA PyTorch here, so no peer: not run" >"$out/peer_compare.txt"
  fi
fi
if has memory; then
  for p in exact exact_rc hlq hlq_rc; do run "bench_train_vit_b16_${p}" "$build/tools/bench_train" vit_b16 256 bf16 "$p"; done
fi
if has hlq_conv; then
  run bench_kernels_hla "$build/tools/bench_kernels" --only hla
  for p in exact hlq hlq_sim hlq_gx_sim hlq_gw_sim hlq_map; do run "bench_train_resnet34_${p}" "$build/tools/bench_train" resnet34 256 bf16 "$p"; done
  for p in exact hlq hlq_sim hlq_gx_sim hlq_gw_sim; do run "bench_train_resnet50_${p}" "$build/tools/bench_train" resnet50 128 bf16 "$p"; done
fi
if has llama; then
  python3 tools/bench/llama_steps.py "$build" "$out/llama_steps.jsonl" ${BENCH_LLAMA_PIPELINES:-halo0_fp8 halo1_fp8 halo2_fp8 hlq} \
    >"$out/llama_steps.txt" 2>&1 || echo "(llama_steps: no records; $out/llama_steps.jsonl.log)" >>"$out/llama_steps.txt"
fi
if has halo; then
  "$build/tools/bench_halo" "" "" llama3_8b >"$out/halo_8b.jsonl" 2>"$out/halo_8b.txt" || echo "(exit $?)" >>"$out/halo_8b.txt"
  "$build/tools/bench_halo" "" "halo2 fp8" llama32_1b >"$out/halo_1b.jsonl" 2>"$out/halo_1b.txt" || echo "(exit $?)" >>"$out/halo_1b.txt"
fi
if has halo_kernels; then
  kernels=("$build/tools/bench_halo" up_proj "halo2 fp8" llama3_8b)
  run halo_kernels env HT_BENCH_KERNELS=only "${kernels[@]}"
  if command -v ncu >/dev/null; then
    HT_BENCH_KERNELS=only ncu --clock-control none --cache-control none --csv --print-units base \
      --metrics "$(python3 tools/bench/ncu_summary.py --metrics)" \
      -k "regex:square|rows|absmax|quantize|transpose|rotate" -c 420 "${kernels[@]}" >"$out/halo_ncu.csv" 2>"$out/halo_ncu.log" &&
      python3 tools/bench/ncu_summary.py "$out/halo_ncu.csv" >"$out/halo_ncu.txt" 2>&1 || echo "(ncu: exit $?; $out/halo_ncu.log)" >>"$out/halo_ncu.txt"
  else
    echo "halo_kernels: no ncu here, so no instruction figures" >"$out/halo_ncu.txt"
  fi
fi
if has data && [ -x "$build/tools/bench_data" ]; then
  run bench_data "$build/tools/bench_data"
fi

echo "== benchmark results (full logs in $out) =="
cat "$out/peer_compare.txt" "$out/llama_steps.txt" "$out/halo_ncu.txt" 2>/dev/null
grep -h '"kernels"' "$out/halo_kernels.txt" 2>/dev/null
grep -h -E "^hadatrain " "$out"/bench_train*.txt 2>/dev/null
grep -h -E "^layer|exact bf16|  hlq  " "$out/bench_grad.txt" 2>/dev/null  # the header and the exact / hlq rows
exit 0
