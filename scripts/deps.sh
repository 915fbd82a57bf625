#!/usr/bin/env bash
# Installs the system and Python packages the build and the tests need on a fresh Debian 12
# (the test suite is Linux-only: its RDMA suites run in a soft-RoCE QEMU VM).
# Idempotent: each step is skipped when its tool is already present.
set -euo pipefail
# What building the server needs (per OS) first; then what only the tests need.
"$(dirname "$0")/build-deps.sh"
# pip install PACKAGES... for the python3 the tests run with. A Python that refuses it (PEP 668:
# Homebrew's, "externally-managed-environment") gets them in the user's site directory instead,
# which it reads too: --user --break-system-packages (Homebrew's own packages are not touched).
pip_install() {
  local out
  if out="$(python3 -m pip install -q "$@" 2>&1)"; then return 0; fi
  case "$out" in
    *externally-managed-environment*)
      echo "deps: this python3 is externally managed (PEP 668): pip install --user --break-system-packages $*" >&2
      python3 -m pip install -q --user --break-system-packages "$@" ;;
    *) printf '%s\n' "$out" >&2; return 1 ;;
  esac
}
if [ "$(uname -s)" != Linux ]; then
  echo "deps: the test suite's system packages (QEMU, rdma-core, ...) are Linux-only; on $(uname -s) only the build dependencies were set up" >&2
  python3 -c "import gguf, numpy" 2>/dev/null || pip_install "gguf==0.19.0" numpy
  python3 -c "import check_jsonschema" 2>/dev/null || pip_install "check-jsonschema==0.39.0"
  exit 0
fi
need_apt=()
command -v ninja >/dev/null || need_apt+=(ninja-build)
# The soft-RoCE VM suite (tests/vm/): QEMU, busybox, cpio, kmod, rdma-core and its tools;
# iproute2 also for the dead-peer test's network namespace (tests/e2e/idle_e2e.py); curl for
# llama-server requests in the VM; systemd for `systemd-analyze verify` of the service unit
# (tests/scripts/test_service.py).
for p in rdma-core ibverbs-providers ibverbs-utils qemu-system-x86 busybox-static cpio kmod iproute2 curl systemd; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: apt-get install ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
python3 -c "import gguf, numpy" 2>/dev/null || pip_install "gguf==0.19.0" numpy
# The CI workflow's schema check (tests/scripts/test_workflow.py).
python3 -c "import check_jsonschema" 2>/dev/null || pip_install "check-jsonschema==0.39.0"
