#!/usr/bin/env bash
# Builds the stock llama.cpp tools from a PyPI sdist, cached outside the clone, keyed by version and
# flags. Prints the bin directory on stdout.
#   STOCK_PROTO=7 (default)  RPC protocol 7.0.0: llama-cpp-python==0.3.36 (vendor/llama.cpp)
#   STOCK_PROTO=8            RPC protocol 8.0.0: xllamacpp==2026.10.11549 (thirdparty/llama.cpp, b11549);
#                            default targets ggml-rpc-server llama-completion llama-server
#   STOCK_RDMA=ON  build with GGML_RPC_RDMA (needs libibverbs-dev); default OFF (TCP only)
#   STOCK_PATCHES="patches/a.patch ..." patches applied to the source (part of the cache key; the
#                                       plain native build defaults to patches/test-backend-ops-rpc.patch)
#   STOCK_CMAKE_FLAGS="-DX=Y ..."        extra CMake flags (part of the cache key)
#   STOCK_TARGETS="..."                   build targets (executables, or libraries such as ggml-rpc)
# Needs python3 (pip download), cmake, a C/C++ compiler; ninja when there is one, else make (macOS
# has make with the Command Line Tools). cmake from scripts/build-deps.sh's tools directory too.
# Portable: bash 3.2 and BSD tools (macOS).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PROTO="${STOCK_PROTO:-7}"
case "$PROTO" in
  7) PKG=llama-cpp-python; VERSION=0.3.36; DIST=llama_cpp_python; TREE=vendor/llama.cpp
     DEFAULT_TARGETS="ggml-rpc-server llama-completion llama-bench llama-server test-backend-ops" ;;
  8) PKG=xllamacpp; VERSION=2026.10.11549; DIST=xllamacpp; TREE=thirdparty/llama.cpp
     DEFAULT_TARGETS="ggml-rpc-server llama-completion llama-server" ;;
  *) echo "stock-llama: STOCK_PROTO must be 7 or 8, not '$PROTO'" >&2; exit 2 ;;
esac
RDMA="${STOCK_RDMA:-OFF}"
EXTRA_FLAGS="${STOCK_CMAKE_FLAGS:-}"
# The plain native build (no RDMA, no extra flags) always carries the patch that lets
# test-backend-ops reach RPC servers (it changes only tests/test-backend-ops.cpp): one build then
# serves the tools and the op suite (scripts/test-backend-ops.sh), instead of two.
if [ -z "${STOCK_PATCHES+x}" ] && [ "$PROTO" = 7 ] && [ "$RDMA" = OFF ] && [ -z "$EXTRA_FLAGS" ]; then
  PATCHES="patches/test-backend-ops-rpc.patch"
else
  PATCHES="${STOCK_PATCHES:-}"
fi
TARGETS="${STOCK_TARGETS:-$DEFAULT_TARGETS}"
cache="${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}"
if [ -d "$cache/bin" ]; then PATH="$cache/bin:$PATH"; fi
sha256() { if command -v sha256sum >/dev/null; then sha256sum; else shasum -a 256; fi; }
jobs="$(getconf _NPROCESSORS_ONLN 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)"
key="rdma-${RDMA}"
if [ -n "$PATCHES$EXTRA_FLAGS" ]; then
  key="$key-$( (cd "$here" && cat $PATCHES; echo "$EXTRA_FLAGS") | sha256 | cut -c1-12)"
fi
base="$cache/$PKG-$VERSION"
src="$base/src-$key"
build="$src/build"
log() { echo "stock-llama: $*" >&2; }

mkdir -p "$base"
sdist="$base/$DIST-$VERSION.tar.gz"
if [ ! -s "$sdist" ]; then
  log "downloading sdist $PKG==$VERSION"
  tmp="$(mktemp -d)"
  python3 -m pip download -q --no-deps --no-binary "$PKG" "$PKG==$VERSION" -d "$tmp" >&2
  mv "$tmp/$DIST-$VERSION.tar.gz" "$sdist.part" && mv "$sdist.part" "$sdist"
  rm -rf "$tmp"
fi
if [ ! -f "$src/.unpacked" ]; then
  log "unpacking into $src"
  rm -rf "$src" "$src.tmp"; mkdir -p "$src.tmp"
  tar xzf "$sdist" -C "$src.tmp" "$DIST-$VERSION/$TREE"
  mv "$src.tmp/$DIST-$VERSION/$TREE" "$src"; rm -rf "$src.tmp"
  rm -f "$src/.git"
  for p in $PATCHES; do log "applying $p"; patch -d "$src" -p1 < "$here/$p" >&2; done
  touch "$src/.unpacked"
fi
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  if command -v ninja >/dev/null; then gen=Ninja; else gen="Unix Makefiles"; fi
  log "configuring (GGML_RPC_RDMA=$RDMA, $gen)"
  cmake -S "$src" -B "$build" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DGGML_RPC=ON -DGGML_RPC_RDMA="$RDMA" \
    -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=ON -DGGML_CCACHE=OFF $EXTRA_FLAGS >&2
fi
missing=""
for t in $TARGETS; do
  [ -x "$build/bin/$t" ] || [ -e "$build/bin/lib$t.so" ] || [ -e "$build/bin/lib$t.dylib" ] || missing="$missing $t"
done
if [ -n "$missing" ]; then
  log "building$missing (protocol $PROTO; about 12 minutes on 2 cores the first time)"
  cmake --build "$build" -j "$jobs" --target $missing >&2
fi
echo "$build/bin"
