#!/bin/bash
# Runs inside the soft-RoCE VM (tests/vm/run-in-vm.sh): the rdma-verbs
# binding's pingpong example against real verbs on rxe0 (RC and UC, 64 B and
# 28 KiB), next to rdma-core's ibv_rc_pingpong / ibv_uc_pingpong with the
# same sizes and iteration count.
#
#   tests/vm/cargo-vm.sh build --release -p rdma-verbs --examples   (x86-64-v3, target/vm)
#   tests/vm/run-in-vm.sh tests/vm/rdma-verbs-pingpong.sh [ITERS [REPS [MODE]]]
#
# ITERS (200) round trips per run; REPS (1) runs per configuration, ibv and
# ours alternating, medians compared; MODE busy (default: both sides
# busy-poll, like ibv_*_pingpong without -e), events (completion channel:
# ibv_*_pingpong -e vs pingpong --events) or both.  TCG timings are noisy
# (the 4 ms scheduler tick, other load on the host): use REPS >= 3 for
# numbers, e.g. RVM_TIMEOUT=900 ... rdma-verbs-pingpong.sh 200 5 both.
#
# Env: RV_BIN (dir with the built examples; default <repo>/target/vm/release/examples).
set -u
ITERS=${1:-200}
REPS=${2:-1}
MODE=${3:-busy}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${RV_BIN:-$REPO/target/vm/release/examples}
fail=0
declare -A T   # key -> " usec usec ..." (client side, one per rep)
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{ if (NR==0) print "NA"; else if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2 }'; }
case "$MODE" in busy) MODES=busy ;; events) MODES=events ;; both) MODES="busy events" ;; *) echo "bad MODE $MODE"; exit 2 ;; esac

ibv_pp() { # mode qp size
    local mode=$1 qp=$2 size=$3 port=$((18600 + RANDOM % 1000)) e=()
    [ "$mode" = events ] && e=(-e)
    timeout 60 ibv_${qp}_pingpong "${e[@]}" -d rxe0 -g 1 -s "$size" -n "$ITERS" -p "$port" > /tmp/ibv-srv.log 2>&1 &
    local spid=$!
    local out rc src try
    for try in $(seq 100); do   # until the server listens
        sleep 0.2
        out=$(timeout 60 ibv_${qp}_pingpong "${e[@]}" -d rxe0 -g 1 -s "$size" -n "$ITERS" -p "$port" 127.0.0.1 2>&1); rc=$?
        echo "$out" | grep -q "Couldn't connect" || break
    done
    wait "$spid"; src=$?
    echo "$out" | grep iters | sed 's/^/    /'
    if [ $rc -ne 0 ] || [ $src -ne 0 ]; then
        echo "    ibv_${qp}_pingpong FAILED (client rc=$rc server rc=$src)"; echo "$out" | sed 's/^/    cli: /'
        sed 's/^/    srv: /' /tmp/ibv-srv.log; fail=1; return
    fi
    T[ibv-$mode-$qp-$size]+=" $(echo "$out" | sed -n 's/.* = \([0-9.]*\) usec\/iter/\1/p')"
}

rv_pp() { # mode qp size
    local mode=$1 qp=$2 size=$3 port=$((19600 + RANDOM % 1000)) e=()
    [ "$mode" = events ] && e=(--events)
    local out rc
    out=$(timeout 60 "$BIN/pingpong" --both --ip 10.77.0.1 --qp "$qp" --size "$size" --iters "$ITERS" \
          --port "$port" --timeout-secs 50 "${e[@]}" 2>&1); rc=$?
    echo "$out" | grep -E '^client|^pingpong' | sed 's/^/    /'
    if [ $rc -ne 0 ]; then echo "    rdma-verbs pingpong FAILED (rc=$rc)"; echo "$out" | sed 's/^/    /'; fail=1; return; fi
    T[rv-$mode-$qp-$size]+=" $(echo "$out" | sed -n 's/^RESULT side=client .*usec_per_iter=\([0-9.]*\)$/\1/p')"
}

echo "== ibv_devices"; ibv_devices || fail=1
echo "== devinfo (rdma_verbs::devices + find_gid_for_ip)"
"$BIN/devinfo" 10.77.0.1 127.0.0.1 > /tmp/devinfo.log 2>&1 || fail=1
cat /tmp/devinfo.log
grep -q 'match 10.77.0.1: dev=rxe0 port=1 gid=1 RoCEv2' /tmp/devinfo.log || { echo "find_gid_for_ip mismatch"; fail=1; }

for rep in $(seq 1 "$REPS"); do
    for mode in $MODES; do
        for qp in rc uc; do
            for size in 64 28672; do
                echo "== [rep $rep/$REPS, $mode] ibv_${qp}_pingpong -d rxe0 -g 1 -s $size -n $ITERS"; ibv_pp $mode $qp $size
                echo "== [rep $rep/$REPS, $mode] rdma-verbs pingpong --qp $qp --size $size --iters $ITERS"; rv_pp $mode $qp $size
            done
        done
    done
done
if [ "$MODE" = busy ]; then
    # Functional check of the completion-channel path (CompChannel, req_notify, events).
    for qp in rc uc; do
        echo "== rdma-verbs pingpong --qp $qp --size 4096 --events"; rv_pp events $qp 4096
    done
fi

echo "== rxe counters"
rdma statistic show link rxe0/1 | tr ' ' '\n' | awk '/^(sent_pkts|rcvd_pkts|rdma_sends|rdma_recvs|retry_exceeded_err|rcvd_seq_err)$/{k=$1; getline; printf "    %s %s\n", k, $1}'

echo
echo "== summary: client usec/iter, median of $REPS run(s) x $ITERS round trips (TCG: compare ratios only)"
printf '    %-6s %-4s %6s %13s %13s %6s   %s\n' mode qp size ibv_pingpong rdma-verbs ratio "per-run ibv | rdma-verbs"
for mode in $MODES; do
    for qp in rc uc; do
        for size in 64 28672; do
            k=$mode-$qp-$size
            a=$(echo "${T[ibv-$k]:-}" | median) b=$(echo "${T[rv-$k]:-}" | median)
            r=NA; [ "$a" != NA ] && [ "$b" != NA ] && r=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", b/a}')
            printf '    %-6s %-4s %6s %13s %13s %6s  %s |%s\n' "$mode" "$qp" "$size" "$a" "$b" "$r" "${T[ibv-$k]:-}" "${T[rv-$k]:-}"
        done
    done
done
[ "$MODE" = busy ] && echo "    events check (4096 B): rc${T[rv-events-rc-4096]:- FAILED} uc${T[rv-events-uc-4096]:- FAILED} usec/iter"
[ $fail -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit $fail
