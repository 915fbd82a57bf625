#!/bin/bash
# `rpc-bench latency --transport rdma` against our rpc-server (RC and UC flavors) and the stock
# RDMA ggml-rpc-server (RC) inside the soft-RoCE VM (rxe0 on 10.77.0.1); checks the client-role
# negotiation, not timings (everything is emulated under TCG: milliseconds per round trip).
# Run from the repository root:
#   export RVM_CARGO_TARGET_DIR=$HOME/.cache/ggml-rpc-rs/target-vm
#   tests/vm/cargo-vm.sh build --release -p rpc-bench -p rpc-server
#   VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
#   export RB_STOCK=$(STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion" scripts/stock-llama.sh)
#   export RB_BENCH=$RVM_CARGO_TARGET_DIR/release/rpc-bench RB_SERVER=$RVM_CARGO_TARGET_DIR/release/rpc-server
#   RVM_PASS_ENV="RB_BENCH RB_SERVER RB_STOCK" tests/vm/run-in-vm.sh rpc-bench/vm/latency-rdma.sh
set -u
B=$RB_BENCH; SRV=$RB_SERVER; STOCK=$RB_STOCK
cd /tmp
RPC_LOG=info $SRV -H 10.77.0.1 -p 50052 -t 1 > /tmp/ours.log 2>&1 &
$STOCK/ggml-rpc-server -H 10.77.0.1 -p 50053 > /tmp/stock.log 2>&1 &
sleep 3
echo "=== RC flavor: ours and stock"
timeout 180 $B latency --server ours=10.77.0.1:50052 --server stock=10.77.0.1:50053 --transport rdma --rdma-flavor rc \
   --links none,tb5-rdma --sizes 4096,28672,1048576 --iterations 20 --warmup 2 --rounds 1 --no-progress
echo "rc-rc=$?"
echo "=== UC flavor: ours"
timeout 180 $B latency --server ours=10.77.0.1:50052 --transport rdma --rdma-flavor uc \
   --links none --sizes 4096,28672,1048576 --iterations 20 --warmup 2 --rounds 1 --no-progress
echo "rc-uc=$?"
echo "=== TCP for comparison"
timeout 180 $B latency --server ours=10.77.0.1:50052 --server stock=10.77.0.1:50053 --links none --sizes 4096,28672,1048576 --iterations 20 --warmup 2 --rounds 1 --no-progress
echo "rc-tcp=$?"
echo "=== server logs"
grep -i rdma /tmp/ours.log | head -20
grep -i rdma /tmp/stock.log | head -10
rdma statistic show link rxe0/1 2>/dev/null | head -3
