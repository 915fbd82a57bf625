#!/usr/bin/env bash
# What building and running rpc-server needs, per OS, and nothing else (the test suite's extra
# packages are in scripts/deps.sh). Idempotent: each step is skipped when its tool is present.
# Installs what it can; for anything else it prints the exact command and exits 1.
#
#   Linux (apt): a C/C++ toolchain, cmake, libclang (bindgen), pkg-config, the verbs headers
#                (libibverbs-dev; the library itself is loaded at run time), rustup's cargo.
#   macOS:       the Command Line Tools (SDK 26.2+ for RDMA over Thunderbolt; older SDKs build
#                without RDMA, said in one line), cmake, rustup's cargo. cmake: on PATH; else
#                Homebrew's (also when brew is not on PATH, as in a non-login SSH shell: looked
#                for in /opt/homebrew and /usr/local), installed with brew if brew exists; else
#                pip into a private venv (no `pip install --user`: a Homebrew Python refuses it,
#                PEP 668). A cmake found or installed off PATH is linked into TOOLS (below).
#
# TOOLS = ${RPC_CACHE_DIR:-~/.cache/ggml-rpc-rs}/bin: the build tools this script put there.
# scripts/run-server.sh and scripts/stock-llama.sh put it first on PATH; for cargo by hand:
#   export PATH="$HOME/.cache/ggml-rpc-rs/bin:$PATH"
# RPC_DEPS_DRY_RUN=1 prints what would be installed instead of installing it.
# RPC_BREW_PREFIXES (default "/opt/homebrew /usr/local"): where to look for Homebrew off PATH.
set -euo pipefail
say() { echo "build-deps: $*" >&2; }
run() { if [ "${RPC_DEPS_DRY_RUN:-0}" = 1 ]; then say "would run: $*"; else "$@"; fi; }
missing_cargo() {
  say "cargo not found. Install Rust with rustup (https://rustup.rs), then open a new shell:"
  say "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
  exit 1
}
cache="${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}"
tools="$cache/bin"
if [ -d "$tools" ]; then PATH="$tools:$PATH"; fi

# Links the executable $1 into TOOLS (so the build finds it without a PATH of its own).
link_tool() {
  mkdir -p "$tools"
  ln -sf "$1" "$tools/$(basename "$1")"
  PATH="$tools:$PATH"
  say "linked $1 into $tools (scripts/run-server.sh puts it on PATH)"
}

# cmake for macOS: see the header.
mac_cmake() {
  local p brew=""
  command -v cmake >/dev/null && return 0
  for p in ${RPC_BREW_PREFIXES:-/opt/homebrew /usr/local}; do
    if [ -x "$p/bin/cmake" ]; then link_tool "$p/bin/cmake"; return 0; fi
    if [ -z "$brew" ] && [ -x "$p/bin/brew" ]; then brew="$p/bin/brew"; fi
  done
  if command -v brew >/dev/null; then brew="$(command -v brew)"; fi
  if [ -n "$brew" ]; then
    say "brew install cmake"
    run "$brew" install cmake
    if [ "${RPC_DEPS_DRY_RUN:-0}" = 1 ] || command -v cmake >/dev/null; then return 0; fi
    p="$("$brew" --prefix)/bin/cmake"
    [ -x "$p" ] || { say "brew install cmake left no $p; install cmake and try again"; exit 1; }
    link_tool "$p"
  elif command -v python3 >/dev/null; then
    local venv="$cache/cmake-venv"
    say "no Homebrew: pip install cmake into a private venv, $venv"
    if [ "${RPC_DEPS_DRY_RUN:-0}" = 1 ]; then say "would run: python3 -m venv $venv; $venv/bin/python3 -m pip install cmake"; return 0; fi
    mkdir -p "$cache"
    [ -x "$venv/bin/python3" ] || python3 -m venv "$venv" || {
      say "python3 -m venv failed. Install cmake another way, then try again: Homebrew (https://brew.sh), then"
      say "  brew install cmake"
      exit 1
    }
    "$venv/bin/python3" -m pip install -q --disable-pip-version-check cmake
    [ -x "$venv/bin/cmake" ] || { say "pip left no $venv/bin/cmake"; exit 1; }
    link_tool "$venv/bin/cmake"
  else
    say "cmake not found and neither Homebrew nor python3 is available. Install Homebrew (https://brew.sh), then:"
    say "  brew install cmake"
    exit 1
  fi
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
  # Before anything else: without the Command Line Tools, /usr/bin/python3, cc and git are stubs
  # that only offer to install them.
  if ! xcode-select -p >/dev/null 2>&1; then
    say "the Xcode Command Line Tools are not installed. At the Mac's screen run, then try again:"
    say "  xcode-select --install"
    say "over SSH (nobody to click the dialog):"
    say "  touch /tmp/.com.apple.dt.CommandLineTools.installondemand.in-progress"
    say "  softwareupdate --list | grep 'Label: Command Line Tools'"
    say "  sudo softwareupdate --install 'Command Line Tools for Xcode-<the newest version listed>'"
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
  mac_cmake
  command -v cargo >/dev/null || missing_cargo
  ;;
*)
  say "unsupported OS '$os': build rpc-server by hand with cargo (needs cmake and a C/C++ toolchain)"
  exit 1
  ;;
esac
