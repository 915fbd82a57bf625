#!/usr/bin/env bash
# Host driver of the RDMA end-to-end suite: builds what the VM needs (our server for the
# VM's CPU, stock llama.cpp 7.0.0 and 8.0.0 with RDMA, the Apple-flavor libggml-rpc patched to build on
# rdma-core, a small synthetic model), then runs tests/vm/rdma-e2e.sh in the soft-RoCE VM.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# The VM emulates an x86-64-v3 CPU (no AVX-512): build everything it runs for that.
VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
# Built outside the clone so CI (a fresh clone on the same machine) reuses the ggml build.
export RVM_CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/target-vm}
echo "test-rdma: building rpc-server for the VM" >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-server >&2
STOCK=$(STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion" scripts/stock-llama.sh)
# Stock llama.cpp 8.0.0 (October 2026 on) with RDMA, for the 8.0 client case.
STOCK8=$(STOCK_PROTO=8 STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="llama-completion" scripts/stock-llama.sh)
APPLE=$(STOCK_RDMA=ON STOCK_PATCHES="patches/apple-uc-flavor-on-linux.patch" \
        STOCK_CMAKE_FLAGS="$VMFLAGS -DGGML_RPC_RDMA_APPLE_ON_LINUX=ON" STOCK_TARGETS="ggml-rpc" scripts/stock-llama.sh)
MODELS=${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models/synth
python3 tests/e2e/synth_models.py "$MODELS" >/dev/null
MODEL="$MODELS/synth-llama-f16.gguf"
[ -s "$MODEL" ] || { echo "test-rdma: no model at $MODEL" >&2; exit 1; }
export E2E_SERVER="$RVM_CARGO_TARGET_DIR/release/rpc-server" E2E_STOCK_BIN="$STOCK" E2E_STOCK8_BIN="$STOCK8" E2E_APPLE_LIB="$APPLE" E2E_MODEL="$MODEL"
RVM_PASS_ENV="E2E_SERVER E2E_STOCK_BIN E2E_STOCK8_BIN E2E_APPLE_LIB E2E_MODEL E2E_N RPC_RDMA_SPIN_MS RPC_RDMA_NO_EVENTS" RVM_TIMEOUT=${RVM_TIMEOUT:-600} \
    exec tests/vm/run-in-vm.sh tests/vm/rdma-e2e.sh
