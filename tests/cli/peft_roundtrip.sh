#!/usr/bin/env bash
# A PEFT folder `hadatrain convert --adapter` wrote, pointed at its base (the checkpoint the LoRA run started from, or
# its HF conversion), through the command line: eval of the folder gives the LoRA checkpoint's validation loss (to the
# printed digits; the C++ test compares the bits), generate from it the checkpoint's text, convert merges it into an HF
# folder equal to the checkpoint's merged conversion byte for byte (fp32) whose record names the adapter folder and its
# base, an output folder holding the other kind of model is refused, a LoRA run starts from the folder, and that run's
# checkpoint says so.
# usage: peft_roundtrip.sh HADATRAIN RUNS --config LORA.yaml [--set k=v ...]
set -euo pipefail
exe=$1 runs=$2
shift 2
lora=$runs/moby_dick_finetune_lora/checkpoints
# peft_folder NAME BASE: the adapter folder at $runs/NAME with base_model_name_or_path BASE.
peft_folder() {
  rm -rf "${runs:?}/$1"
  cp -r "$runs/lora_adapter" "$runs/$1"
  sed -i "s|\"base_model_name_or_path\": null|\"base_model_name_or_path\": \"$2\"|" "$runs/$1/adapter_config.json"
  grep -q "\"base_model_name_or_path\": \"$2\"" "$runs/$1/adapter_config.json"
}
dir=$runs/peft_on_base
base=$runs/sotu_pretrain_small/checkpoints
rm -rf "$runs/from_peft" "$runs/peft_merged" "$runs/peft_merged_hf" "$runs/lora_merged_fp32"
peft_folder peft_on_base "$base"
peft_folder peft_on_hf "$runs/hf_sotu"

loss_of() {
  "$exe" eval "$@" 2>&1 | grep -o "validation loss [0-9.]*, perplexity [0-9.]*"
}
ck=$(loss_of "$@" --set model.init_from="$base" --checkpoint "$runs/moby_dick_finetune_lora/checkpoints")
peft=$(loss_of "$@" --set model.init_from="$base" --checkpoint "$dir")
echo "LoRA checkpoint: $ck"
echo "PEFT folder:     $peft"
[ "$ck" = "$peft" ] || { echo "the PEFT folder evaluates to another loss than its checkpoint"; exit 1; }

# generate: the same text from the folder as from the checkpoint (greedy, fp32).
gen() { "$exe" generate --checkpoint "$1" --prompt "The Congress" --max-new-tokens 12 --temperature 0 2>/dev/null; }
[ "$(gen "$lora")" = "$(gen "$dir")" ] || { echo "generate from the PEFT folder differs from its checkpoint"; exit 1; }
echo "generate: the same text"

# convert: the folder merged into its base (our checkpoint, or its HF conversion) is the checkpoint's merged conversion.
"$exe" convert --input "$lora" --output "$runs/lora_merged_fp32" --dtype fp32
"$exe" convert --input "$dir" --output "$runs/peft_merged" --dtype fp32
"$exe" convert --input "$runs/peft_on_hf" --output "$runs/peft_merged_hf" --dtype fp32
for out in peft_merged peft_merged_hf; do
  for f in model.safetensors config.json tokenizer.model; do
    cmp "$runs/lora_merged_fp32/$f" "$runs/$out/$f" || { echo "$out/$f differs from the checkpoint's merge"; exit 1; }
  done
done
echo "convert: the merged PEFT folders equal the checkpoint's merge"
"$exe" inspect-checkpoint --checkpoint "$runs/peft_merged" | grep -A4 "^made from"
"$exe" inspect-checkpoint --checkpoint "$runs/peft_merged_hf" | grep -A5 "^made from"
grep -q '"format": "peft"' "$runs/peft_merged/hadatrain_provenance.json"
grep -q '"lora_alpha": 32' "$runs/peft_merged/hadatrain_provenance.json"

# An output folder holds one model: an adapter into an HF folder, and an HF model into an adapter folder, are refused
# and leave the folder as it was.
refused() {
  local out
  if out=$("$exe" convert "$@" 2>&1); then echo "convert $* was not refused"; exit 1; fi
  echo "$out" | grep "^error: "
}
refused --input "$lora" --output "$runs/peft_merged" --adapter
[ ! -e "$runs/peft_merged/adapter_config.json" ] || { echo "an adapter was written into an HF folder"; exit 1; }
refused --input "$lora" --output "$runs/peft_on_hf"
[ ! -e "$runs/peft_on_hf/config.json" ] || { echo "an HF model was written into an adapter folder"; exit 1; }

"$exe" train "$@" --set model.init_from="$dir" --set checkpoint.every_steps=2 --set run.out_dir="$runs/from_peft" 2>&1 |
  grep "model.init_from: the adapters of"
"$exe" inspect-checkpoint --checkpoint "$runs/from_peft/checkpoints" | grep -A4 "^made from"
echo "ok: the same $peft"
