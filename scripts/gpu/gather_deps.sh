#!/usr/bin/env bash
# Gathers, on this Debian 12 machine, the build and run-time dependencies a
# GPU machine lacks (gRPC, Protobuf with protoc and grpc_cpp_plugin,
# Abseil, zstd, prometheus-cpp, OpenSSL, zlib, c-ares, RE2, GoogleTest and
# pkgconf), as Debian packages unpacked into one prefix folder that travels
# with the working tree to the machine, where scripts/gpu/run_on_device.sh
# builds against it and the PyTorch wheel's LibTorch.
#
#   scripts/gpu/gather_deps.sh [DEST]      (default: .gpu-deps, git-ignored)
#
# `apt-get download` fetches each package (no root needed, no install);
# `dpkg -x` unpacks it under DEST. The prefix is then trimmed to what CMake,
# the compiler and the linker need: documentation, static archives (the
# build links the shared libraries; GoogleTest's, which are only static,
# stay) and the gRPC plugins for other languages (gRPC's CMake package
# checks that they exist, so each leaves an empty placeholder) go.
# prometheus-cpp's CMake package is told that its pull and push libraries
# are off: Starling links only its core, and their dependencies (civetweb,
# libcurl) are not carried.
#
# The working tree and the carried paths may total 64 MiB: the script
# measures both and fails when they do not fit. DEST/MANIFEST.txt lists
# the packages and the newest glibc and libstdc++ symbol versions the
# carried binaries need, which run_on_device.sh checks before it builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpu-deps}
LIMIT_BYTES=$((64 * 1024 * 1024))

# package                     why
PACKAGES=(
  libgrpc++-dev                # gRPC C++ headers, gRPCConfig.cmake
  libgrpc-dev                  # gRPC core headers and libraries
  libgrpc++1.51                # libgrpc++.so
  libgrpc29                    # libgrpc.so, libgpr.so, libupb.so
  protobuf-compiler-grpc       # grpc_cpp_plugin
  libprotobuf-dev              # Protobuf headers
  libprotobuf32                # libprotobuf.so
  libprotoc32                  # protoc's library
  protobuf-compiler            # protoc
  libabsl-dev                  # Abseil headers, abslConfig.cmake
  libabsl20220623              # Abseil libraries
  libzstd-dev                  # zstd headers, libzstd.pc
  libzstd1                     # libzstd.so
  prometheus-cpp-dev           # prometheus-cpp headers and CMake package
  libprometheus-cpp-core1.0    # the core library Starling links
  libprometheus-cpp-pull1.0    # named by prometheus-cpp's CMake targets
  libprometheus-cpp-push1.0    # likewise
  libssl-dev                   # OpenSSL headers (gRPC's CMake package)
  libssl3                      # libssl.so, libcrypto.so
  zlib1g-dev                   # zlib headers
  zlib1g                       # libz.so
  libc-ares-dev                # c-ares (gRPC's dependency)
  libc-ares2
  libre2-dev                   # RE2 (gRPC's dependency), re2.pc
  libre2-9
  libgtest-dev                 # GoogleTest (the gpu tests), static
  libgmock-dev
  pkgconf-bin                  # pkgconf: gRPC's FindRE2 and zstd need it
  libpkgconf3
)

die() { echo "gather_deps: error: $*" >&2; exit 1; }
command -v apt-get >/dev/null || die "needs Debian 12's apt-get"
command -v dpkg >/dev/null || die "needs dpkg"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "gather_deps: downloading ${#PACKAGES[@]} packages"
(cd "$work" && apt-get download "${PACKAGES[@]}") >"$work/download.log" 2>&1 ||
  { cat "$work/download.log" >&2
    die "apt-get download failed (run apt-get update first?)"; }

rm -rf "$DEST"
mkdir -p "$DEST"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$DEST"; done

# Trim to what the build and the run need.
rm -rf "$DEST"/usr/share/doc "$DEST"/usr/share/man "$DEST"/usr/share/lintian \
  "$DEST"/usr/share/bug "$DEST"/usr/share/aclocal "$DEST"/usr/share/pkgconfig
find "$DEST" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
for plugin in "$DEST"/usr/bin/grpc_*_plugin; do
  [ "$(basename "$plugin")" = grpc_cpp_plugin ] && continue
  : >"$plugin"  # gRPCTargets.cmake checks that it exists; never run
done
prom="$DEST/usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp/prometheus-cpp-config.cmake"
[ -f "$prom" ] || die "no prometheus-cpp CMake package in $DEST"
sed -i -e 's/^set(PROMETHEUS_CPP_ENABLE_PULL ON)/set(PROMETHEUS_CPP_ENABLE_PULL OFF)/' \
  -e 's/^set(PROMETHEUS_CPP_ENABLE_PUSH ON)/set(PROMETHEUS_CPP_ENABLE_PUSH OFF)/' "$prom"
if ! grep -q 'ENABLE_PULL OFF' "$prom" || ! grep -q 'ENABLE_PUSH OFF' "$prom"; then
  die "could not turn prometheus-cpp's pull/push off in $prom"
fi
# Packages that predate Debian's merged /usr put libraries in /lib: one
# library folder is simpler to point at. Their absolute symlinks (libz.so
# -> /lib/...) would point into the target machine's /usr: made relative.
if [ -d "$DEST/lib" ]; then
  cp -a "$DEST/lib/." "$DEST/usr/lib/"
  rm -rf "${DEST:?}/lib"
fi
while IFS= read -r link; do
  target=$(readlink "$link")
  case "$target" in /lib/*) target=/usr$target ;; esac
  [ -e "$DEST$target" ] || die "$link points to $target, which is not carried"
  ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$DEST$target")" "$link"
done < <(find "$DEST" -type l -lname '/*')
for need in usr/bin/protoc usr/bin/grpc_cpp_plugin usr/bin/pkgconf \
  usr/lib/x86_64-linux-gnu/cmake/grpc/gRPCConfig.cmake \
  usr/lib/x86_64-linux-gnu/cmake/absl/abslConfig.cmake \
  usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake \
  usr/lib/x86_64-linux-gnu/libprotobuf.so usr/include/google/protobuf/message.h \
  usr/lib/x86_64-linux-gnu/pkgconfig/libzstd.pc usr/include/openssl/ssl.h; do
  [ -e "$DEST/$need" ] || die "$need is missing from $DEST"
done

# What the carried binaries need of the target's C and C++ runtimes.
elves=$(find "$DEST" -type f \( -name '*.so*' -o -path '*/bin/*' \) -size +0)
glibc=$(for f in $elves; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1)
glibcxx=$(for f in $elves; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_3\.4\.[0-9]*' | sort -uV | tail -1)
{
  echo "# scripts/gpu/gather_deps.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "needs_glibc $glibc"
  echo "needs_glibcxx $glibcxx"
  for deb in "$work"/*.deb; do
    # shellcheck disable=SC2016  # dpkg-deb's own ${...} fields
    dpkg-deb -W --showformat='${Package} ${Version}\n' "$deb"
  done
} >"$DEST/MANIFEST.txt"

deps_bytes=$(du -sb "$DEST" | cut -f1)
tree_bytes=$( (git ls-files -z; git ls-files -z --others --exclude-standard) |
  xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((deps_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gather_deps: $DEST is $(mib "$deps_bytes"), the working tree" \
  "$(mib "$tree_bytes"): $(mib "$total") of the $(mib "$LIMIT_BYTES") a device run carries"
echo "gather_deps: the carried binaries need $glibc and $glibcxx"
[ "$total" -le "$LIMIT_BYTES" ] || die "over the limit: trim $DEST further"
echo "gather_deps: ready; run scripts/gpu/run_on_device.sh there with carry=[\"$DEST\"]"
