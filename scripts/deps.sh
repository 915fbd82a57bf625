#!/usr/bin/env bash
# Installs the system and Python packages the build and the tests need on a fresh Debian 12.
# Idempotent: each step is skipped when its tool is already present.
set -euo pipefail
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v cc >/dev/null || need_apt+=(build-essential)
dpkg -s libclang-dev >/dev/null 2>&1 || need_apt+=(libclang-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# RDMA: verbs headers for the binding (the library itself is loaded at run time), and what the
# soft-RoCE VM suite needs (tests/vm/): QEMU, busybox, cpio, kmod, rdma-core and its tools.
for p in libibverbs-dev rdma-core ibverbs-providers ibverbs-utils qemu-system-x86 busybox-static cpio kmod iproute2; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
python3 -c "import gguf, numpy" 2>/dev/null || python3 -m pip install -q "gguf==0.19.0" numpy
