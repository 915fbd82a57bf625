#!/bin/bash
# `rpc-bench allreduce` over RDMA in the soft-RoCE VM (rxe0, 10.77.0.1): per-allreduce time between
# two servers whose link negotiated RDMA (ours x2 lean over RC, ours x2 upstream RC with
# RPC_RDMA_LEAN=0, stock 8.0 RDMA x2, ours with stock in either rank), beside rdma-core's
# ibv_rc_pingpong of the same bytes on the same device (the raw verbs floor), and the link's own
# driver and framings alone (rpc-transport's link_pingpong example: BlockingLink, lean RC and
# upstream RC, the same bytes in an allreduce's order). Under TCG every
# figure is emulation time; the ratios between rows of one run are what it shows.
# Host side (builds, then boots the VM): rpc-bench/vm/allreduce-vm.sh.
# Env: RB_BENCH, RB_SERVER, RB_PINGPONG (the link_pingpong example), RB_STOCK8 (stock 8.0.0 RDMA bin dir), RB_ITERS (default 200), RB_PP_REPS (default 5),
#      RB_COMMIT; output in $RVM_OUT (allreduce-rdma.md, allreduce-rdma.csv).
set -u
B=$RB_BENCH; SRV=$RB_SERVER; STOCK=$RB_STOCK8
ITERS=${RB_ITERS:-200}
ADDR=10.77.0.1
OUT=${RVM_OUT:-/tmp/allreduce}; mkdir -p "$OUT"
W=/tmp/allreduce; mkdir -p $W
SIZES=2048,4096,8192,16384,32768,65536
PIDS=()
wait_port() { for _ in $(seq 150); do (exec 3<>/dev/tcp/$ADDR/$1) 2>/dev/null && return 0; sleep 0.2; done; return 1; }
ours() { # port [env...]
    local port=$1; shift
    env "$@" RPC_LOG=info "$SRV" -H $ADDR -p "$port" -t 1 > "$W/ours-$port.log" 2>&1 &
    PIDS+=($!); wait_port "$port"
}
stock() { "$STOCK/ggml-rpc-server" -H $ADDR -p "$1" -t 1 > "$W/stock-$1.log" 2>&1 & PIDS+=($!); wait_port "$1"; }

# Every pair on its own two ports (rank 0 listens on its port + 1000).
ours 50071; ours 50072                               # ours x2: lean over RC
ours 50073 RPC_RDMA_LEAN=0; ours 50074 RPC_RDMA_LEAN=0   # ours x2: upstream RC framing
stock 50075; stock 50076                             # stock x2
stock 50077; ours 50078                              # stock rank 0, ours rank 1
ours 50079; stock 50080                              # ours rank 0, stock rank 1
timeout 3000 "$B" allreduce --links none --sizes $SIZES --iterations "$ITERS" --warmup 20 --rounds 2 --batches 2 --no-progress \
    --pair "ours=$ADDR:50071,$ADDR:50072" --pair "ours-rc=$ADDR:50073,$ADDR:50074" --pair "stock=$ADDR:50075,$ADDR:50076" \
    --pair "stock-ours=$ADDR:50077,$ADDR:50078" --pair "ours-stock=$ADDR:50079,$ADDR:50080" \
    --md "$W/bench.md" --csv "$OUT/allreduce-rdma.csv" > "$W/bench.out" 2>&1
echo "rpc-bench allreduce exit $?"
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null
echo "links our servers joined:"
grep -h "joined pairwise comm" $W/ours-*.log | grep -o 'rank=[01] transport="[^"]*"' | sort | uniq -c

# A ping-pong tool's usec/iter: its server in the background, its client; both print "usec/iter".
pingpong() { # "server command" "client command"
    timeout 300 $1 > $W/pingpong-srv.log 2>&1 &
    local sp=$!; sleep 0.5
    local out; out=$(timeout 300 $2 2>&1)
    wait $sp
    echo "$out" | grep -oE '[0-9.]+ usec/iter' | cut -d' ' -f1
}
# The raw verbs floor, and the link's driver and framing alone (link_pingpong), same bytes.
ibv() { local p=$((18500 + RANDOM % 1000)) a="-d rxe0 -g 1 -s $1 -n $ITERS"; pingpong "ibv_rc_pingpong $a -p $p" "ibv_rc_pingpong $a -p $p 127.0.0.1"; }
pp() { local p=$((19500 + RANDOM % 1000)); pingpong "$RB_PINGPONG server $ADDR:$p $1" "$RB_PINGPONG client $ADDR:$p $1 $2 $ITERS"; }
# RB_PP_REPS runs of each, the three tools alternating, per size; the median run counts.
: > $W/pp-raw.txt
for rep in $(seq "${RB_PP_REPS:-5}"); do
    for n in ${SIZES//,/ }; do
        if [ "$n" -ge 32768 ]; then w=$((2 * n)); else w=$((4 * n)); fi   # bf16 from 32768 elements
        echo "$n $(ibv $w) $(pp lean-rc $w) $(pp rc $w)" >> $W/pp-raw.txt
    done
done
python3 - $W/pp-raw.txt $W/floor.txt $W/pp.txt <<'PY'
import statistics, sys
runs = {}
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 4:
        runs.setdefault(int(f[0]), []).append([float(x) for x in f[1:]])
# Emulated time drifts between runs: each run's ratio to the ibv run right before it is the
# figure; the median of those ratios is reported beside the median times.
with open(sys.argv[2], "w") as floor, open(sys.argv[3], "w") as pp:
    for n, rs in sorted(runs.items()):
        med = [statistics.median(r[i] for r in rs) for i in range(3)]
        ratio = [statistics.median(r[i] / r[0] for r in rs) for i in (1, 2)]
        floor.write(f"{n} {med[0]:.1f}\n")
        pp.write(f"{n} {med[1]:.1f} {med[2]:.1f} {ratio[0]:.2f} {ratio[1]:.2f}\n")
PY
echo "ping-pong runs (elements, ibv us, lean-rc us, rc us):"; cat $W/pp-raw.txt
echo "link_pingpong (elements, lean-rc us, rc us, lean ÷ ibv, rc ÷ ibv):"; cat $W/pp.txt

python3 - "$OUT/allreduce-rdma.csv" $W/floor.txt "${RB_COMMIT:-unknown}" $W/pp.txt > "$OUT/allreduce-rdma.md" <<'PY'
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1])))
floor = {int(l.split()[0]): float(l.split()[1]) for l in open(sys.argv[2]) if len(l.split()) == 2}
pp = {int(l.split()[0]): [float(x) for x in l.split()[1:]] for l in open(sys.argv[4]) if len(l.split()) == 5}
def col(r, *names):
    for k in r:
        if any(k.startswith(n) for n in names):
            return r[k]
    return ""
print("`rpc-bench allreduce` over RDMA in the soft-RoCE VM (QEMU TCG, 2 vCPUs, rxe0), build %s; median per allreduce," % sys.argv[3])
print("beside `ibv_rc_pingpong` of the same bytes on the same device (the raw verbs floor). Emulated time: compare rows, not")
print("absolute figures. Command: `rpc-bench/vm/allreduce-vm.sh`.")
print()
print("The link's driver and framing alone (`link_pingpong`: one message each way in an allreduce's order over")
print("`BlockingLink`), beside `ibv_rc_pingpong` of the same bytes; %s runs of the three tools, alternating: the times are" % os.environ.get("RB_PP_REPS", "5"))
print("medians, the ratios the median of each run's ratio to the `ibv_rc_pingpong` run just before it:")
print()
print("| elements | wire B each way | ibv_rc_pingpong us | lean RC us | lean ÷ ibv | upstream RC us | upstream RC ÷ ibv |")
print("|---|---|---|---|---|---|---|")
for n in sorted(pp):
    f = floor.get(n)
    lean, rc, lean_r, rc_r = pp[n]
    print("| %d | %d | %s | %.1f | %.2f | %.1f | %.2f |" % (n, 2 * n if n >= 32768 else 4 * n, "%.1f" % f if f else "?",
          lean, lean_r, rc, rc_r))
print()
print("Whole allreduces between two servers (tensor memory, bf16 rounding and the sum included):")
print()
print("| pair | link | elements | wire B each way | allreduce p50 us | p99 us | ibv_rc_pingpong us | vs floor | vs stock |")
print("|---|---|---|---|---|---|---|---|---|")
stock = {}
for r in rows:
    if col(r, "pair") == "stock":
        stock[col(r, "elements")] = float(col(r, "allreduce p50") or 0)
for r in rows:
    el = col(r, "elements"); n = int(el.split()[0])
    p50 = float(col(r, "allreduce p50") or 0)
    f = floor.get(n)
    s = stock.get(el)
    print("| %s | %s | %s | %d | %.1f | %s | %s | %s | %s |" % (
        col(r, "pair"), col(r, "link transport"), el, 2 * n if n >= 32768 else 4 * n, p50, col(r, "p99"),
        "%.1f" % f if f else "?", "%.2f" % (p50 / f) if f else "?", "%.2f" % (p50 / s) if s else "?"))
PY
cat "$OUT/allreduce-rdma.md"
cp $W/*.log "$OUT/" 2>/dev/null; cp $W/bench.out $W/bench.md "$OUT/" 2>/dev/null
