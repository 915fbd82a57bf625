#!/bin/bash
# Runs inside the soft-RoCE VM (see benches/rdma_pingpong_vm.sh): our RDMA transport's
# request/response round trip vs rdma-core's ibv_rc_pingpong / ibv_uc_pingpong, same device
# (rxe0), same sizes, same iteration count. Prints a markdown table with the ratio ours/ibv.
set -u
ITERS=${PP_ITERS:-300}
EX=$PP_EXAMPLE
ADDR=10.77.0.1
declare -A R
ibv() { # rc|uc size
    local port=$((18500 + RANDOM % 1000))
    timeout 120 ibv_$1_pingpong -d rxe0 -g 1 -s $2 -n $ITERS -p $port > /tmp/ibv-srv.log 2>&1 &
    local sp=$!; sleep 0.5
    local out; out=$(timeout 120 ibv_$1_pingpong -d rxe0 -g 1 -s $2 -n $ITERS -p $port 127.0.0.1 2>&1)
    wait $sp
    echo "$out" | sed -n 's/.* = \([0-9.]*\) usec\/iter/\1/p'
}
ours() { # rc|uc size
    local port=$((19500 + RANDOM % 1000))
    timeout 120 "$EX" server $ADDR:$port $1 > /tmp/pp-srv.log 2>&1 &
    local sp=$!; sleep 0.5
    local out; out=$(timeout 120 "$EX" client $ADDR:$port $1 $2 $ITERS 2>&1)
    wait $sp
    echo "$out" | sed -n 's/.*: \([0-9.]*\) usec\/iter/\1/p'
}
echo "| flavor | size | ibv_*_pingpong (us/iter) | ours (us/iter) | ratio ours/ibv |"
echo "|---|---|---|---|---|"
for fl in rc uc; do
    for size in 64 28672; do
        a=$(ibv $fl $size); b=$(ours $fl $size)
        r=$(awk -v a="$a" -v b="$b" 'BEGIN{ if (a>0 && b>0) printf "%.2f", b/a; else print "n/a" }')
        echo "| $fl | $size | ${a:-fail} | ${b:-fail} | $r |"
    done
done
