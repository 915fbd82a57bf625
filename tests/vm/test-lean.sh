#!/usr/bin/env bash
# Host driver of the lean-framing measurement: builds what the VM needs (our server, the
# lean_relay example and, when present, rpc-shim for the VM's CPU; stock llama.cpp with RDMA;
# the Apple-flavor libggml-rpc; a small synthetic model), then runs tests/vm/lean-e2e.sh in the
# soft-RoCE VM. The per-token table lands in $LEAN_OUT (default target/lean-vm) too.
#   E2E_RELAY_ONLY=1: measure (b) with the lean_relay example even if rpc-shim is built;
#   E2E_SHIM=<path>: use that rpc-shim binary (built for the VM's CPU).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export RVM_CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/target-vm}
echo "test-lean: building rpc-server and lean_relay for the VM" >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-server >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-transport --example lean_relay >&2
SHIM=${E2E_SHIM:-}   # a prebuilt rpc-shim for the VM (outside /tmp: the VM mounts a tmpfs there)
if [ -z "$SHIM" ] && [ -z "${E2E_RELAY_ONLY:-}" ] && [ -f rpc-shim/Cargo.toml ] && grep -q "lean" rpc-shim/src/upstream.rs 2>/dev/null; then
    echo "test-lean: building rpc-shim for the VM" >&2
    tests/vm/cargo-vm.sh build --release -q -p rpc-shim >&2 && SHIM="$RVM_CARGO_TARGET_DIR/release/rpc-shim"
fi
STOCK=$(STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion llama-server" scripts/stock-llama.sh)
APPLE=$(STOCK_RDMA=ON STOCK_PATCHES="patches/apple-uc-flavor-on-linux.patch" \
        STOCK_CMAKE_FLAGS="$VMFLAGS -DGGML_RPC_RDMA_APPLE_ON_LINUX=ON" STOCK_TARGETS="ggml-rpc" scripts/stock-llama.sh)
MODELS=${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models/synth
python3 tests/e2e/synth_models.py "$MODELS" >/dev/null
MODEL="$MODELS/synth-llama-f16.gguf"
[ -s "$MODEL" ] || { echo "test-lean: no model at $MODEL" >&2; exit 1; }
export E2E_SERVER="$RVM_CARGO_TARGET_DIR/release/rpc-server" E2E_STOCK_BIN="$STOCK" E2E_APPLE_LIB="$APPLE" E2E_MODEL="$MODEL"
export E2E_RELAY="$RVM_CARGO_TARGET_DIR/release/examples/lean_relay" E2E_SHIM="$SHIM"
export RVM_ARTIFACTS=${LEAN_OUT:-$ROOT/target/lean-vm}
mkdir -p "$RVM_ARTIFACTS"
RVM_PASS_ENV="E2E_SERVER E2E_STOCK_BIN E2E_APPLE_LIB E2E_MODEL E2E_RELAY E2E_SHIM E2E_SHORT E2E_LONG RPC_RDMA_SPIN_MS RPC_RDMA_NO_EVENTS" RVM_TIMEOUT=${RVM_TIMEOUT:-1200} \
    exec tests/vm/run-in-vm.sh tests/vm/lean-e2e.sh
