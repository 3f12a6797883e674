#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, issue #8) into ./build-fuzz (or
# $BUILD_DIR) with clang, ASan and UBSan, and runs each one for
# SECONDS_PER_TARGET seconds (default 60) on a scratch copy of its committed
# seed corpus, tests/fuzz/corpus/<target>/, which it never modifies.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [extra CMake arguments...]
#
# Prints one line per target with its executions, writes
# $BUILD_DIR/fuzz-report.json ({"target": {"runs": N, "seconds": S,
# "crashes": C}, ...}) and each target's log to $BUILD_DIR/fuzz-logs/, and
# exits 1 when any target crashed (a sanitizer report, a failed invariant, a
# timeout or running out of memory). Reproducers land in
# $BUILD_DIR/fuzz-artifacts/<target>/; rerun one with
#   $BUILD_DIR/tests/fuzz/<target> <file>
# Environment: JOBS (build jobs, default 2), FUZZ_TARGETS (a space-separated
# subset, e.g. "codec_fuzz mailbox_fuzz"), FUZZ_ARGS (more libFuzzer flags).
# Needs clang and its libFuzzer runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || ((SECONDS_PER_TARGET < 1)); then
  echo "usage: $0 [SECONDS_PER_TARGET] [cmake args...]" >&2
  exit 2
fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}

build_start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTARLING_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ \
  -DSTARLING_BUILD_TESTS=OFF -DSTARLING_BUILD_BENCH=OFF -DSTARLING_PYTHON=OFF "$@"
cmake --build "$BUILD_DIR" -j "$JOBS" --target starling_fuzz
echo "fuzz: build took $(($(date +%s) - build_start)) s"

if [[ -n ${FUZZ_TARGETS:-} ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for src in tests/fuzz/*_fuzz.cc; do
    name=$(basename "$src" .cc)
    targets+=("$name")
  done
fi

# Scratch space: the corpus copies the fuzzers grow, and $TMPDIR for the
# targets that write files (in memory when /dev/shm is there).
scratch_parent=${TMPDIR:-/tmp}
if [[ -d /dev/shm && -w /dev/shm ]]; then scratch_parent=/dev/shm; fi
work=$(mktemp -d "$scratch_parent/starling-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mkdir -p "$BUILD_DIR/fuzz-logs"
report="$BUILD_DIR/fuzz-report.json"
json="{"
failed=0
for t in "${targets[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/$t"
  seeds="tests/fuzz/corpus/$t"
  if [[ ! -x $bin ]]; then
    echo "fuzz: no target $bin" >&2
    exit 2
  fi
  corpus="$work/corpus/$t"
  mkdir -p "$corpus" "$work/tmp/$t"
  if [[ -d $seeds ]]; then cp -- "$seeds"/* "$corpus"/ 2>/dev/null || true; fi
  artifacts="$BUILD_DIR/fuzz-artifacts/$t"
  mkdir -p "$artifacts"
  before=$(find "$artifacts" -type f | wc -l)
  log="$BUILD_DIR/fuzz-logs/$t.log"
  start=$(date +%s.%N)
  set +e
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  TMPDIR="$work/tmp/$t" "$bin" -max_total_time="$SECONDS_PER_TARGET" \
    -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" ${FUZZ_ARGS:-} "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" \
    'BEGIN { printf "%.1f", e - s }')
  # libFuzzer ends with "Done N runs in S second(s)" (and "#N DONE ...");
  # after a crash only the stats and the last "#N" status line say.
  runs=$(sed -n 's/^Done \([0-9][0-9]*\) runs in.*/\1/p' "$log" | tail -n 1)
  if [[ -z $runs ]]; then
    runs=$(sed -n 's/^#\([0-9][0-9]*\)[[:space:]]*DONE.*/\1/p' "$log" |
      tail -n 1)
  fi
  if [[ -z $runs ]]; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' \
      "$log" | tail -n 1)
  fi
  if [[ -z $runs ]]; then
    runs=$(sed -n 's/^#\([0-9][0-9]*\)[[:space:]].*/\1/p' "$log" | tail -n 1)
  fi
  runs=${runs:-0}
  crashes=$(($(find "$artifacts" -type f | wc -l) - before))
  if ((rc != 0 && crashes == 0)); then crashes=1; fi
  status=ok
  if ((rc != 0)); then
    status="CRASH (exit $rc; log $log; reproducers in $artifacts/)"
    failed=1
  fi
  printf 'fuzz: %-22s runs=%-10s seconds=%-6s crashes=%s %s\n' \
    "$t" "$runs" "$seconds" "$crashes" "$status"
  [[ $json == "{" ]] || json+=", "
  json+="\"$t\": {\"runs\": $runs, \"seconds\": $seconds, \"crashes\": $crashes}"
done
json+="}"
echo "$json" >"$report"
echo "fuzz: report in $report"
if ((failed)); then
  echo "fuzz: FAILED: a target crashed (see above)" >&2
  exit 1
fi
