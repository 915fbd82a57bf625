#!/bin/bash
# Runs inside the soft-RoCE VM (tests/vm/run-in-vm.sh), driven by tests/vm/test-lean.sh.
# Wire cost per generated token (rxe counters: difference between a long and a short run, divided
# by the token difference; same model, prompt and seed) for
#   (a) a stock RDMA client <-> our rpc-server over upstream's Linux RC and Apple UC flavors, and
#   (b) a stock TCP-only client -> relay (rpc-shim, or the lean_relay example) -> our rpc-server
#       over our lean framing (RC and UC queue pairs),
# plus mixed peers (our lean offer against a stock server, and against ours with lean off): they
# must fall back to upstream's framing. Every output must equal the local run.
#
# Env (from the host): E2E_SERVER (our rpc-server), E2E_STOCK_BIN (stock RDMA build bin dir),
#   E2E_APPLE_LIB (Apple-flavor libggml-rpc.so dir), E2E_MODEL (small GGUF), E2E_RELAY
#   (lean_relay example), E2E_SHIM (rpc-shim binary with the lean offer, optional: preferred
#   over E2E_RELAY when set), E2E_SHORT / E2E_LONG (tokens, default 4 / 36).
set -u
SHORT=${E2E_SHORT:-4}
LONG=${E2E_LONG:-36}
ADDR=10.77.0.1
SRV=$E2E_SERVER
BIN=$E2E_STOCK_BIN
M=$E2E_MODEL
SHIM=${E2E_SHIM:-}
RELAY=${E2E_RELAY:-}
W=/tmp/lean; mkdir -p $W
OUT=${RVM_OUT:-$W}
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

gen() { # name ntokens [env...] -- extra llama-completion args
    local name=$1 n=$2; shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 240 "$BIN/llama-completion" -m "$M" -p "hello world" -n "$n" --temp 0 -s 1 -t 1 \
        -ngl 99 --no-repack -c 256 -no-cnv --simple-io --ignore-eos --no-warmup "$@" \
        > "$W/$name.out" 2> "$W/$name.err" < /dev/null
    echo $? > "$W/$name.rc"
}
stat() { # counter name -> value on rxe0 port 1
    rdma statistic show link rxe0/1 2>/dev/null | tr ' ' '\n' | awk -v k="$1" 'p{print; exit} $0==k{p=1}'
}
snap() { echo "$(stat sent_pkts) $(stat rdma_sends)"; }
# Our rpc-server speaks 8.0.0 on -p; the stock 7.0.0 clients here reach its 7.0.0 listener
# (--proto7-port) on the port they are given, and -p gets port + 7000, which nothing here uses.
# A server without --proto7-port (stock, or ours before 8.0.0) listens with -p.
listen_flags() { # binary port
    case "$("$1" --help 2>&1)" in *--proto7-port*) echo "-p $(($2 + 7000)) --proto7-port $2" ;; *) echo "-p $2" ;; esac
}
wait_port() { # host port
    for _ in $(seq 150); do (exec 3<>/dev/tcp/$1/$2) 2>/dev/null && return 0; sleep 0.2; done
    return 1
}
start_server() { # name [env...] -- [args]
    local name=$1; shift
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env RPC_LOG=info "${envs[@]}" "$SRV" -H $ADDR $(listen_flags "$SRV" 50052) -t 1 "$@" > "$W/srv-$name.log" 2>&1 &
    SRV_PID=$!
    wait_port $ADDR 50052 || { bad "server $name did not start"; cat "$W/srv-$name.log"; }
}
start_stock_server() { # name [env...]
    local name=$1; shift
    env "$@" "$BIN/ggml-rpc-server" -H $ADDR -p 50052 -t 1 > "$W/srv-$name.log" 2>&1 &
    SRV_PID=$!
    wait_port $ADDR 50052 || { bad "stock server $name did not start"; cat "$W/srv-$name.log"; }
}
stop_server() { kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; }
# rpc-shim speaks 8.0.0 on --listen; the stock 7.0.0 clients here reach its 7.0.0 listener
# (--listen7) at the address they are given, and --listen gets port + 7000. An older shim: --listen.
shim_listen() { # shim address:port
    case "$("$1" --help 2>&1)" in
        *--listen7*) echo "--listen ${2%:*}:$((${2##*:} + 7000)) --listen7 $2" ;;
        *) echo "--listen $2" ;;
    esac
}
start_relay() { # name flavor [--no-lean]
    local name=$1 flavor=$2; shift 2
    if [ -n "$SHIM" ]; then
        "$SHIM" -w $ADDR:50052 $(shim_listen "$SHIM" 127.0.0.1:50152) --transport rdma --rdma-flavor "$flavor" "$@" > "$W/relay-$name.log" 2>&1 &
    else
        "$RELAY" --listen 127.0.0.1:50152 --worker $ADDR:50052 --flavor "$flavor" "$@" > "$W/relay-$name.log" 2>&1 &
    fi
    RELAY_PID=$!
    wait_port 127.0.0.1 50152 || { bad "relay $name did not start"; cat "$W/relay-$name.log"; }
}
stop_relay() { kill "$RELAY_PID" 2>/dev/null; wait "$RELAY_PID" 2>/dev/null; }
same_as_local() { # run-name n
    local name=$1 n=$2
    if [ "$(cat $W/$name.rc)" != 0 ]; then bad "$name: client exit $(cat $W/$name.rc)"; tail -5 "$W/$name.err"; return 1; fi
    if cmp -s "$W/local-$n.out" "$W/$name.out"; then pass "$name: output identical to local ($(wc -c < $W/$name.out) bytes)"; else
        bad "$name: output differs from local"; diff "$W/local-$n.out" "$W/$name.out" | head -5; return 1; fi
}
TABLE=$W/table.txt
: > $TABLE
measure() { # name [client env...] -- [client args]   (server/relay already running)
    local name=$1; shift
    local s0 s1 s2
    s0=$(snap)
    gen "$name-short" $SHORT "$@"
    s1=$(snap)
    gen "$name-long" $LONG "$@"
    s2=$(snap)
    same_as_local "$name-short" $SHORT
    same_as_local "$name-long" $LONG
    set -- $s0 $s1 $s2
    local pk=$(awk -v a=$1 -v b=$3 -v c=$5 -v d=$((LONG - SHORT)) 'BEGIN{printf "%.1f", ((c-b)-(b-a))/d}')
    local sd=$(awk -v a=$2 -v b=$4 -v c=$6 -v d=$((LONG - SHORT)) 'BEGIN{printf "%.1f", ((c-b)-(b-a))/d}')
    echo "$name $sd $pk" >> $TABLE
    echo "   $name: $sd SENDs/token, $pk packets/token (rxe0 sent_pkts $1 -> $3 -> $5, rdma_sends $2 -> $4 -> $6)"
}

echo "== local references ($SHORT and $LONG tokens)"
gen local-$SHORT $SHORT --
gen local-$LONG $LONG --
for n in $SHORT $LONG; do [ "$(cat $W/local-$n.rc)" = 0 ] || { bad "local run ($n) failed"; tail -20 $W/local-$n.err; exit 1; }; done
RELAY_NAME=$([ -n "$SHIM" ] && echo rpc-shim || echo lean_relay)
echo "   relay for (b): $RELAY_NAME"

echo "== (a1) stock RDMA client, upstream Linux RC flavor -> our server"
start_server a-rc --
measure a-rc -- --rpc $ADDR:50052
stop_server
grep -q "RDMA activated (Linux RC flavor)" $W/srv-a-rc.log && pass "a-rc: upstream RC flavor" || bad "a-rc: no RC activation"
grep -q "RDMA activated (lean" $W/srv-a-rc.log && bad "a-rc: a stock client got the lean framing" || pass "a-rc: stock client never gets lean"

echo "== (a2) stock RDMA client, upstream Apple UC flavor (patched libggml-rpc) -> our server"
start_server a-uc --
measure a-uc LD_LIBRARY_PATH=$E2E_APPLE_LIB -- --rpc $ADDR:50052
stop_server
grep -q "RDMA activated (Apple UC flavor)" $W/srv-a-uc.log && pass "a-uc: upstream UC flavor" || bad "a-uc: no UC activation"
grep -q "RDMA activated (lean" $W/srv-a-uc.log && bad "a-uc: a stock client got the lean framing" || pass "a-uc: stock client never gets lean"

for fl in rc uc; do
    echo "== (b-$fl) stock TCP-only client -> $RELAY_NAME (lean offer, $fl) -> our server"
    start_server b-$fl --
    start_relay b-$fl $fl
    measure b-$fl GGML_RPC_NO_RDMA=1 -- --rpc 127.0.0.1:50152
    stop_relay
    stop_server
    U=$(echo $fl | tr a-z A-Z)
    grep -q "RDMA activated (lean framing over $U)" $W/srv-b-$fl.log && pass "b-$fl: lean framing over $U" || { bad "b-$fl: no lean activation"; grep -i "rdma\|error" $W/srv-b-$fl.log | head; tail -5 $W/relay-b-$fl.log; }
    grep -E "lean framing stats" $W/srv-b-$fl.log | tail -1 | sed 's/^/    /'
    grep -qiE "checksum|frame lost|bad frame" $W/srv-b-$fl.log && bad "b-$fl: frame errors in the server log" || pass "b-$fl: no frame errors"
done

echo "== (c1) mixed: our lean UC offer -> stock Apple-flavor server: upstream UC framing"
start_stock_server c-stock-uc LD_LIBRARY_PATH=$E2E_APPLE_LIB
start_relay c-stock-uc uc
gen c-stock-uc $SHORT GGML_RPC_NO_RDMA=1 -- --rpc 127.0.0.1:50152
stop_relay
stop_server
same_as_local c-stock-uc $SHORT
grep -q "RDMA(Apple/UC) activated" $W/srv-c-stock-uc.log && pass "c-stock-uc: the stock server activated its UC flavor" || { bad "c-stock-uc: stock server did not activate"; head -20 $W/srv-c-stock-uc.log; }
if grep -q "RDMA/UC" $W/relay-c-stock-uc.log && ! grep -q "RDMA/UC+lean" $W/relay-c-stock-uc.log; then pass "c-stock-uc: relay speaks upstream UC framing"; else
    grep -i "upstream\|rdma" $W/relay-c-stock-uc.log | head -3; bad "c-stock-uc: relay did not fall back to upstream UC"; fi

if [ -n "$SHIM" ]; then
    echo "== (c2) mixed: our lean RC offer (rpc-shim) -> stock Linux-flavor server: upstream RC framing"
    start_stock_server c-stock-rc
    start_relay c-stock-rc rc
    gen c-stock-rc $SHORT GGML_RPC_NO_RDMA=1 -- --rpc 127.0.0.1:50152
    stop_relay
    stop_server
    same_as_local c-stock-rc $SHORT
    grep -q "RDMA activated: qpn" $W/srv-c-stock-rc.log && pass "c-stock-rc: the stock server activated its RC flavor" || bad "c-stock-rc: stock server did not activate"
    grep -q "Linux RC flavor" $W/relay-c-stock-rc.log && pass "c-stock-rc: shim speaks upstream RC framing" || bad "c-stock-rc: shim did not fall back to upstream RC"
fi

echo "== (c3) mixed: our lean UC offer -> our server with RPC_RDMA_LEAN=0: upstream UC framing"
start_server c-ours-nolean RPC_RDMA_LEAN=0 --
start_relay c-ours-nolean uc
gen c-ours-nolean $SHORT GGML_RPC_NO_RDMA=1 -- --rpc 127.0.0.1:50152
stop_relay
stop_server
same_as_local c-ours-nolean $SHORT
grep -q "RDMA activated (Apple UC flavor)" $W/srv-c-ours-nolean.log && pass "c-ours-nolean: upstream UC framing" || bad "c-ours-nolean: no upstream UC activation"
grep -q "lean offered, declined" $W/srv-c-ours-nolean.log && pass "c-ours-nolean: server logged the declined offer" || bad "c-ours-nolean: no declined-offer log"

if [ -n "$SHIM" ] && [ -x "$BIN/llama-server" ]; then
    # A long-running llama-server behind the shim survives idle periods past every timeout the
    # shim and the server have (server --idle-timeout 3 --keepalive 2; shim connect/handshake/query
    # timeouts shortened), with the lean framing's keepalives holding the queue pair awake.
    for fl in rc uc; do
        echo "== (d-$fl) stock TCP-only llama-server -> rpc-shim (lean $fl) -> our server: idle 15 s between requests"
        start_server d-$fl -- --idle-timeout 3 --keepalive 2
        start_relay d-$fl $fl --connect-timeout 1 --handshake-timeout 5 --query-timeout 5
        GGML_RPC_NO_RDMA=1 "$BIN/llama-server" -m "$M" -ngl 99 --rpc 127.0.0.1:50152 --host 127.0.0.1 --port 50200 \
            -c 256 -np 1 -t 1 --no-warmup > "$W/llama-server-d-$fl.log" 2>&1 &
        LS_PID=$!
        ok=0
        for _ in $(seq 300); do curl -sf http://127.0.0.1:50200/health >/dev/null 2>&1 && { ok=1; break; }; sleep 0.5; done
        if [ $ok = 1 ]; then
            req='{"prompt":"hello world","n_predict":6,"temperature":0,"top_k":1,"seed":1,"cache_prompt":false}'
            a=$(curl -s --max-time 120 -d "$req" http://127.0.0.1:50200/completion)
            sleep 15
            b=$(curl -s --max-time 120 -d "$req" http://127.0.0.1:50200/completion)
            ca=$(echo "$a" | grep -o '"content":"[^"]*"' | head -1); cb=$(echo "$b" | grep -o '"content":"[^"]*"' | head -1)
            if [ -n "$ca" ] && [ "$ca" = "$cb" ]; then pass "d-$fl: answer after 15 s idle identical ($ca)"; else
                bad "d-$fl: answers differ or failed: [$ca] vs [$cb]"; tail -5 "$W/llama-server-d-$fl.log"; fi
            kill -0 $LS_PID 2>/dev/null && pass "d-$fl: llama-server alive" || bad "d-$fl: llama-server died"
        else
            bad "d-$fl: llama-server not healthy"; tail -20 "$W/llama-server-d-$fl.log"
        fi
        cp "$W/srv-d-$fl.log" "$W/srv-d-$fl.before-stop.log"
        kill $LS_PID 2>/dev/null; wait $LS_PID 2>/dev/null
        stop_relay
        stop_server
        U=$(echo $fl | tr a-z A-Z)
        grep -q "RDMA activated (lean framing over $U)" $W/srv-d-$fl.log && pass "d-$fl: lean framing over $U" || bad "d-$fl: no lean activation"
        grep -q "while holding no buffer" $W/srv-d-$fl.log && echo "    (a connection that held nothing was closed for idleness, as designed)"
        # Before llama-server was stopped, no connection may have ended in an error (an idle
        # connection that held nothing may be closed: that line says "holding no buffer").
        if grep "closing connection" "$W/srv-d-$fl.before-stop.log" | grep -vq "holding no buffer"; then
            bad "d-$fl: a connection failed while llama-server was up"; grep "closing connection" "$W/srv-d-$fl.before-stop.log" | head -3
        else pass "d-$fl: no connection failed during the idle period"; fi
    done
fi

echo "== per-token wire cost (rxe0, ($LONG - $SHORT) tokens; both directions, MTU 1024)"
printf "%-8s %14s %16s\n" config SENDs/token packets/token | tee $OUT/lean-table.txt
while read -r n s p; do printf "%-8s %14s %16s\n" $n $s $p; done < $TABLE | tee -a $OUT/lean-table.txt
get() { awk -v n=$1 -v c=$2 '$1==n{print $c}' $TABLE; }
for fl in rc uc; do
    bp=$(get b-$fl 3); bs=$(get b-$fl 2); up=$(get a-uc 3); rs=$(get a-rc 2)
    [ -n "$bp" ] && [ -n "$up" ] && awk -v b=$bp -v u=$up 'BEGIN{exit !(b*10 <= u)}' && pass "b-$fl: $bp packets/token <= 1/10 of the Apple flavor's $up" || bad "b-$fl: $bp packets/token vs Apple flavor $up (goal <= 1/10)"
    [ -n "$bs" ] && [ -n "$rs" ] && awk -v b=$bs -v r=$rs 'BEGIN{exit !(b < r)}' && pass "b-$fl: $bs SENDs/token < RC flavor's $rs" || bad "b-$fl: $bs SENDs/token vs RC flavor $rs (goal: fewer)"
done

echo "== summary: $([ $fail = 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
