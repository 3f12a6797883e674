#!/usr/bin/env bash
# Runs the test suite: labels unit, integration, python (the Python
# module's pytest suite) and gpu (gpu tests skip without CUDA). The long end-to-end quality runs (label scenario, about 28-33
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
# The tests' files (sim runs, logs, checkpoints: a few hundred MB a run) go
# into one directory for this run, removed when every test passed and kept,
# and named, when one failed: its messages point into it. A TEST_TMPDIR set
# by the caller is left alone.
own_tmp=
if [ -z "${TEST_TMPDIR:-}" ]; then
  TEST_TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/starling-tests.XXXXXX")
  export TEST_TMPDIR
  own_tmp=1
fi
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-$(nproc)}" \
  ${select[@]+"${select[@]}"} "$@" || rc=$?
if [ -n "$own_tmp" ]; then
  if [ "$rc" -eq 0 ]; then
    rm -rf "$TEST_TMPDIR"
  else
    echo "test.sh: the tests' files are kept in $TEST_TMPDIR" >&2
  fi
fi
exit "$rc"
