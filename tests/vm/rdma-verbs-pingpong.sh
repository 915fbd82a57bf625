#!/bin/bash
# Runs inside the soft-RoCE VM (tests/vm/run-in-vm.sh): the rdma-verbs
# binding against real verbs on rxe0, RC and UC, 64 B and 28 KiB, compared
# with rdma-core's ibv_rc_pingpong / ibv_uc_pingpong on the same sizes and
# iteration count.
#
#   tests/vm/cargo-vm.sh build --release -p rdma-verbs --examples   (x86-64-v3, target/vm)
#   tests/vm/run-in-vm.sh tests/vm/rdma-verbs-pingpong.sh [ITERS]
#
# Env: RV_BIN (dir with the built examples; default <repo>/target/vm/release/examples),
#      RV_TEST_BIN (rdma-verbs integration test binary; run when set).
set -u
ITERS=${1:-200}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${RV_BIN:-$REPO/target/vm/release/examples}
fail=0
declare -A T

ibv_pp() { # qp size -> usec/iter of the client
    local qp=$1 size=$2 port=$((18600 + RANDOM % 1000))
    timeout 60 ibv_${qp}_pingpong -d rxe0 -g 1 -s "$size" -n "$ITERS" -p "$port" > /tmp/ibv-srv.log 2>&1 &
    local spid=$!
    sleep 0.5
    local out
    out=$(timeout 60 ibv_${qp}_pingpong -d rxe0 -g 1 -s "$size" -n "$ITERS" -p "$port" 127.0.0.1 2>&1)
    local rc=$?
    wait "$spid"; local src=$?
    echo "$out" | sed 's/^/    /'
    if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
        echo "    ibv_${qp}_pingpong FAILED (client rc=$rc server rc=$src)"; sed 's/^/    srv: /' /tmp/ibv-srv.log; fail=1
        T[ibv-$qp-$size]=NA; return
    fi
    T[ibv-$qp-$size]=$(echo "$out" | sed -n 's/.* = \([0-9.]*\) usec\/iter/\1/p')
}

rv_pp() { # qp size [extra args] -> usec/iter of the client
    local qp=$1 size=$2; shift 2
    local key=rv-$qp-$size${1:+-events}
    local port=$((19600 + RANDOM % 1000))
    local out
    out=$(timeout 60 "$BIN/pingpong" --both --ip 10.77.0.1 --qp "$qp" --size "$size" --iters "$ITERS" \
          --port "$port" --timeout-secs 50 "$@" 2>&1)
    local rc=$?
    echo "$out" | sed 's/^/    /'
    if [ $rc -ne 0 ]; then echo "    rdma-verbs pingpong FAILED (rc=$rc)"; fail=1; T[$key]=NA; return; fi
    T[$key]=$(echo "$out" | sed -n 's/^RESULT side=client .*usec_per_iter=\([0-9.]*\)$/\1/p')
}

echo "== ibv_devices"; ibv_devices || fail=1
echo "== devinfo (rdma_verbs::devices + find_gid_for_ip)"
"$BIN/devinfo" 10.77.0.1 127.0.0.1 || fail=1
"$BIN/devinfo" 10.77.0.1 | grep -q 'match 10.77.0.1: dev=rxe0 port=1 gid=1 RoCEv2' || { echo "find_gid_for_ip mismatch"; fail=1; }

for qp in rc uc; do
    for size in 64 28672; do
        echo "== ibv_${qp}_pingpong -s $size -n $ITERS"; ibv_pp $qp $size
        echo "== rdma-verbs pingpong --qp $qp --size $size --iters $ITERS"; rv_pp $qp $size
    done
done
echo "== rdma-verbs pingpong --qp rc --size 4096 --events (completion channel)"; rv_pp rc 4096 --events
echo "== rdma-verbs pingpong --qp uc --size 4096 --events (completion channel)"; rv_pp uc 4096 --events

if [ -n "${RV_TEST_BIN:-}" ]; then
    echo "== rdma-verbs integration tests (real device)"
    RDMA_VERBS_TEST_DEVICE=rxe0 RDMA_VERBS_TEST_IP=10.77.0.1 timeout 120 "$RV_TEST_BIN" --test-threads=1 2>&1 | sed 's/^/    /'
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail=1
fi

echo "== rxe counters"; rdma statistic show link rxe0/1 | tr ' ' '\n' | grep -A1 -E '^(sent_pkts|rcvd_pkts|rdma_sends|rdma_recvs)$' | paste - - | grep -v -- '--' | sed 's/^/    /'

echo
echo "== summary: client usec/iter, $ITERS iterations (TCG: compare ratios only)"
printf '    %-4s %7s %12s %12s %7s\n' qp size ibv_pingpong rdma-verbs ratio
for qp in rc uc; do
    for size in 64 28672; do
        a=${T[ibv-$qp-$size]:-NA} b=${T[rv-$qp-$size]:-NA}
        r=NA; [ "$a" != NA ] && [ "$b" != NA ] && [ -n "$a" ] && [ -n "$b" ] && r=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}')
        printf '    %-4s %7s %12s %12s %7s\n' "$qp" "$size" "$a" "$b" "$r"
    done
done
echo "    events mode (4096 B): rc ${T[rv-rc-4096-events]:-NA} uc ${T[rv-uc-4096-events]:-NA} usec/iter"
[ $fail -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit $fail
