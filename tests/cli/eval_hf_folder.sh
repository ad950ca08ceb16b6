#!/usr/bin/env bash
# `hadatrain eval --checkpoint HF_DIR` evaluates an HF folder's weights: an fp32 conversion of a run's checkpoint gives
# the same validation loss and perplexity as the checkpoint itself, reported as step 0; a config that builds no LLaMA
# is told so.
#   eval_hf_folder.sh HADATRAIN CHECKPOINT_ROOT HF_DIR IMAGE_CONFIG EVAL_ARGS...   (the eval's --config and --set)
set -u
exe=$1 root=$2 hf=$3 image_config=$4
shift 4
fail() { echo "FAIL: $*"; exit 1; }
ours=$("$exe" eval "$@" --checkpoint "$root" 2>&1) || fail "eval of the checkpoint failed: $ours"
json=$(mktemp) && trap 'rm -f "$json"' EXIT || fail "mktemp failed"
theirs=$("$exe" eval "$@" --checkpoint "$hf" --json "$json" 2>&1) || fail "eval of the HF folder failed: $theirs"
line() { grep -E '^validation loss [0-9.]+, perplexity [0-9.]+ \([0-9]+ tokens\)$' <<<"$1"; }
[ -n "$(line "$ours")" ] || fail "no validation line from the checkpoint: $ours"
[ "$(line "$ours")" = "$(line "$theirs")" ] || fail "the HF folder evaluates to '$(line "$theirs")', the checkpoint to '$(line "$ours")'"
grep -q '"step": 0' "$json" || fail "the HF folder's evaluation is not reported as step 0: $(cat "$json")"
out=$("$exe" eval --config "$image_config" --checkpoint "$hf" 2>&1) && fail "an image config evaluated an HF folder: $out"
grep -q "is a Hugging Face LLaMA folder, but the config builds no LLaMA" <<<"$out" || fail "unexpected error: $out"
echo "ok: $(line "$ours") from both"
