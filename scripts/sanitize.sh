#!/usr/bin/env bash
# Builds the unit tests (the C++ binaries of ctest's `unit` label) with ASan
# and UBSan (clang) into ./build-asan (or $BUILD_DIR) and runs each binary
# once, all its tests in one process (ASan makes every process start slower,
# and ctest starts one per test): any sanitizer report, leak or failed test
# fails the script. Extra arguments go to every binary, e.g.
# --gtest_filter='Codec*'. Logs: $BUILD_DIR/sanitize-logs/<binary>.log.
# Environment: JOBS (build and test jobs, default 2), SANITIZERS (default
# address,undefined). Needs clang and its sanitizer runtimes (Debian: clang,
# libclang-rt-14-dev; scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
JOBS=${JOBS:-2}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DSTARLING_SANITIZE="${SANITIZERS:-address,undefined}" \
  -DSTARLING_BUILD_BENCH=OFF -DSTARLING_PYTHON=OFF
# The unit-test binaries (and what they need: the starling binary and the
# TorchScript fixtures); CMake lists their paths in unit_tests.txt.
cmake --build "$BUILD_DIR" -j "$JOBS" --target unit_tests
mapfile -t binaries <"$BUILD_DIR/unit_tests.txt"
if ((${#binaries[@]} == 0)); then
  echo "sanitize: $BUILD_DIR/unit_tests.txt lists no unit-test binary" >&2
  exit 1
fi
echo "sanitize: build took $(($(date +%s) - start)) s"

# LeakSanitizer stays on; gRPC's and LibTorch's process-lifetime singletons
# are still reachable at exit, so they are not reported.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$BUILD_DIR/sanitize-logs"
failed=()
for bin in "${binaries[@]}"; do
  t=$(basename "$bin")
  log="$BUILD_DIR/sanitize-logs/$t.log"
  t0=$(date +%s)
  if "$bin" "$@" >"$log" 2>&1; then
    echo "sanitize: $t ok ($(grep -o '^\[  PASSED  \] [0-9]* tests\?' "$log" |
      tail -n 1 | sed 's/.*\] //'), $(($(date +%s) - t0)) s)"
  else
    echo "sanitize: $t FAILED (log $log):" >&2
    grep -E '^\[  FAILED  \]|runtime error|ERROR: (Address|Leak)Sanitizer' \
      "$log" | head -n 20 >&2 || tail -n 30 "$log" >&2
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "sanitize: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "sanitize: all ${#binaries[@]} unit-test binaries clean"
