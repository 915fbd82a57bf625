#!/usr/bin/env bash
# Benchmark (issue: RDMA transport): inside the soft-RoCE VM, our RDMA request/response round
# trip (rpc-transport's flavor framing + async driver + real verbs, example `rdma_pingpong`) vs
# rdma-core's ibv_rc_pingpong / ibv_uc_pingpong on the same rxe device, at 64 B and 28 KiB.
# TCG emulation makes absolute times meaningless: read the ratio (our software overhead).
#   benches/rdma_pingpong_vm.sh            (PP_ITERS=300 by default)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export RVM_CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/target-vm}
tests/vm/cargo-vm.sh build --release -q -p rpc-transport --example rdma_pingpong >&2
export PP_EXAMPLE="$RVM_CARGO_TARGET_DIR/release/examples/rdma_pingpong"
RVM_PASS_ENV="PP_EXAMPLE PP_ITERS" exec tests/vm/run-in-vm.sh benches/rdma_pingpong_in_vm.sh
