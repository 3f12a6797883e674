#!/usr/bin/env bash
# Runs the whole test suite (labels unit, integration, scenario, gpu; gpu
# tests skip without CUDA). Extra arguments go to ctest, e.g. -L unit.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
