#!/usr/bin/env bash
# Host driver of `rpc-bench allreduce` over RDMA in the soft-RoCE VM: builds rpc-bench and
# rpc-server for the VM's CPU and the stock 8.0.0 RDMA server, then runs
# rpc-bench/vm/allreduce-rdma.sh in the VM. The report lands in $ALLREDUCE_OUT
# (default target/allreduce-vm): allreduce-rdma.md, allreduce-rdma.csv, the servers' logs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export RVM_CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/target-vm}
echo "allreduce-vm: building rpc-server and rpc-bench for the VM" >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-server -p rpc-bench >&2
tests/vm/cargo-vm.sh build --release -q -p rpc-transport --example link_pingpong >&2
STOCK8=$(STOCK_PROTO=8 STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion" scripts/stock-llama.sh)
export RB_PINGPONG="$RVM_CARGO_TARGET_DIR/release/examples/link_pingpong"
export RB_BENCH="$RVM_CARGO_TARGET_DIR/release/rpc-bench" RB_SERVER="$RVM_CARGO_TARGET_DIR/release/rpc-server" RB_STOCK8="$STOCK8"
export RB_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
export RVM_ARTIFACTS=${ALLREDUCE_OUT:-$ROOT/target/allreduce-vm}
mkdir -p "$RVM_ARTIFACTS"
RVM_PASS_ENV="RB_PINGPONG RB_BENCH RB_SERVER RB_STOCK8 RB_ITERS RB_PP_REPS RB_COMMIT RPC_RDMA_SPIN_MS" RVM_TIMEOUT=${RVM_TIMEOUT:-3600} \
    exec tests/vm/run-in-vm.sh rpc-bench/vm/allreduce-rdma.sh
