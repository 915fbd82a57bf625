#!/usr/bin/env bash
# What building and running rpc-server needs, per OS, and nothing else (the test suite's extra
# packages are in scripts/deps.sh). Idempotent: each step is skipped when its tool is present.
# Installs what it can; for anything else it prints the exact command and exits 1.
#
#   Linux (apt): a C/C++ toolchain, cmake, libclang (bindgen), pkg-config, the verbs headers
#                (libibverbs-dev; the library itself is loaded at run time), rustup's cargo.
#   macOS:       the Command Line Tools (SDK 26.2+ for RDMA over Thunderbolt; older SDKs build
#                without RDMA, said in one line), cmake (Homebrew, else pip), rustup's cargo.
#
# RPC_DEPS_DRY_RUN=1 prints what would be installed instead of installing it.
set -euo pipefail
say() { echo "build-deps: $*" >&2; }
run() { if [ "${RPC_DEPS_DRY_RUN:-0}" = 1 ]; then say "would run: $*"; else "$@"; fi; }
missing_cargo() {
  say "cargo not found. Install Rust with rustup (https://rustup.rs), then open a new shell:"
  say "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
  exit 1
}

os="$(uname -s)"
case "$os" in
Linux)
  need=()
  command -v cc >/dev/null && command -v c++ >/dev/null || need+=(build-essential)
  command -v cmake >/dev/null || need+=(cmake)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  if command -v dpkg >/dev/null; then
    dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
    dpkg -s libibverbs-dev >/dev/null 2>&1 || need+=(libibverbs-dev)
  fi
  if [ ${#need[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null; then
      say "apt-get install ${need[*]}"
      export DEBIAN_FRONTEND=noninteractive
      SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
      run $SUDO apt-get update -qq
      run $SUDO apt-get install -y -qq "${need[@]}"
    else
      say "missing: ${need[*]} (Debian package names); install the equivalents with your package manager:"
      say "  a C/C++ compiler, cmake, pkg-config, libclang, the rdma-core verbs headers (infiniband/verbs.h)"
      exit 1
    fi
  fi
  command -v cargo >/dev/null || missing_cargo
  ;;
Darwin)
  if ! xcode-select -p >/dev/null 2>&1; then
    say "the Xcode Command Line Tools are not installed. Run, then try again:"
    say "  xcode-select --install"
    exit 1
  fi
  sdk="$(xcrun --sdk macosx --show-sdk-version 2>/dev/null || echo 0)"
  major="${sdk%%.*}"; rest="${sdk#*.}"; minor="${rest%%.*}"
  [ "$rest" = "$sdk" ] && minor=0
  if [ "${major:-0}" -gt 26 ] || { [ "${major:-0}" -eq 26 ] && [ "${minor:-0}" -ge 2 ]; }; then
    say "macOS SDK $sdk: RDMA over Thunderbolt available"
  else
    say "macOS SDK $sdk is older than 26.2: building without RDMA (TCP only); update the Command Line Tools for RDMA"
  fi
  if ! command -v cmake >/dev/null; then
    if command -v brew >/dev/null; then
      say "brew install cmake"
      run brew install cmake
    elif command -v python3 >/dev/null; then
      say "python3 -m pip install --user cmake (no Homebrew)"
      run python3 -m pip install --user -q cmake
      say "if cmake is still not found, add Python's user bin directory to PATH: $(python3 -m site --user-base 2>/dev/null)/bin"
    else
      say "cmake not found and neither Homebrew nor python3 is available. Install Homebrew (https://brew.sh), then:"
      say "  brew install cmake"
      exit 1
    fi
  fi
  command -v cargo >/dev/null || missing_cargo
  ;;
*)
  say "unsupported OS '$os': build rpc-server by hand with cargo (needs cmake and a C/C++ toolchain)"
  exit 1
  ;;
esac
