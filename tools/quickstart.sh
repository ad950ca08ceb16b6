#!/usr/bin/env bash
# From a fresh Debian/Ubuntu machine to a trained model: installs the packages (tools/setup.sh), configures
# and builds hadatrain in build/ (Release, Ninja), then runs the main job, an MLP on Fashion-MNIST
# (configs/fashion_mnist_mlp.yaml). Extra arguments go to `hadatrain train`, e.g. --set train.epochs=5.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/setup.sh
if [ -f build/CMakeCache.txt ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release   # keep the generator build/ was made with
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build --target hadatrain -j "$(nproc)"
exec build/tools/hadatrain train --config configs/fashion_mnist_mlp.yaml "$@"
