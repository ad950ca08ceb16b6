#!/usr/bin/env bash
# A PEFT folder `hadatrain convert --adapter` wrote, pointed at its base (the checkpoint the LoRA run started from),
# through the command line: eval of the folder gives the LoRA checkpoint's validation loss (to the printed digits; the
# C++ test compares the bits), a LoRA run starts from the folder, and that run's checkpoint says so.
# usage: peft_roundtrip.sh HADATRAIN RUNS --config LORA.yaml [--set k=v ...]
set -euo pipefail
exe=$1 runs=$2
shift 2
dir=$runs/peft_on_base
base=$runs/sotu_pretrain_small/checkpoints
rm -rf "$dir" "$runs/from_peft"
cp -r "$runs/lora_adapter" "$dir"
sed -i "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$base\"|" "$dir/adapter_config.json"
grep -q "\"base_model_name_or_path\": \"$base\"" "$dir/adapter_config.json"

loss_of() {
  "$exe" eval "$@" 2>&1 | grep -o "validation loss [0-9.]*, perplexity [0-9.]*"
}
ck=$(loss_of "$@" --set model.init_from="$base" --checkpoint "$runs/moby_dick_finetune_lora/checkpoints")
peft=$(loss_of "$@" --set model.init_from="$base" --checkpoint "$dir")
echo "LoRA checkpoint: $ck"
echo "PEFT folder:     $peft"
[ "$ck" = "$peft" ] || { echo "the PEFT folder evaluates to another loss than its checkpoint"; exit 1; }

"$exe" train "$@" --set model.init_from="$dir" --set checkpoint.every_steps=2 --set run.out_dir="$runs/from_peft" 2>&1 |
  grep "model.init_from: the adapters of"
"$exe" inspect-checkpoint --checkpoint "$runs/from_peft/checkpoints" | grep -A4 "^made from"
echo "ok: the same $peft"
