#!/usr/bin/env bash
# What a converted or fine-tuned model was made from, end to end through the command line (docs/language_models.md,
# Provenance):
#   ours -> HF      hadatrain_provenance.json beside config.json names the checkpoint and its step;
#   HF -> ours      the checkpoint records each file's SHA-256, the same as sha256sum's, and the tokenizer's
#                   fingerprint and files;
#   init_from       a run from that checkpoint, and a run from that run (stopped and resumed), record what they started
#                   from; inspect-checkpoint shows the whole line of descent, and an HF folder written from the last
#                   run nests it;
#   llama2.c -> HF  the provenance file names the .bin with sha256sum's digest.
#   convert_provenance.sh HADATRAIN PYTHON3 WORKDIR CHECKPOINT_ROOT TRAIN_ARGS...   (WORKDIR, CHECKPOINT_ROOT absolute)
set -u
exe=$1 python=$2 work=$3 base=$4
shift 4
fail() { echo "FAIL: $*"; for f in "$work"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
sha() { sha256sum "$1" | cut -c1-64; }
base_step=$(cat "$base/latest")

"$exe" convert --input "$base" --output "$work/hf" --dtype f32 >"$work/to_hf.out" 2>&1 || fail "ours -> HF failed"
p="$work/hf/hadatrain_provenance.json"
grep -qF "\"checkpoint\": \"$base/$base_step\"" "$p" || fail "$p does not name $base/$base_step"
grep -qF "\"step\": ${base_step#step_}," "$p" || fail "$p does not name the step"
grep -qF '"format": "hadatrain"' "$p" || fail "$p has no format"

"$exe" convert --input "$work/hf" --output "$work/ours" >"$work/from_hf.out" 2>&1 || fail "HF -> ours failed"
"$exe" inspect-checkpoint --checkpoint "$work/ours" >"$work/inspect_ours.out" 2>&1 || fail "inspect failed"
for f in config.json model.safetensors hadatrain_provenance.json tokenizer.model; do
  grep -qF "\"sha256\": \"$(sha "$work/hf/$f")\"" "$work/inspect_ours.out" || fail "no SHA-256 of $f as sha256sum's"
done
grep -qE "^  hadatrain.tokenizer_fingerprint: sentencepiece:[0-9a-f]+$" "$work/inspect_ours.out" ||
  fail "the converted checkpoint records no tokenizer fingerprint"

"$exe" train "$@" --set checkpoint.every_steps=1 --set model.init_from="$work/ours" --set run.out_dir="$work/ft1" \
  >"$work/ft1.out" 2>&1 || fail "fine-tuning from the converted checkpoint failed"
"$exe" train "$@" --set checkpoint.every_steps=1 --set model.init_from="$work/ft1/checkpoints" --set train.max_steps=1 \
  --set run.out_dir="$work/ft2" >"$work/ft2.out" 2>&1 || fail "fine-tuning again failed"
"$exe" train "$@" --set checkpoint.every_steps=1 --set model.init_from="$work/ft1/checkpoints" --set train.max_steps=2 \
  --set run.out_dir="$work/ft2" --resume >"$work/ft2_resumed.out" 2>&1 || fail "the resume failed"
"$exe" inspect-checkpoint --checkpoint "$work/ft2/checkpoints" >"$work/inspect_ft2.out" 2>&1 || fail "inspect failed"
expected="made from (newest first):
  trained from the checkpoint $work/ft1/checkpoints/step_2 (step 2)
  which was trained from the checkpoint $work/ours/step_0 (step 0)
  which was converted from the HF folder $work/hf (3 file(s), each with its SHA-256)
  which hadatrain convert wrote from the checkpoint $base/$base_step (step ${base_step#step_})"
got=$(sed -n '/^made from/,/^metadata/p' "$work/inspect_ft2.out" | sed '$d')
[ "$got" = "$expected" ] || fail "the resumed run's line of descent is
$got
expected
$expected"

"$exe" convert --input "$work/ft2/checkpoints" --output "$work/hf2" >"$work/to_hf2.out" 2>&1 || fail "ours -> HF failed"
grep -qF "\"folder\": \"$work/ft1/checkpoints/step_2\"" "$work/hf2/hadatrain_provenance.json" ||
  fail "the second HF folder's record does not nest the run's init_from"

# A llama2.c v0 file (dim 8, hidden 16, 1 layer, 2 heads, vocabulary 16, 8 positions, shared classifier).
"$python" -c "
import struct, sys
floats = 16 * 8 + (2 * 8 + 8 * 8 + 2 * 8 * 8 + 8 * 8 + 3 * 8 * 16) + 8 + 2 * 8 * 2
sys.stdout.buffer.write(struct.pack('<7i', 8, 16, 1, 2, 2, 16, 8) + struct.pack('<%df' % floats, *[((i % 7) - 3) * 0.01 for i in range(floats)]))
" >"$work/tiny.bin" || fail "cannot write the llama2.c file"
"$exe" convert --input "$work/tiny.bin" --output "$work/hf_llama2c" >"$work/llama2c.out" 2>&1 || fail "llama2.c -> HF failed"
p="$work/hf_llama2c/hadatrain_provenance.json"
grep -qF "\"sha256\": \"$(sha "$work/tiny.bin")\"" "$p" || fail "$p does not hold sha256sum's digest of the .bin"
grep -qF "\"file\": \"$work/tiny.bin\"" "$p" || fail "$p does not name the .bin"
echo "provenance: HF folder, converted checkpoint, two runs and their HF folder, llama2.c file: as expected"
