#!/usr/bin/env bash
# Installs every Debian 12 package that building, running and testing Starling
# need, including the data sets. Idempotent: installs only what is missing.
set -euo pipefail

PACKAGES=(
  # toolchain
  cmake g++ make pkg-config ccache git ca-certificates
  # libraries (LibTorch, gRPC, Protobuf, Abseil, zstd, zlib, tests, benchmarks)
  libtorch-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libabsl-dev libzstd-dev zlib1g-dev libgtest-dev
  libgmock-dev libbenchmark-dev prometheus-cpp-dev
  # without it Debian's LibTorch uses reference BLAS and trains ~4x slower
  libopenblas0-openmp
  # real data sets: Fashion-MNIST idx files and the King James Bible
  dataset-fashion-mnist bible-kjv
  # TorchScript test fixtures and the PyTorch reference benchmark
  python3 python3-torch
  # report.html charts; pgrep for the tests
  gnuplot-nox procps
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
