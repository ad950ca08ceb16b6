#!/usr/bin/env bash
# The multi-GPU runs on the GPUs of one node (docs/distributed.md, Multi-GPU), each run in its own
# process group with its own time limit and log, then a summary table (printed last) and result records.
# Stages (--only picks some; default all, in this order):
#   scaling      the 1.24B LLaMA (preset llama32_1b, random weights) full fine-tuning step, 8 x 2048 tokens per
#                GPU: one process on one GPU (dist.mode none: the reference), then dist.mode fsdp on every GPU
#                (configs/llm/bench/llama32_1b_fsdp.yaml) with each all-gather dtype of --gathers
#                (dist.gather_dtype), and HALO-2 fp8 on every *_proj with the --halo-gather all-gather
#   peer         PyTorch FSDP2 on the same model and batch (tools/bench/fsdp_torch.py under torchrun), per form
#   ddp          the scaling stage's step under dist.mode ddp (every rank holds the whole model and its AdamW
#                state), its gradients all-reduced during the backward (dist.reduce_in_backward true, the default)
#                and after it (false): what the overlap gives, in one build; with the peer stage, beside PyTorch
#                DDP (fsdp_torch.py --wrap ddp) per --peer-forms (graph: DDP's only). Its rows join the scaling
#                stage's (one model and batch per GPU: a ratio is against the fastest PyTorch row, FSDP2 or DDP);
#                the one-process reference runs here when the scaling stage does not
#   8b           the Llama-3-8B-shaped full fine-tuning step, 4 x 2048 tokens per GPU, activation checkpointing
#                (configs/llm/bench/llama3_8b_fsdp.yaml), bf16 all-gather and HALO-2 fp8 + 8-bit all-gather;
#                where the whole model cannot fit (one GPU: 16 bytes of master state per parameter alone is
#                128 GB), a variant with fewer decoder layers runs instead, labelled llama3_8b_L<layers>
#   equivalence  the 1B model's per-step losses on 2 GPUs against 1 GPU with the same global batch (f32 compute,
#                --equiv-tol); with 4 or more GPUs also a checkpoint of a 4-GPU run resumed on 2 GPUs against the
#                uninterrupted run (preset sotu_small). Needs 2 GPUs: skipped with a line at world size 1.
# Throughput, step time and memory come from each run's metrics.jsonl (tools/bench/multi_gpu_records.py says
# how); every run's log is OUT/logs/<run>.log, its metrics OUT/metrics/<run>.metrics.jsonl. Records:
# OUT/all.jsonl (every run, skipped and failed ones too) and OUT/multi_gpu.jsonl (the measured runs):
#   python3 tools/bench/results_page.py --merge OUT/multi_gpu.jsonl
# Usage: tools/bench/multi_gpu.sh [--gpus N] [--out DIR] [--build DIR] [--data DIR] [--work DIR]
#          [--only scaling,peer,ddp,8b,equivalence] [--gathers bf16,int8,fp8] [--halo-gather fp8|int8|none]
#          [--peer-forms eager,compile,graph] [--8b-runs bf16,halo] [--8b-layers L] [--peer-8b] [--reshard true|false]
#          [--timeout S] [--timeout-8b S]
#          [--equiv-tol T] [--cpu-smoke]
#   --gpus      world size (default: every visible GPU); --out (default $OUT, else gpu_out/multi_gpu);
#   --build     the build folder holding tools/hadatrain (default build-gpu);
#   --data      a folder with sotu/ and llama2/tokenizer.model (tools/fetch_lm_data.sh's; default
#               ${HADATRAIN_CACHE:-~/.cache/hadatrain}/lm): the text only feeds token ids, the weights are random;
#   --work      run folders and the token cache (default runs/multi_gpu);
#   --8b-layers decoder layers of the 8b stage's model (default: all 32 where they fit, else the most of
#               16, 8, 4 that fit); fewer layers build faster on the host;
#   --reshard   dist.reshard_after_forward of our runs (default true: gathered again in backward, FSDP2's
#               default); the peer runs with what our runs used (a build without the key keeps gathered weights
#               to the end of the step, so the peer gets --no-reshard-after-forward);
#   --timeout   seconds per run (default 300), --timeout-8b for the 8b stage's runs (default 540): every run
#               builds its model on the host first (about a minute for the 1B model, several for the 8B);
#   --cpu-smoke the same stages on the CPU through Gloo with the tiny preset on tests/fixtures/lm_text (default
#               2 ranks), to try the script without a GPU; its numbers mean nothing.
# Exit code: 0 when no run failed, timed out or ran out of memory and every equivalence held (skipped runs and
# settings the build refuses are reported, not failures), 1 otherwise, 2 on a usage or setup error.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off on the lent machines

die() { echo "multi_gpu: $*" >&2; exit 2; }
args_text="tools/bench/multi_gpu.sh $*"
gpus="" out="${OUT:-gpu_out/multi_gpu}" build=build-gpu data="" work=runs/multi_gpu
only=scaling,peer,ddp,8b,equivalence gathers=bf16,int8,fp8 halo_gather=fp8 peer_forms=eager,compile,graph
peer_8b=0 layers_8b="" reshard=true timeout_s=300 timeout_8b=540 equiv_tol=1e-4 smoke=0 runs_8b=bf16,halo
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus=${2:?--gpus needs a number}; shift ;;
    --out) out=${2:?}; shift ;;
    --build) build=${2:?}; shift ;;
    --data) data=${2:?}; shift ;;
    --work) work=${2:?}; shift ;;
    --only) only=${2:?}; shift ;;
    --gathers) gathers=${2:?}; shift ;;
    --halo-gather) halo_gather=${2:?}; shift ;;
    --peer-forms) peer_forms=${2:?}; shift ;;
    --peer-8b) peer_8b=1 ;;
    --reshard) reshard=${2:?}; shift ;;
    --timeout) timeout_s=${2:?}; shift ;;
    --timeout-8b) timeout_8b=${2:?}; shift ;;
    --8b-runs) runs_8b=${2:?}; shift ;;
    --8b-layers) layers_8b=${2:?}; shift ;;
    --equiv-tol) equiv_tol=${2:?}; shift ;;
    --cpu-smoke) smoke=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (--help lists them)" ;;
  esac
  shift
done
for s in ${only//,/ }; do
  case "$s" in scaling|peer|ddp|8b|equivalence) ;; *) die "--only: unknown stage '$s' (scaling, peer, ddp, 8b, equivalence)" ;; esac
done
has() { [[ ",$only," == *",$1,"* ]]; }
[[ "$reshard" =~ ^(true|false)$ ]] || die "--reshard: expected true or false, got '$reshard'"
[[ "$timeout_s$timeout_8b" =~ ^[0-9]+$ ]] || die "--timeout, --timeout-8b: expected seconds"
[[ "$layers_8b" =~ ^([1-9]|[12][0-9]|3[0-2])?$ ]] || die "--8b-layers: expected 1 to 32, got '$layers_8b'"

hadatrain=$build/tools/hadatrain
[ -x "$hadatrain" ] || die "$hadatrain not found: build it first (cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build $build --target hadatrain)"

if [ "$smoke" = 1 ]; then
  gpus=${gpus:-2}
  seq=16 b1=4 b8=2 beq=2 gpu_gib=139
  common=(--set "data.paths=[tests/fixtures/lm_text]" --set data.tokenizer=tests/fixtures/lm_char.model
          --set data.val_fraction=0.25 --set "data.seq_len=$seq" --set data.eval_batch_size=4
          --set model.preset=tiny --set model.llama.vocab_size=0 --set train.device=cpu --set train.precision=fp32
          --set dist.engine=gloo --set dist.timeout_s=60)
  small_preset=tiny small_seq=$seq torch_model=tiny torch_extra=(--device cpu)
else
  if [ -z "$gpus" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
      IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
      gpus=${#visible[@]}
    else
      gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    fi
  fi
  [ "${gpus:-0}" -ge 1 ] 2>/dev/null || die "no GPU visible (nvidia-smi -L lists none); --cpu-smoke runs on the CPU"
  gpu_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | awk '{printf "%d", $1 / 1024}')
  [ -n "$gpu_gib" ] || die "nvidia-smi gives no memory size"
  data=${data:-${HADATRAIN_CACHE:-$HOME/.cache/hadatrain}/lm}
  { [ -d "$data/sotu" ] && [ -f "$data/llama2/tokenizer.model" ]; } ||
    die "$data lacks sotu/ or llama2/tokenizer.model: run tools/fetch_lm_data.sh, or copy ~/.cache/hadatrain/lm/{sotu,llama2} into a folder and pass --data"
  seq=2048 b1=8 b8=4 beq=2  # beq: rows per GPU of the equivalence runs (f32 compute: half the 1B runs' batch)
  common=(--set "data.paths=[$data/sotu]" --set "data.tokenizer=$data/llama2/tokenizer.model")
  small_preset=sotu_small small_seq=512 torch_model=llama32_1b torch_extra=()  # small_seq: sotu_small's positions
fi
{ [[ "$gpus" =~ ^[0-9]+$ ]] && [ "$gpus" -ge 1 ]; } || die "--gpus: expected a positive number, got '$gpus'"
common+=(--set "data.cache_dir=$work/tokens")
mkdir -p "$out/logs" "$out/metrics" "$work" || die "cannot create $out or $work"
: >"$out/all.jsonl"
t_start=$(date +%s)
echo "multi_gpu: $gpus $([ "$smoke" = 1 ] && echo "CPU rank(s) (Gloo, --cpu-smoke)" || echo "GPU(s), ${gpu_gib} GiB each"); stages $only; logs in $out/logs"

records() {
  python3 tools/bench/multi_gpu_records.py "$@" || { echo "multi_gpu: multi_gpu_records.py $1 failed" >&2; rc_all=1; }
}
rc_all=0

# run_train NAME NPROC LIMIT_S CONFIG [--set ...]: one hadatrain launch under `timeout`; sets $rc.
run_train() {
  local name=$1 nproc=$2 limit=$3 config=$4
  shift 4
  local dir=$work/$name log=$out/logs/$name.log t0
  rm -rf "$dir"
  local cmd=("$hadatrain" launch --nproc-per-node "$nproc" -- train --config "$config" "${common[@]}"
             --set "run.out_dir=$dir" "$@")
  # dist.reshard_after_forward is fsdp's: a run of another dist.mode takes it out again (an fsdp-only key at another
  # value than its default is an error under ddp or none).
  case " $* " in *" dist.mode=ddp "* | *" dist.mode=none "*) cmd+=(--set dist.reshard_after_forward=null) ;; esac
  printf '$ %s\n' "${cmd[*]}" >"$log"
  t0=$(date +%s)
  timeout -k 30 "$limit" "${cmd[@]}" >>"$log" 2>&1
  rc=$?
  echo "(exit $rc after $(($(date +%s) - t0)) s)" >>"$log"
  [ -f "$dir/metrics.jsonl" ] && cp "$dir/metrics.jsonl" "$out/metrics/$name.metrics.jsonl"
  printf '  %-34s exit %3d  %4d s\n' "$name" "$rc" "$(($(date +%s) - t0))"
}

# ours NAME STAGE MODEL NPROC GATHER PIPELINE BATCH_PER_GPU WARMUP LIMIT CONFIG [--set ...]: run_train, then its
# record; run_mode (fsdp unless set for the call: none, ddp, ddp-after) labels how the run is distributed.
ours() {
  local name=$1 stage=$2 model=$3 nproc=$4 gather=$5 pipeline=$6 bpg=$7 warm=$8 limit=$9 config=${10}
  shift 10
  run_train "$name" "$nproc" "$limit" "$config" --set "data.batch_size=$((bpg * nproc))" "$@"
  records ours --name "$name" --stage "$stage" --model "$model" --gpus "$nproc" --impl hadatrain --gather "$gather" \
    --mode "${run_mode:-fsdp}" --pipeline "$pipeline" --batch-per-gpu "$bpg" --seq "$seq" --command "$args_text" --run-dir "$work/$name" \
    --log "$out/logs/$name.log" --rc "$rc" --refused gather_dtype --warmup-steps "$warm"
}

# gathered NAME STAGE MODEL NPROC GATHER PIPELINE ...: ours with --set dist.gather_dtype=GATHER. When the build
# refuses it (no such key or value), a bf16 all-gather or a pipeline other than exact runs again without the key,
# under the build's own all-gather dtype (f32 shards), named and labelled f32.
gathered() {
  local name=$1 stage=$2 model=$3 nproc=$4 gather=$5
  shift 5
  local rest=("$@")
  ours "$name" "$stage" "$model" "$nproc" "$gather" "${rest[@]:0:5}" "${rest[@]:5}" --set "dist.gather_dtype=$gather"
  if [ "$rc" -ne 0 ] && { [ "$gather" = bf16 ] || [ "${rest[0]}" != exact ]; } &&
     grep -q "gather_dtype.*\(unknown key\|expected\)" "$out/logs/$name.log"; then
    echo "  $name: this build refuses dist.gather_dtype=$gather; running with its default all-gather (f32) instead"
    ours "${name/_${gather}_/_f32_}" "$stage" "$model" "$nproc" f32 "${rest[@]:0:5}" "${rest[@]:5}"
  fi
}

halo=(--set 'grad_pipeline.layers.*_proj.name=halo' --set 'grad_pipeline.layers.*_proj.level=2'
      --set 'grad_pipeline.layers.*_proj.carrier=fp8')
cfg1=configs/llm/bench/llama32_1b_fsdp.yaml cfg8=configs/llm/bench/llama3_8b_fsdp.yaml

# knows KEY=VALUE: whether this build's config reader takes the setting (it reads the whole config before
# anything else; the probe stops at its missing text).
knows() {
  local said
  said=$("$hadatrain" train --config "$cfg1" --set "$1" --set train.device=cpu --set "data.paths=[$work/no-such-text]" \
    --set "run.out_dir=$work/probe" 2>&1)
  ! grep -q "${1%%=*}: \(unknown key\|expected\)" <<<"$said"
}
if knows "dist.reshard_after_forward=$reshard"; then
  common+=(--set "dist.reshard_after_forward=$reshard")
else
  echo "multi_gpu: this build has no dist.reshard_after_forward: its FSDP keeps the gathered weights to the end of the step, and so does the peer"
  reshard=false
fi
[ "$reshard" = false ] && torch_extra+=(--no-reshard-after-forward)

# Tokenise the text once, in one CPU process with the tiny preset, so the ranks of the runs below find the
# token cache instead of each tokenising it.
run_train prepare_tokens 1 "$timeout_s" "$cfg1" --set dist.mode=none --set model.preset=tiny \
  --set model.llama.vocab_size=0 --set train.device=cpu --set train.precision=fp32 --set train.max_steps=1 \
  --set data.seq_len=16 --set data.batch_size=1
[ "$rc" -eq 0 ] || die "tokenising the text failed: $out/logs/prepare_tokens.log: $(tail -3 "$out/logs/prepare_tokens.log")"

if has scaling; then
  echo "== scaling: llama32_1b, $b1 x $seq tokens per GPU, $gpus GPU(s)"
  # The reference of tokens/s per GPU: one process on one GPU, nothing sharded (dist.mode none).
  run_mode=none ours "scaling_1b_single_call_x$gpus" scaling llama32_1b 1 none exact "$b1" 5 "$timeout_s" "$cfg1" \
    --set dist.mode=none
  for g in ${gathers//,/ }; do
    gathered "scaling_1b_${g}_x$gpus" scaling llama32_1b "$gpus" "$g" exact "$b1" 5 "$timeout_s" "$cfg1"
  done
  if [ "$halo_gather" != none ]; then
    gathered "scaling_1b_halo2fp8_${halo_gather}_x$gpus" scaling llama32_1b "$gpus" "$halo_gather" halo2_fp8 "$b1" 5 \
      "$timeout_s" "$cfg1" "${halo[@]}"
  fi
fi

# peer_1b WRAP GATHER: PyTorch's 1B step under WRAP (fsdp2 or ddp) in each of --peer-forms, with its records.
peer_1b() {
  local wrap=$1 gather=$2 f name tag
  tag=$([ "$wrap" = ddp ] && echo ddp_ || echo "")
  if ! python3 -c "import torch, transformers" 2>/dev/null; then
    for f in ${peer_forms//,/ }; do
      records skip --name "peer_1b_torch_${tag}${f}_x$gpus" --stage scaling --model llama32_1b --gpus "$gpus" \
        --impl "torch $wrap $f" --gather "$gather" --mode "$wrap" --pipeline exact --batch-per-gpu "$b1" --seq "$seq" \
        --command "$args_text" --why "torch or transformers not importable by python3" --out "$out"
    done
    echo "  skipped: torch or transformers not importable by python3"
    return
  fi
  for f in ${peer_forms//,/ }; do
    name=peer_1b_torch_${tag}${f}_x$gpus
    if [ "$f" = graph ] && { [ "$wrap" != ddp ] || [ "$smoke" = 1 ]; }; then  # fsdp_torch.py says why
      records skip --name "$name" --stage scaling --model llama32_1b --gpus "$gpus" --impl "torch $wrap $f" \
        --gather "$gather" --mode "$wrap" --pipeline exact --batch-per-gpu "$b1" --seq "$seq" --command "$args_text" \
        --why "the whole-step CUDA graph form is DDP's on CUDA only (FSDP2's collectives are not captured)" --out "$out"
      continue
    fi
    rm -f "$out/logs/$name.json"
    cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" tools/bench/fsdp_torch.py
         "$torch_model" "$b1" "$seq" --form "$f" --wrap "$wrap" --jsonl "$out/logs/$name.json" "${torch_extra[@]}")
    printf '$ %s\n' "${cmd[*]}" >"$out/logs/$name.log"
    t0=$(date +%s)
    timeout -k 30 "$timeout_s" "${cmd[@]}" >>"$out/logs/$name.log" 2>&1
    rc=$?
    printf '  %-34s exit %3d  %4d s\n' "$name" "$rc" "$(($(date +%s) - t0))"
    records torch --name "$name" --stage scaling --model llama32_1b --gpus "$gpus" --impl "torch $wrap $f" \
      --gather "$gather" --mode "$wrap" --pipeline exact --batch-per-gpu "$b1" --seq "$seq" --command "$args_text" \
      --jsonl "$out/logs/$name.json" --log "$out/logs/$name.log" --rc "$rc"
  done
}

if has peer; then
  echo "== peer: PyTorch FSDP2, llama32_1b, $b1 x $seq tokens per GPU, $gpus GPU(s)"
  peer_1b fsdp2 bf16
fi

if has ddp; then
  echo "== ddp: llama32_1b replicated, $b1 x $seq tokens per GPU, $gpus GPU(s), the all-reduce during and after the backward"
  has scaling || run_mode=none ours "scaling_1b_single_call_x$gpus" scaling llama32_1b 1 none exact "$b1" 5 \
    "$timeout_s" "$cfg1" --set dist.mode=none
  if knows dist.reduce_in_backward=true; then
    run_mode=ddp ours "ddp_1b_in_backward_x$gpus" scaling llama32_1b "$gpus" - exact "$b1" 5 "$timeout_s" "$cfg1" \
      --set dist.mode=ddp --set dist.reduce_in_backward=true
    run_mode=ddp-after ours "ddp_1b_after_backward_x$gpus" scaling llama32_1b "$gpus" - exact "$b1" 5 "$timeout_s" \
      "$cfg1" --set dist.mode=ddp --set dist.reduce_in_backward=false
  else
    echo "  this build has no dist.reduce_in_backward: its ddp all-reduces after the backward"
    run_mode=ddp-after ours "ddp_1b_after_backward_x$gpus" scaling llama32_1b "$gpus" - exact "$b1" 5 "$timeout_s" \
      "$cfg1" --set dist.mode=ddp
  fi
  if has peer; then
    echo "== ddp peer: PyTorch DDP, llama32_1b, $b1 x $seq tokens per GPU, $gpus GPU(s)"
    peer_1b ddp -
  fi
fi

if has 8b; then
  # Memory per GPU with L decoder layers on N ranks: 16 bytes of f32 master weights, gradients and AdamW moments
  # per parameter over N, the whole model gathered in f32 during the step (reshard_after_forward is off), and
  # about 20 GiB of activations, logits (4 x 2048 x 128256, f32 for the loss) and workspace at 4 x 2048 with
  # activation checkpointing. P(L) = 1.05e9 (embedding, head, final norm) + 218.1e6 per decoder layer.
  need_gib() { awk -v l="$1" -v n="$2" 'BEGIN { p = 1050681344 + l * 218112000; printf "%d", (16 * p / n + 4 * p) / 2^30 + 20 }'; }
  layers=32
  while [ "$layers" -gt 2 ] && [ "$(need_gib "$layers" "$gpus")" -gt $((gpu_gib * 9 / 10)) ]; do layers=$((layers / 2)); done
  if [ -n "$layers_8b" ]; then
    [ "$(need_gib "$layers_8b" "$gpus")" -gt $((gpu_gib * 9 / 10)) ] &&
      echo "multi_gpu: --8b-layers $layers_8b needs about $(need_gib "$layers_8b" "$gpus") GiB per GPU (${gpu_gib} GiB each): it may not fit"
    layers=$layers_8b
  fi
  model8=llama3_8b tag8=8b
  extra8=()
  if [ "$layers" -ne 32 ]; then
    model8=llama3_8b_L$layers tag8=8b_L$layers
    extra8=(--set "model.llama.num_hidden_layers=$layers")
    echo "== 8b: the whole Llama-3-8B shape needs about $(need_gib 32 "$gpus") GiB per GPU on $gpus GPU(s) (${gpu_gib} GiB each)$([ -n "$layers_8b" ] && echo " (--8b-layers $layers_8b)"); running $model8 (the same shape with $layers of its 32 decoder layers, about $(need_gib "$layers" "$gpus") GiB) instead"
  else
    echo "== 8b: llama3_8b, $b8 x $seq tokens per GPU, $gpus GPU(s) (about $(need_gib 32 "$gpus") GiB per GPU)"
  fi
  lim8=$timeout_8b
  [[ ",$runs_8b," == *",bf16,"* ]] &&
    gathered "${tag8}_bf16_x$gpus" 8b "$model8" "$gpus" bf16 exact "$b8" 4 "$lim8" "$cfg8" "${extra8[@]}"
  if [ "$halo_gather" != none ] && [[ ",$runs_8b," == *",halo,"* ]]; then
    gathered "${tag8}_halo2fp8_${halo_gather}_x$gpus" 8b "$model8" "$gpus" "$halo_gather" halo2_fp8 "$b8" 4 \
      "$lim8" "$cfg8" "${extra8[@]}" "${halo[@]}"
  fi
  if [ "$peer_8b" = 1 ] && python3 -c "import torch, transformers" 2>/dev/null; then
    name=peer_8b_torch_eager_x$gpus
    tm=llama3_8b
    [ "$smoke" = 1 ] && tm=tiny
    cmd=(python3 -m torch.distributed.run --standalone --nproc-per-node "$gpus" tools/bench/fsdp_torch.py "$tm" "$b8"
         "$seq" --form eager --layers "$((layers == 32 ? 0 : layers))" --checkpointing --jsonl "$out/logs/$name.json" "${torch_extra[@]}")
    printf '$ %s\n' "${cmd[*]}" >"$out/logs/$name.log"
    timeout -k 30 "$lim8" "${cmd[@]}" >>"$out/logs/$name.log" 2>&1
    rc=$?
    printf '  %-34s exit %3d\n' "$name" "$rc"
    records torch --name "$name" --stage 8b --model "$model8" --gpus "$gpus" --impl "torch fsdp2 eager" --gather bf16 \
      --pipeline exact --batch-per-gpu "$b8" --seq "$seq" --command "$args_text" --jsonl "$out/logs/$name.json" \
      --log "$out/logs/$name.log" --rc "$rc"
  fi
fi

if has equivalence; then
  if [ "$gpus" -lt 2 ]; then
    echo "== equivalence: skipped, it compares 2 GPUs with 1 and this machine has $gpus"
    records skip --name equiv_1b_x2_vs_x1 --stage equivalence --model llama32_1b --gpus "$gpus" --impl hadatrain \
      --gather default --pipeline exact --batch-per-gpu "$beq" --seq "$seq" --command "$args_text" \
      --why "needs 2 GPUs, this machine has $gpus" --out "$out"
  else
    echo "== equivalence: llama32_1b, global batch $((2 * beq)) x $seq, f32 compute, 2 GPUs against 1 (tolerance $equiv_tol)"
    eq=(--set train.precision=fp32 --set train.tf32=false --set train.max_steps=6 --set train.log_every=1)
    run_train equiv_1b_x1 1 "$timeout_s" "$cfg1" --set "data.batch_size=$((2 * beq))" "${eq[@]}"
    rc1=$rc
    run_train equiv_1b_x2 2 "$timeout_s" "$cfg1" --set "data.batch_size=$((2 * beq))" "${eq[@]}"
    meta=(--stage equivalence --model llama32_1b --gpus 2 --impl hadatrain --gather default --pipeline exact
          --batch-per-gpu "$beq" --seq "$seq" --command "$args_text" --out "$out")
    if [ "$rc1" -ne 0 ] || [ "$rc" -ne 0 ]; then
      records skip --name equiv_1b_x2_vs_x1 "${meta[@]}" \
        --why "a run failed (exit $rc1 on 1 GPU, $rc on 2): $out/logs/equiv_1b_x1.log, equiv_1b_x2.log"
      rc_all=1
    else
      records equiv --name equiv_1b_x2_vs_x1 "${meta[@]}" --tol "$equiv_tol" --a "$work/equiv_1b_x1" \
        --b "$work/equiv_1b_x2"
    fi
    if [ "$gpus" -ge 4 ]; then
      echo "== equivalence: a checkpoint of a 4-GPU run ($small_preset) resumed on 2 GPUs"
      rs=(--set "model.preset=$small_preset" --set "data.seq_len=$small_seq" --set train.precision=fp32
          --set train.tf32=false --set train.max_steps=6 --set train.log_every=1 --set "data.batch_size=$((2 * beq))")
      run_train resume_x4 4 "$timeout_s" "$cfg1" "${rs[@]}" --set checkpoint.every_steps=3
      rc4=$rc
      run_train resume_x2 2 "$timeout_s" "$cfg1" "${rs[@]}" --resume "$work/resume_x4/checkpoints/step_3"
      meta[3]=$small_preset meta[15]=$small_seq  # the model and --seq of the records below
      if [ "$rc4" -ne 0 ] || [ "$rc" -ne 0 ]; then
        records skip --name resume_x4_to_x2 "${meta[@]}" \
          --why "a run failed (exit $rc4 on 4 GPUs, $rc on 2): $out/logs/resume_x4.log, resume_x2.log"
        rc_all=1
      else
        records equiv --name resume_x4_to_x2 "${meta[@]}" --tol "$equiv_tol" --a "$work/resume_x4" \
          --b "$work/resume_x2" --from-step 4 --note "the 4-GPU run's checkpoint at step 3 resumed on 2 GPUs"
      fi
    fi
  fi
fi

finish=(--out "$out")
[ "$smoke" = 1 ] && finish+=(--smoke)
records finish "${finish[@]}"
echo "multi_gpu: $(($(date +%s) - t_start)) s in all"
grep -v '"status": "\(ok\|skipped\|refused by this build\)"' "$out/all.jsonl" | grep -q . && rc_all=1
grep -q '"status": "ok"' "$out/all.jsonl" || { echo "multi_gpu: no run measured"; rc_all=1; }
exit "$rc_all"
