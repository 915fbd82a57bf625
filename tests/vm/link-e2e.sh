#!/bin/bash
# Runs inside the soft-RoCE VM (tests/vm/run-in-vm.sh), driven by tests/vm/test-link.sh.
# A stock llama.cpp 8.0.0 client (RDMA build) runs tensor split (-sm tensor) over two servers on
# rxe0 (10.77.0.1); the servers' own link (COMM_INIT, one allreduce per reduction point) must go
# over RDMA whenever both ends can:
#   stock x2 (the reference text), ours x2 (lean framing over RC, the default), ours x2 with
#   upstream's RC framing (RPC_RDMA_LEAN=0) and with the UC flavor (--comm-rdma-flavor uc, lean),
#   ours with a stock RDMA-built server as rank 0 and as rank 1 (upstream RC), ours x2 whose rank 1
#   cannot prepare a queue pair (the link falls back to TCP before any partial), ours x2 with the
#   link on TCP (--transport tcp: the baseline), and a TCP-only client through rpc-shim to two of
#   ours, and the same client through `rpc-shim --one-endpoint` (no pairwise link: the client
#   reduces with COPY_TENSORs, which go between the two workers over their LINK_* link). Every
#   text must equal stock x2's; our servers' logs name the link's transport and its
#   RDMA SENDs; the link's TCP socket (port A + 1000) carries nothing after the caps exchange
#   (sampled with ss while the client runs); rxe's counters move. A table of generation time per
#   token and link traffic goes to $RVM_OUT/link-e2e.md.
#
# Env (from the host): E2E_SERVER, E2E_SHIM, E2E_STOCK8_BIN (stock 8.0.0 RDMA build bin dir),
#   E2E_MODEL (synthetic llama), E2E_N (tokens, default 16), E2E_COMMIT (for the table),
#   E2E_ONLY (space-separated case names to run; stock x2 always runs).
set -u
N=${E2E_N:-16}
ADDR=10.77.0.1
A=50061
B=50062
SRV=$E2E_SERVER
BIN=$E2E_STOCK8_BIN
M=$E2E_MODEL
W=/tmp/link-e2e; mkdir -p $W
OUT=${RVM_OUT:-$W}; mkdir -p "$OUT"
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
want() { [ -z "${E2E_ONLY:-}" ] || [[ " $E2E_ONLY " == *" $1 "* ]]; }

sent_pkts() { rdma statistic show link rxe0/1 2>/dev/null | tr ' ' '\n' | awk 'p{print; exit} /^sent_pkts$/{p=1}'; }
wait_port() { for _ in $(seq 150); do (exec 3<>/dev/tcp/$ADDR/$1) 2>/dev/null && return 0; sleep 0.2; done; return 1; }

PIDS=()
start() { # name kind(ours|stock) port [env... --] [args...]
    local name=$1 kind=$2 port=$3; shift 3
    local envs=()
    if [[ " $* " == *" -- "* ]]; then
        while [ "$1" != "--" ]; do envs+=("$1"); shift; done
        shift
    fi
    if [ "$kind" = ours ]; then
        env "${envs[@]}" RPC_LOG=info "$SRV" -H $ADDR -p "$port" -t 1 "$@" > "$W/$name.log" 2>&1 &
    else
        env "${envs[@]}" "$BIN/ggml-rpc-server" -H $ADDR -p "$port" -t 1 "$@" > "$W/$name.log" 2>&1 &
    fi
    PIDS+=($!)
    wait_port "$port" || { bad "$name did not start"; tail -5 "$W/$name.log"; }
}
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done; PIDS=(); }

# The link's TCP socket: sampled while the client runs; the last sample is what crossed it. Rank
# 0's link port ($A + 1000) on the link's address: no other socket of a case may use that port
# (the shim case's listeners sit on 52061/52062 for that reason).
sample_link() { # outfile
    : > "$1"
    while true; do
        local l
        l=$(ss -tinH state established "( src $ADDR:$((A + 1000)) )" 2>/dev/null | tr '\n' ' ')
        [ -n "$l" ] && echo "$l" > "$1"
        sleep 0.3
    done
}
link_tcp_bytes() { # samplefile -> "sent received" of rank 0's side of the link
    local s r
    s=$(grep -o 'bytes_acked:[0-9]*' "$1" | head -1 | cut -d: -f2)
    r=$(grep -o 'bytes_received:[0-9]*' "$1" | head -1 | cut -d: -f2)
    echo "${s:-0} ${r:-0}"
}

gen() { # name endpoints [env...]
    local name=$1 rpc=$2; shift 2
    sample_link "$W/$name.ss" & local sampler=$!
    env "$@" GGML_NO_BACKTRACE=1 timeout 300 "$BIN/llama-completion" -m "$M" -p "hello world, the quick brown fox" \
        -n "$N" --temp 0 -s 1 -t 1 -ngl 99 --no-repack -c 256 -no-cnv --simple-io --ignore-eos --no-warmup -lv 4 \
        -sm tensor --rpc "$rpc" > "$W/$name.out" 2> "$W/$name.err" < /dev/null
    echo $? > "$W/$name.rc"
    kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
}
ms_per_token() { grep -E "perf_(context_)?print: +eval time" "$W/$1.err" | head -1 | grep -oE '[0-9.]+ ms per token' | cut -d' ' -f1; }

ROWS=()
# A case: its text against stock x2's, the link transport our servers' logs must name ("" = not
# checked), the link's TCP bytes after set-up, generation time; one row of the table.
judge() { # name want-transport rxe-packets logs...
    local name=$1 want=$2 pkts=$3; shift 3
    local rc; rc=$(cat "$W/$name.rc")
    if [ "$rc" != 0 ]; then bad "$name: client exit $rc"; tail -5 "$W/$name.err"; return; fi
    grep -q "pairwise communicator initialized" "$W/$name.err" && pass "$name: the client's pairwise communicator is up" \
        || { bad "$name: no pairwise communicator (the client reduced through itself)"; grep -i "comm\|rank" "$W/$name.err" | head -3; }
    if [ "$name" != stock2 ]; then
        cmp -s "$W/stock2.out" "$W/$name.out" && pass "$name: text identical to stock x2 ($(wc -c < "$W/$name.out") bytes)" \
            || { bad "$name: text differs from stock x2"; diff "$W/stock2.out" "$W/$name.out" | head -4; }
    fi
    local sends=0 f bytes=0 ars=0
    for f in "$@"; do
        # What crossed the link (one rank's log is enough: both sides send the same).
        if [ "$bytes" = 0 ]; then
            bytes=$(grep -o 'left pairwise comm.*' "$f" | grep -o 'bytes_each_way=[0-9]*' | cut -d= -f2 | awk '{t+=$1} END{print t+0}')
            ars=$(grep -o 'left pairwise comm.*' "$f" | grep -o 'allreduces=[0-9]*' | cut -d= -f2 | awk '{t+=$1} END{print t+0}')
        fi
        if [ -n "$want" ]; then
            grep "joined pairwise comm" "$f" | grep -qF -e "transport=\"$want\"" -e "transport=$want " && pass "$name: $(basename "$f" .log): link on $want" \
                || { bad "$name: $(basename "$f" .log): link not on $want"; grep -E "pairwise comm|comm link" "$f" | head -4; }
        fi
        local s; s=$(grep -o 'left pairwise comm.*' "$f" | grep -o 'rdma_sends=[0-9]*' | cut -d= -f2 | awk '{t+=$1} END{print t+0}')
        sends=$((sends + s))
    done
    # (no process substitution: the VM has no /dev/fd)
    local ls lr; set -- $(link_tcp_bytes "$W/$name.ss"); ls=$1 lr=$2
    local ms; ms=$(ms_per_token "$name")
    local per=""; [ "$bytes" -gt 0 ] && per=$((bytes / N))
    ROWS+=("| $name | ${want:-stock} | ${ms:-?} | ${ars:-?} / ${bytes:-?} (${per:-?}) | $ls / $lr | $sends | $pkts |")
    echo "    $name: ${ms:-?} ms/token; link TCP after set-up (rank 0 sent/received): $ls / $lr B; our link RDMA SENDs: $sends"
    if [ -n "$want" ] && [ "$want" != TCP ]; then
        [ "$ls" -le 25 ] && [ "$lr" -le 25 ] && pass "$name: the link's TCP socket carried only the caps exchange ($ls / $lr B)" \
            || bad "$name: $ls / $lr bytes on the link's TCP socket: partials went over TCP"
    fi
}

PKTS=""
count_pkts() { PKTS=$(( $(sent_pkts) - $1 )); }

echo "== stock x2 (stock 8.0.0 RDMA builds): the reference"
start sA stock $A; start sB stock $B
p0=$(sent_pkts); gen stock2 "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge stock2 "" "$PKTS"
grep -c "RDMA activated" "$W/sA.log" "$W/sB.log" | sed 's/^/    stock "RDMA activated" lines: /'
[ "$(cat $W/stock2.rc)" = 0 ] || { echo "== summary: FAILURES (no reference)"; exit 1; }

if want ours2; then
echo "== ours x2: the link in the lean framing over RC"
start oA ours $A; start oB ours $B
p0=$(sent_pkts); gen ours2 "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge ours2 "RDMA/RC+lean" "$PKTS" "$W/oA.log" "$W/oB.log"
fi

if want ours2-rc; then
echo "== ours x2, lean off (RPC_RDMA_LEAN=0): upstream's RC framing on the link"
start oA ours $A RPC_RDMA_LEAN=0 --; start oB ours $B RPC_RDMA_LEAN=0 --
p0=$(sent_pkts); gen ours2-rc "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge ours2-rc "RDMA/RC" "$PKTS" "$W/oA.log" "$W/oB.log"
fi

if want ours2-uc; then
echo "== ours x2, rank 1 offers the UC flavor (--comm-rdma-flavor uc): lean over UC"
start oA ours $A --comm-rdma-flavor uc; start oB ours $B --comm-rdma-flavor uc
p0=$(sent_pkts); gen ours2-uc "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge ours2-uc "RDMA/UC+lean" "$PKTS" "$W/oA.log" "$W/oB.log"
fi

if want stock0-ours1; then
echo "== stock rank 0 + ours rank 1: upstream RC on the link"
start sA stock $A; start oB ours $B
p0=$(sent_pkts); gen stock0-ours1 "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge stock0-ours1 "RDMA/RC" "$PKTS" "$W/oB.log"
fi

if want ours0-stock1; then
echo "== ours rank 0 + stock rank 1: upstream RC on the link"
start oA ours $A; start sB stock $B
p0=$(sent_pkts); gen ours0-stock1 "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge ours0-stock1 "RDMA/RC" "$PKTS" "$W/oA.log"
fi

if want fallback; then
echo "== ours x2, rank 1 cannot prepare a queue pair (--rdma-device no-such-device): it offers zero caps, the link stays on TCP"
start oA ours $A; start oB ours $B --rdma-device no-such-device
p0=$(sent_pkts); gen fallback "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge fallback "TCP" "$PKTS" "$W/oA.log" "$W/oB.log"
grep -q "RDMA cannot engage" "$W/oB.log" && pass "fallback: rank 1 logged why it offered TCP" || bad "fallback: no reason logged"
fi

if want ours2-tcp; then
echo "== ours x2 with --transport tcp: the link (and the client's connections) on TCP, the baseline"
start oA ours $A --transport tcp; start oB ours $B --transport tcp
p0=$(sent_pkts); gen ours2-tcp "$ADDR:$A,$ADDR:$B"; count_pkts "$p0"; stop_all
judge ours2-tcp "TCP" "$PKTS" "$W/oA.log" "$W/oB.log"
fi

if want shim; then
echo "== a TCP-only client (GGML_RPC_NO_RDMA) -> rpc-shim -> ours x2 over RDMA, the link lean over RC"
start oA ours $A; start oB ours $B
RPC_LOG=info "$E2E_SHIM" --worker $ADDR:$A --listen 127.0.0.1:52061 --worker $ADDR:$B --listen 127.0.0.1:52062 > "$W/shim.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/52062) 2>/dev/null && break; sleep 0.2; done
p0=$(sent_pkts); gen shim "127.0.0.1:52061,127.0.0.1:52062" GGML_RPC_NO_RDMA=1; count_pkts "$p0"; stop_all
judge shim "RDMA/RC+lean" "$PKTS" "$W/oA.log" "$W/oB.log"
grep -qi "rdma" "$W/shim.log" && grep -iE "lean|RDMA" "$W/shim.log" | head -2 | sed 's/^/    shim: /'
fi
if want one-endpoint; then
echo "== a TCP-only client -> rpc-shim --one-endpoint -> ours x2 over RDMA: the client's copies between the workers go over their own link (LINK_*), lean over RC"
start oA ours $A; start oB ours $B
RPC_LOG=info "$E2E_SHIM" --one-endpoint --worker $ADDR:$A --worker $ADDR:$B --listen 127.0.0.1:52063 > "$W/shim1.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/52063) 2>/dev/null && break; sleep 0.2; done
p0=$(sent_pkts); gen one "127.0.0.1:52063" GGML_RPC_NO_RDMA=1; count_pkts "$p0"; stop_all
if [ "$(cat "$W/one.rc")" != 0 ]; then bad "one-endpoint: client exit $(cat "$W/one.rc")"; tail -5 "$W/one.err"; else
    cmp -s "$W/stock2.out" "$W/one.out" && pass "one-endpoint: text identical to stock x2 ($(wc -c < "$W/one.out") bytes)" \
        || { bad "one-endpoint: text differs from stock x2"; diff "$W/stock2.out" "$W/one.out" | head -4; }
fi
for f in oA oB; do
    grep "LINK_OPEN: worker-to-worker link open" "$W/$f.log" | grep -qF -e 'transport="RDMA/RC+lean"' -e 'transport=RDMA/RC+lean ' \
        && pass "one-endpoint: $f: worker-to-worker link on RDMA/RC+lean" \
        || { bad "one-endpoint: $f: no worker-to-worker link on RDMA/RC+lean"; grep -E "LINK_|link" "$W/$f.log" | head -4; }
done
line=$(grep -o 'copies of this client connection.*' "$W/shim1.log" | tail -1)
between=$(echo "$line" | grep -oE '(^| )between_workers=[0-9]+' | cut -d= -f2)
linked=$(echo "$line" | grep -o 'over_worker_links=[0-9]*' | cut -d= -f2)
if [ -n "$between" ] && [ "$between" -gt 0 ] && [ "$linked" = "$between" ]; then
    pass "one-endpoint: all $between copies between the workers went over their link ($PKTS rxe packets in the run)"
else bad "one-endpoint: copies between workers ${between:-?}, over their link ${linked:-?}"; tail -3 "$W/shim1.log"; fi
set -- $(link_tcp_bytes "$W/one.ss"); ls=$1 lr=$2
[ "$ls" -le 25 ] && [ "$lr" -le 25 ] && pass "one-endpoint: the workers' link's TCP socket carried only the caps exchange ($ls / $lr B)" \
    || bad "one-endpoint: $ls / $lr bytes on the workers' link's TCP socket: copies went over TCP"
ROWS+=("| one-endpoint (shim, copies over LINK_*) | RDMA/RC+lean | $(ms_per_token one) | ${between:-?} copies, ${linked:-?} over the link | $ls / $lr | - | $PKTS |")
fi

{
    echo "Tensor split (-sm tensor) of a stock llama.cpp 8.0.0 client over two servers in the soft-RoCE VM (QEMU TCG,"
    echo "2 vCPUs, rxe0), synth-llama-f16, $N tokens, build $E2E_COMMIT. Command: \`tests/vm/test-link.sh\`."
    echo
    echo "| case | link | ms/token | allreduces / partial bytes each way (÷ generated tokens, the prompt's included) | link TCP after set-up, rank 0 sent / received (B) | our link RDMA SENDs | rxe sent_pkts (whole run) |"
    echo "|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
} > "$OUT/link-e2e.md"
cat "$OUT/link-e2e.md"
[ "$OUT" != "$W" ] && mkdir -p "$OUT/logs" && cp "$W"/*.log "$W"/*.err "$OUT/logs/" 2>/dev/null
echo "== summary: $([ $fail = 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
