#!/usr/bin/env bash
# Runs the test suite: labels unit, integration and gpu (gpu tests skip
# without CUDA). The long end-to-end quality runs (label scenario, about 28-33
# minutes on 2 cores) have their own command, `scripts/test.sh -L scenario`.
# Extra arguments go to ctest. Arguments that choose tests (-L, -LE, -R, -E)
# replace the default selection, e.g. -L unit, or -L . for every test.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
select=(-LE scenario)
for arg in "$@"; do
  case "$arg" in
    -L | -LE | -R | -E | --label-regex* | --label-exclude* | --tests-regex* | \
      --exclude-regex*)
      select=()
      ;;
  esac
done
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" \
  ${select[@]+"${select[@]}"} "$@"
