#!/usr/bin/env bash
# Runs on the GPU machine that the `device` tool lends, in the repository
# root, with .gpu-deps carried (scripts/gpu/gather_deps.sh made it here):
#
#   1. checks the machine: a GPU, python3's PyTorch (its LibTorch, C++11
#      ABI), CMake, ninja, nvcc, and a glibc/libstdc++ new enough for the
#      carried Debian 12 libraries;
#   2. configures and builds `starling` and the gpu tests with ninja, with
#      -DCMAKE_PREFIX_PATH = the wheel's LibTorch and the carried prefix;
#   3. runs `ctest -L gpu`;
#   4. runs bench/gpu_step_time.py: `starling train --device=cuda` against
#      the same gpt in PyTorch eager, fp32 and bf16, with GPU memory;
#   5. runs a 4-process `starling sim --device=cuda` of a ~100M-parameter
#      gpt on the one GPU and reads its round time split;
# within BUDGET_SECONDS (default 540) in all, each phase capped so that the
# later ones keep their time, failing fast with a message that names the
# cause. Every phase's outcome goes into $OUT/device_run.json.
#
#   OUT=/some/dir scripts/gpu/run_on_device.sh      (the device tool sets OUT)
#
# $OUT receives at most 8 plain files: device_run.json, run.log, build.log,
# ctest.log, gpu_step_time.json, gpu_step_time.md, sim_summary.json.
#
# Mixing Debian 12's libraries with the wheel's LibTorch: both use the
# C++11 std::string ABI (checked in 1.); Starling's code is compiled here
# by this machine's g++ against the carried headers and linked against the
# carried shared libraries, which need at most the glibc and libstdc++
# symbol versions in .gpu-deps/MANIFEST.txt (checked in 1.). A newer GCC
# than Debian's 12 compiles Abseil 20220623's and Protobuf 3.21's headers
# only with <cstdint> included up front, hence -include cstdint. The
# carried libraries are found through LD_LIBRARY_PATH, set only for the
# build and for Starling's own processes, not for python3.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/runs/gpu-device}
BUDGET=${BUDGET_SECONDS:-540}
DEPS=$ROOT/.gpu-deps
DEPS_LIB=$DEPS/usr/lib/x86_64-linux-gnu
BUILD=$ROOT/build-gpu
WORK=$(mktemp -d /tmp/starling-gpu-XXXXXX)
mkdir -p "$OUT"
START=$(date +%s)
PHASES=$WORK/phases.tsv
: >"$PHASES"
exec > >(tee -a "$OUT/run.log") 2>&1

left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "run_on_device [$(($(date +%s) - START))s]: $*"; }
# phase NAME STATUS SECONDS NOTE: one line of device_run.json's "phases".
phase() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$PHASES"; }
withdeps() { LD_LIBRARY_PATH=$DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
# timed NAME CAP CMD...: runs CMD under `timeout` for at most CAP seconds (or
# what is left), recording the phase; returns CMD's status.
timed() {
  local name=$1 cap=$2
  shift 2
  local budget
  budget=$(left)
  [ "$cap" -lt "$budget" ] || cap=$budget
  if [ "$cap" -lt 10 ]; then
    phase "$name" skipped 0 "out of time (${budget}s of the budget left)"
    say "$name: skipped, out of time"
    return 124
  fi
  say "$name: up to ${cap}s"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@"
  rc=$?
  local took=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    phase "$name" ok "$took" ""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    phase "$name" timeout "$took" "stopped after ${cap}s"
  else
    phase "$name" failed "$took" "exit $rc"
  fi
  say "$name: exit $rc after ${took}s"
  return $rc
}
# Writes device_run.json from the phases and the results found so far.
finish() {
  python3 - "$OUT" "$PHASES" "$WORK" "$BUDGET" "$(($(date +%s) - START))" <<'EOF'
import json, os, sys
out, phases_path, work, budget, took = sys.argv[1:6]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None
run = {"budget_seconds": int(budget), "seconds": int(took), "phases": []}
for line in open(phases_path):
    name, status, seconds, note = (line.rstrip("\n").split("\t") + [""])[:4]
    run["phases"].append({"name": name, "status": status,
                          "seconds": int(seconds), "note": note})
run["ok"] = bool(run["phases"]) and all(
    p["status"] == "ok" for p in run["phases"])
run["environment"] = load(os.path.join(work, "env.json"))
run["step_time"] = load(os.path.join(out, "gpu_step_time.json"))
run["sim"] = load(os.path.join(work, "sim_result.json"))
with open(os.path.join(out, "device_run.json"), "w") as f:
    json.dump(run, f, indent=2)
    f.write("\n")
print(json.dumps({"ok": run["ok"], "phases": run["phases"]}, indent=1))
EOF
}
trap 'finish; rm -rf "$WORK"' EXIT
die() {
  say "error: $*"
  phase "${CURRENT:-check}" failed 0 "$*"
  exit 1
}

# --- 1. the machine ---------------------------------------------------------
CURRENT=check
[ -d "$DEPS" ] || die "no $DEPS: run scripts/gpu/gather_deps.sh where the" \
  "tree comes from and carry .gpu-deps"
for tool in python3 cmake ninja g++ timeout objdump; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
command -v nvcc >/dev/null || die "nvcc is not on PATH nor in /usr/local/cuda/bin"
nvidia-smi -L || true
python3 - "$WORK/env.json" <<'EOF' || die "python3's PyTorch has no usable CUDA GPU (see above)"
import glob, json, os, platform, subprocess, sys, torch
env = {
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
    "cmake_prefix_path": torch.utils.cmake_prefix_path,
    "cuda_available": torch.cuda.is_available(),
    "python": sys.executable,
    "glibc": platform.libc_ver()[1],
}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    env.update(gpu=p.name, gpu_memory_bytes=p.total_memory,
               gpu_count=torch.cuda.device_count(),
               capability=f"{p.major}.{p.minor}")
try:
    import nvidia.cudnn
    d = list(nvidia.cudnn.__path__)[0]
    libs = sorted(glob.glob(os.path.join(d, "lib", "libcudnn.so*")))
    if libs:
        env.update(cudnn_include=os.path.join(d, "include"), cudnn_library=libs[0])
except Exception:
    pass
for tool, args in [("cmake", ["--version"]), ("ninja", ["--version"]),
                   ("g++", ["-dumpfullversion"]), ("nvcc", ["--version"])]:
    try:
        env[tool] = subprocess.run([tool] + args, capture_output=True,
                                   text=True).stdout.strip().splitlines()[-1]
    except Exception as e:
        env[tool] = f"not run: {e}"
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env, indent=1))
sys.exit(0 if env["cuda_available"] else 1)
EOF
read -r TORCH_PREFIX CXX11_ABI CUDNN_INC CUDNN_LIB < <(python3 -c "
import json; e = json.load(open('$WORK/env.json'))
print(e['cmake_prefix_path'], e['cxx11_abi'], e.get('cudnn_include', '-'),
      e.get('cudnn_library', '-'))")
[ "$CXX11_ABI" = True ] || die "this PyTorch uses the pre-C++11 std::string" \
  "ABI; Debian's gRPC and Abseil use the C++11 one: they cannot be mixed"
need_glibc=$(awk '/^needs_glibc/ {print $2}' "$DEPS/MANIFEST.txt")
need_glibcxx=$(awk '/^needs_glibcxx/ {print $2}' "$DEPS/MANIFEST.txt")
have_glibc=GLIBC_$(getconf GNU_LIBC_VERSION | awk '{print $2}')
[ "$(printf '%s\n%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1)" = \
  "$need_glibc" ] || die "glibc is $have_glibc; the carried libraries need" \
  "$need_glibc (a newer base image, or carry packages built for this one)"
libstdcxx=$(g++ -print-file-name=libstdc++.so.6)
objdump -T "$libstdcxx" | grep -q "$need_glibcxx" || die "$libstdcxx lacks" \
  "$need_glibcxx, which the carried libraries need"
phase check ok "$(($(date +%s) - START))" \
  "$(python3 -c "import json; e=json.load(open('$WORK/env.json')); print(e.get('gpu'), 'torch', e['torch'])")"

# --- 2. configure and build ---------------------------------------------------
CURRENT=configure
cmake_args=(
  -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
  "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX;$DEPS/usr"
  -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu
  "-DCMAKE_CXX_FLAGS=-include cstdint"
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
  -DSTARLING_WITH_GLOO=OFF -DSTARLING_BUILD_BENCH=OFF
  -DSTARLING_TORCH_PYTHON="$(command -v python3)"
  -DPKG_CONFIG_EXECUTABLE="$DEPS/usr/bin/pkgconf"
  -Dabsl_DIR="$DEPS_LIB/cmake/absl" -DgRPC_DIR="$DEPS_LIB/cmake/grpc"
  -DGTest_DIR="$DEPS_LIB/cmake/GTest"
  -Dprometheus-cpp_DIR="$DEPS_LIB/cmake/prometheus-cpp"
  -DProtobuf_INCLUDE_DIR="$DEPS/usr/include"
  -DProtobuf_LIBRARY="$DEPS_LIB/libprotobuf.so"
  -DProtobuf_PROTOC_EXECUTABLE="$DEPS/usr/bin/protoc"
  -DZLIB_INCLUDE_DIR="$DEPS/usr/include" -DZLIB_LIBRARY="$DEPS_LIB/libz.so"
  -DOPENSSL_ROOT_DIR="$DEPS/usr" -DOPENSSL_INCLUDE_DIR="$DEPS/usr/include"
  -DOPENSSL_SSL_LIBRARY="$DEPS_LIB/libssl.so"
  -DOPENSSL_CRYPTO_LIBRARY="$DEPS_LIB/libcrypto.so"
  -Dc-ares_INCLUDE_DIR="$DEPS/usr/include" -Dc-ares_LIBRARY="$DEPS_LIB/libcares.so"
)
if [ "$CUDNN_LIB" != - ]; then
  # The wheel's Caffe2Config.cmake looks for cuDNN; pip's nvidia-cudnn has it.
  cmake_args+=(-DCUDNN_INCLUDE_PATH="$CUDNN_INC" -DCUDNN_LIBRARY_PATH="$CUDNN_LIB")
fi
# Only Starling's own .pc files (zstd, re2), with their /usr under $DEPS.
export PKG_CONFIG_LIBDIR=$DEPS_LIB/pkgconfig PKG_CONFIG_SYSROOT_DIR=$DEPS
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
timed configure 120 withdeps cmake "${cmake_args[@]}" >"$WORK/configure.log" 2>&1
rc=$?
cp "$WORK/configure.log" "$OUT/build.log"
[ $rc -eq 0 ] || { tail -n 60 "$WORK/configure.log"; die "cmake could not configure (build.log)"; }
CURRENT=build
# What the run needs; the rest of the tests need Debian's LibTorch.
timed build $(($(left) - 200)) withdeps ninja -C "$BUILD" -j "$(nproc)" \
  starling gpu_test gpu_sim_test >>"$OUT/build.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -n 60 "$OUT/build.log"; die "the build failed or ran out of time (build.log)"; }
STARLING=$BUILD/starling
withdeps "$STARLING" --help >/dev/null || die "the built starling does not start"
# Starling's processes find the carried libraries through this wrapper.
cat >"$WORK/starling" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$DEPS_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $STARLING "\$@"
EOF
chmod +x "$WORK/starling"

# --- 3. the gpu tests -----------------------------------------------------------
CURRENT=ctest
timed ctest 100 withdeps ctest --test-dir "$BUILD" -L gpu --output-on-failure \
  --timeout 90 >"$OUT/ctest.log" 2>&1
tail -n 25 "$OUT/ctest.log"

# --- 4. step time: Starling vs PyTorch eager -------------------------------------
CURRENT=step_time
CORPUS=$WORK/corpus.txt
timed step_time $(($(left) - 90)) python3 "$ROOT/bench/gpu_step_time.py" \
  --starling="$WORK/starling" --device=cuda --corpus="$CORPUS" \
  --work="$WORK/step_time" --json="$OUT/gpu_step_time.json" \
  --md="$OUT/gpu_step_time.md"
[ -f "$OUT/gpu_step_time.md" ] && cat "$OUT/gpu_step_time.md"

# --- 5. four nodes on the one GPU ---------------------------------------------------
CURRENT=sim
[ -f "$CORPUS" ] || python3 "$ROOT/bench/gpu_step_time.py" --corpus="$CORPUS" --corpus_only
timed sim $(($(left) - 5)) "$WORK/starling" sim --nodes=4 --device=cuda \
  --model=gpt --layers=12 --width=768 --heads=12 --context=256 \
  --data="text:$CORPUS" --batch=16 --steps=60 --inner_steps=20 --lr=3e-4 \
  --warmup=10 --eval_every=0 --checkpoint_every=0 --seed=0 \
  --out="$WORK/sim" >"$WORK/sim.log" 2>&1
tail -n 15 "$WORK/sim.log"
python3 - "$WORK/sim" "$WORK/sim_result.json" "$OUT/sim_summary.json" <<'EOF'
import json, os, shutil, sys
sim, result_path, copy_path = sys.argv[1:4]
summary_path = os.path.join(sim, "summary.json")
if not os.path.exists(summary_path):
    sys.exit(0)
shutil.copy(summary_path, copy_path)
summary = json.load(open(summary_path))
# The rounds each node committed, by round: every member's hash must agree.
hashes = {}
for node in sorted(os.listdir(sim)):
    events = os.path.join(sim, node, "events.jsonl")
    if not os.path.exists(events):
        continue
    for line in open(events):
        ev = json.loads(line)
        if ev.get("event") == "round":
            hashes.setdefault(ev["round"], {})[node] = ev["model_hash"]
nodes = summary.get("nodes", [])
result = {
    "rounds": len(hashes),
    "hashes_agree": bool(hashes) and all(len(set(h.values())) == 1 and
                                         len(h) == 4 for h in hashes.values()),
    "round_hashes": hashes,
    "round_time_split": {n.get("id"): n.get("round_time_split") for n in nodes},
    "gpu_peak_allocated_bytes": {n.get("id"): n.get("gpu_peak_allocated_bytes")
                                 for n in nodes},
    "final": summary.get("final"),
}
json.dump(result, open(result_path, "w"), indent=1)
print(json.dumps({k: result[k] for k in
                  ("rounds", "hashes_agree", "round_time_split")}, indent=1))
EOF
