#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing Starling
# need, including the data sets, plus two tools for the tests that Debian
# does not package on its own: promtool (extracted from Debian's prometheus
# package into .tools/, so that no Prometheus server gets installed and
# started) and the npm packages that validate deploy/'s manifests
# (deploy/validate, pinned by its lockfile). Idempotent: does only what is
# missing. kubectl is not in Debian: without it the manifest test skips.
set -euo pipefail
# --no-test-tools: packages only (the container image's build stage).
TEST_TOOLS=1
for arg in "$@"; do
  case "$arg" in
    --no-test-tools) TEST_TOOLS=0 ;;
    *) echo "setup: unknown argument $arg (expected --no-test-tools)" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  # toolchain
  cmake g++ make pkg-config ccache git ca-certificates
  # scripts/check_sizes.py (the house's function and file size rules)
  universal-ctags
  # libraries (LibTorch, gRPC, Protobuf, Abseil, zstd, zlib, tests, benchmarks)
  libtorch-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libabsl-dev libzstd-dev zlib1g-dev libgtest-dev
  libgmock-dev libbenchmark-dev prometheus-cpp-dev
  # TLS between peers: OpenSSL checks the PEM files; the tests make their
  # certificates with the openssl command
  libssl-dev openssl
  # libFuzzer targets with ASan/UBSan (scripts/fuzz.sh): clang and its
  # runtimes (only recommended by clang, so named here)
  clang libclang-rt-14-dev
  # Gloo's headers, for PyTorch's Gloo all-reduce in `starling bench allreduce`
  libgloo-dev
  # without it Debian's LibTorch uses reference BLAS and trains ~4x slower
  libopenblas0-openmp
  # `starling tokenize`: SentencePiece, the library it trains and applies
  # token models with
  libsentencepiece-dev
  # SentencePiece's own spm_encode, which the tests check its ids against
  sentencepiece
  # real data sets: Fashion-MNIST idx files and the King James Bible
  dataset-fashion-mnist bible-kjv
  # TorchScript test fixtures and the PyTorch reference benchmark
  python3 python3-torch
  # the `starling` Python module (python/: pybind11 and Python's headers,
  # which python3-dev brings), its tests (pytest, label python) and the
  # README's virtual environment for it (venv)
  pybind11-dev python3-dev python3-pytest python3-venv
  # report.html charts; pgrep for the tests; ip and tc for the real-network
  # test (namespaces, veth pairs, tc shaping)
  gnuplot-nox procps iproute2
  # nft for the NAT test (tests/node/nat_netns_test.cc: a router namespace
  # that masquerades and forwards a port)
  nftables
  # deploy/ checks: YAML lint, the end-to-end test's YAML and gRPC health
  # client, Node.js for the manifest validator
  yamllint python3-yaml python3-grpcio nodejs
)
# Node.js from elsewhere (e.g. NodeSource) bundles npm; Debian's does not.
command -v npm >/dev/null || PACKAGES+=(npm)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
need_sudo() {
  if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
    echo "setup: run as root or install sudo" >&2
    exit 1
  fi
}
updated=0
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
else
  need_sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$TEST_TOOLS" -eq 0 ]; then
  echo "setup: done (packages only)"
  exit 0
fi

# promtool: only the binary from Debian's prometheus package.
cd "$(dirname "$0")/.."
if [ ! -x .tools/prometheus/usr/bin/promtool ]; then
  if [ "$updated" -eq 0 ]; then need_sudo; $SUDO apt-get update -q; fi
  echo "setup: extracting promtool from Debian's prometheus package into .tools/"
  tmp=$(mktemp -d)
  chmod 0755 "$tmp"  # apt downloads as user _apt
  (cd "$tmp" && apt-get download -q prometheus)
  mkdir -p .tools
  dpkg -x "$tmp"/prometheus_*.deb .tools/prometheus
  rm -rf "$tmp"
fi

# The manifest validator's npm packages, exactly as locked.
if [ ! -d deploy/validate/node_modules ] ||
   [ deploy/validate/package-lock.json -nt deploy/validate/node_modules ]; then
  echo "setup: npm ci in deploy/validate"
  if npm ci --prefix deploy/validate --no-audit --no-fund --loglevel=error; then
    touch deploy/validate/node_modules
  else
    # Everything else works without it; only that test skips.
    echo "setup: warning: npm ci in deploy/validate failed (is the npm" \
         "registry reachable and its TLS certificate trusted?); the" \
         "manifest validation test will skip" >&2
  fi
fi
echo "setup: done"
