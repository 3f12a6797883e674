#!/usr/bin/env bash
# Configures and builds Starling into ./build (or $BUILD_DIR). Extra arguments
# go to CMake, e.g. -DCMAKE_PREFIX_PATH=/path/to/libtorch for a CUDA LibTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# Relative paths in ccache's keys let every clone share one cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "build: $BUILD_DIR/starling is ready"
