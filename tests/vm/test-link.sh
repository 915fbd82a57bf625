#!/usr/bin/env bash
# Host driver of the tensor-split link suite: builds what the VM needs (our rpc-server and
# rpc-shim for the VM's CPU, stock llama.cpp 8.0.0 with RDMA: its server and llama-completion, a
# small synthetic model), then runs tests/vm/link-e2e.sh in the soft-RoCE VM: a stock 8.0
# client's tensor split over two servers whose server-to-server link goes over RDMA (ours x2
# with the lean framing, ours with a stock RDMA-built server in either rank, through rpc-shim),
# text identical to two stock servers, the link's TCP socket idle after set-up.
# The results table lands in $LINK_OUT (default target/link-vm) too.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
# The VM emulates an x86-64-v3 CPU (no AVX-512): build everything it runs for that.
VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export RVM_CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/target-vm}
echo "test-link: building rpc-server and rpc-shim for the VM" >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-server -p rpc-shim >&2
# The same build as test-rdma.sh's 8.0 client (one cache key), with its server as well.
STOCK8=$(STOCK_PROTO=8 STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion" scripts/stock-llama.sh)
MODELS=${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models/synth
python3 tests/e2e/synth_models.py "$MODELS" >/dev/null
MODEL="$MODELS/synth-llama-f16.gguf"
[ -s "$MODEL" ] || { echo "test-link: no model at $MODEL" >&2; exit 1; }
export E2E_SERVER="$RVM_CARGO_TARGET_DIR/release/rpc-server" E2E_SHIM="$RVM_CARGO_TARGET_DIR/release/rpc-shim"
export E2E_STOCK8_BIN="$STOCK8" E2E_MODEL="$MODEL" E2E_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
export RVM_ARTIFACTS=${LINK_OUT:-$ROOT/target/link-vm}
mkdir -p "$RVM_ARTIFACTS"
RVM_PASS_ENV="E2E_SERVER E2E_SHIM E2E_STOCK8_BIN E2E_MODEL E2E_N E2E_COMMIT E2E_ONLY RPC_RDMA_SPIN_MS" RVM_TIMEOUT=${RVM_TIMEOUT:-1200} \
    exec tests/vm/run-in-vm.sh tests/vm/link-e2e.sh
