#!/bin/bash
# Runs inside the soft-RoCE VM (tests/vm/run-in-vm.sh), driven by tests/vm/test-rdma.sh.
# Stock llama.cpp 7.0.0 clients built with RDMA generate through OUR rpc-server over real verbs
# (and, case e, a stock 8.0.0 client on its 8.0.0 port)
# (rxe0, 10.77.0.1): the Linux RC flavor, the Apple UC flavor (stock client with the patched
# libggml-rpc), fallbacks and faults. Every output must equal the local run; the server log and
# the rxe counters must prove the bytes went over RDMA.
#
# Env (from the host): E2E_SERVER (our rpc-server), E2E_STOCK_BIN (stock RDMA build bin dir),
#   E2E_STOCK8_BIN (stock 8.0.0 RDMA build bin dir: case e),
#   E2E_APPLE_LIB (dir holding the Apple-flavor libggml-rpc.so), E2E_MODEL (small GGUF),
#   E2E_N (tokens, default 32).
set -u
N=${E2E_N:-32}
ADDR=10.77.0.1
SRV=$E2E_SERVER
BIN=$E2E_STOCK_BIN
M=$E2E_MODEL
W=/tmp/e2e; mkdir -p $W
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

gen() { # name [env...] -- extra llama-completion args
    local name=$1; shift
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 240 "$BIN/llama-completion" -m "$M" -p "hello world" -n "$N" --temp 0 -s 1 -t 1 \
        -ngl 99 --no-repack -c 256 -no-cnv --simple-io --ignore-eos --no-warmup "$@" \
        > "$W/$name.out" 2> "$W/$name.err" < /dev/null
    echo $? > "$W/$name.rc"
}
# Our rpc-server speaks 8.0.0 on -p; the stock 7.0.0 clients here reach its 7.0.0 listener
# (--proto7-port) on the port they are given, and -p gets port + 7000, which nothing here uses.
# A server without --proto7-port (stock, or ours before 8.0.0) listens with -p.
listen_flags() { # binary port
    case "$("$1" --help 2>&1)" in *--proto7-port*) echo "-p $(($2 + 7000)) --proto7-port $2" ;; *) echo "-p $2" ;; esac
}
sends() { rdma statistic show link rxe0/1 2>/dev/null | tr ' ' '\n' | awk 'p{print; exit} /^sent_pkts$/{p=1}'; }
start_server() { # name [args]
    local name=$1; shift
    RPC_LOG=info "$SRV" -H $ADDR $(listen_flags "$SRV" 50052) -t 1 "$@" > "$W/srv-$name.log" 2>&1 &
    SRV_PID=$!
    for _ in $(seq 100); do (exec 3<>/dev/tcp/$ADDR/50052) 2>/dev/null && return 0; sleep 0.2; done
    bad "server $name did not start"; cat "$W/srv-$name.log"
}
stop_server() { kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; }
same_as_local() { # name
    if [ "$(cat $W/$1.rc)" != 0 ]; then bad "$1: client exit $(cat $W/$1.rc)"; tail -5 "$W/$1.err"; return 1; fi
    if cmp -s "$W/local.out" "$W/$1.out"; then pass "$1: output identical to local ($(wc -c < $W/$1.out) bytes)"; else
        bad "$1: output differs from local"; diff "$W/local.out" "$W/$1.out" | head -5; return 1; fi
}

echo "== local reference"
gen local -- 
[ "$(cat $W/local.rc)" = 0 ] || { bad "local run failed"; tail -20 $W/local.err; exit 1; }

echo "== (a) stock client, Linux RC flavor -> our server"
start_server rc
s0=$(sends)
gen rc -- --rpc $ADDR:50052
s1=$(sends)
stop_server
same_as_local rc
if grep -q "RDMA activated (Linux RC flavor)" $W/srv-rc.log; then pass "rc: server activated the RC flavor"; else bad "rc: no RC activation in the server log"; fi
rs=$(grep -o "RDMA connection done sends=[0-9]*" $W/srv-rc.log | awk -F= '{s+=$2} END{print s+0}')
[ "${rs:-0}" -gt 0 ] && pass "rc: server posted $rs RDMA SENDs" || bad "rc: server counted no RDMA SENDs"
[ $((s1 - s0)) -gt 0 ] && pass "rc: rxe sent_pkts +$((s1 - s0))" || bad "rc: rxe counters did not move"
grep -E "RDMA activated|RDMA connection done|ERROR" $W/srv-rc.log | head -5

echo "== (a') the same with no busy-polling: every wait sleeps on the completion channel"
RPC_RDMA_SPIN_MS=0 start_server events
gen events -- --rpc $ADDR:50052
stop_server
same_as_local events
ev=$(grep -o 'idle="\?events"\? event_wakeups=[0-9]*' $W/srv-events.log | grep -o "[0-9]*$" | awk '{s+=$1} END{print s+0}')
if grep -q 'idle="\?ticks' $W/srv-events.log; then bad "events: idle waits fell back to timer ticks"
elif [ "${ev:-0}" -gt 0 ]; then pass "events: idle waits woke on $ev completion events"
else bad "events: no idle wait ended on a completion event"; grep "RDMA connection done" $W/srv-events.log | head -3; fi

echo "== (b) stock client, Apple UC flavor (patched libggml-rpc) -> our server"
start_server uc
gen uc LD_LIBRARY_PATH=$E2E_APPLE_LIB -- --rpc $ADDR:50052
stop_server
same_as_local uc
if grep -q "RDMA activated (Apple UC flavor)" $W/srv-uc.log; then pass "uc: server activated the UC flavor"; else bad "uc: no UC activation in the server log"; grep -i "rdma\|error" $W/srv-uc.log | head; grep -i rdma $W/uc.err | head -5; fi
us=$(grep -o "RDMA connection done sends=[0-9]*" $W/srv-uc.log | awk -F= '{s+=$2} END{print s+0}')
[ "${us:-0}" -gt 0 ] && pass "uc: server posted $us full-stride SENDs" || bad "uc: server counted no RDMA SENDs"

echo "== (b') the same with Apple's verbs only (RDMA_VERBS_SYMBOLS=apple): the 17 entry points upstream's"
echo "   Apple transport calls, no completion channel (idle waits poll), Apple's queue-pair budget;"
echo "   no busy-poll window, so that every wait sleeps and must sleep on ticks"
s0=$(sends)
RDMA_VERBS_SYMBOLS=apple RPC_RDMA_SPIN_MS=0 start_server ucapple
gen ucapple LD_LIBRARY_PATH=$E2E_APPLE_LIB -- --rpc $ADDR:50052
s1=$(sends)
stop_server
same_as_local ucapple
if grep -q "RDMA activated (Apple UC flavor)" $W/srv-ucapple.log; then pass "ucapple: server activated the UC flavor"; else bad "ucapple: no UC activation"; grep -i "rdma\|error" $W/srv-ucapple.log | head; fi
grep -q "Apple's verbs: 17 entry points" $W/srv-ucapple.log && pass "ucapple: the verbs library was loaded with Apple's 17 entry points only" \
    || { bad "ucapple: not loaded with Apple's symbol set"; grep "transport" $W/srv-ucapple.log; }
grep -q "up to 8 RDMA connections" $W/srv-ucapple.log && pass "ucapple: Apple's queue-pair budget (8)" || bad "ucapple: not Apple's budget"
if grep -q 'idle="\?events' $W/srv-ucapple.log; then bad "ucapple: idle waits used a completion channel"
elif grep -q 'idle="\?ticks' $W/srv-ucapple.log; then pass "ucapple: no completion channel (idle waits slept on ticks: $(grep -o 'timer_wakeups=[0-9]*' $W/srv-ucapple.log | awk -F= '{s+=$2} END{print s+0}') timer wake-ups)"
else bad "ucapple: no idle wait recorded"; grep "RDMA connection done" $W/srv-ucapple.log | head -3; fi
ua=$(grep -o "RDMA connection done sends=[0-9]*" $W/srv-ucapple.log | awk -F= '{s+=$2} END{print s+0}')
[ "${ua:-0}" -gt 0 ] && pass "ucapple: server posted $ua SENDs" || bad "ucapple: server counted no RDMA SENDs"
[ $((s1 - s0)) -gt 0 ] && pass "ucapple: rxe sent_pkts +$((s1 - s0))" || bad "ucapple: rxe counters did not move"

echo "== (c1) client without RDMA (GGML_RPC_NO_RDMA) -> TCP"
start_server notcp
gen norda GGML_RPC_NO_RDMA=1 -- --rpc $ADDR:50052
stop_server
same_as_local norda
grep -q "RDMA activated" $W/srv-notcp.log && bad "norda: RDMA activated although the client offered none" || pass "norda: stayed on TCP"

echo "== (c2) server-side activation failure -> zero caps -> TCP fallback"
start_server fallback --rdma-device no-such-device
gen fallback -- --rpc $ADDR:50052
stop_server
same_as_local fallback
grep -q "staying on TCP" $W/srv-fallback.log && pass "fallback: server logged the TCP fallback" || bad "fallback: no fallback log line"

echo "== (c4) RDMA budget: two clients at once, --rdma-max-connections 1 -> the second gets TCP"
start_server budget --rdma-max-connections 1
gen budget1 -- --rpc $ADDR:50052 &
b1=$!
gen budget2 -- --rpc $ADDR:50052
wait $b1
stop_server
same_as_local budget1
same_as_local budget2
grep -q "budget used up" $W/srv-budget.log && pass "budget: a connection beyond the budget stayed on TCP" || bad "budget: no budget fallback logged"
grep -q "RDMA activated" $W/srv-budget.log && pass "budget: RDMA still used within the budget" || bad "budget: no RDMA at all"

echo "== (c3) client killed mid-transfer; the server keeps serving"
start_server kill
env timeout 240 "$BIN/llama-completion" -m "$M" -p "hello world" -n 400 --temp 0 -t 1 -ngl 99 --no-repack -c 512 \
    -no-cnv --simple-io --ignore-eos --no-warmup --rpc $ADDR:50052 > $W/killed.out 2> $W/killed.err < /dev/null &
cpid=$!
for _ in $(seq 200); do grep -q "RDMA activated" $W/srv-kill.log && break; sleep 0.2; done
sleep 3
kill -9 $cpid; wait $cpid 2>/dev/null
t0=$(date +%s)
for _ in $(seq 100); do grep -q "RDMA connection done\|closing connection" $W/srv-kill.log && break; sleep 0.2; done
t1=$(date +%s)
grep -q "RDMA connection done\|closing connection" $W/srv-kill.log && pass "kill: server noticed the dead client within $((t1 - t0)) s" || bad "kill: server did not notice the dead client"
gen afterkill -- --rpc $ADDR:50052
kill -0 $SRV_PID 2>/dev/null && pass "kill: server still running" || bad "kill: server died"
stop_server
same_as_local afterkill

echo "== (e) stock llama.cpp 8.0.0 client, Linux RC flavor -> our server's 8.0.0 port (-p)"
if [ -n "${E2E_STOCK8_BIN:-}" ] && [ -x "$E2E_STOCK8_BIN/llama-completion" ]; then
    BIN_SAVED=$BIN; BIN=$E2E_STOCK8_BIN
    gen local8 --   # the 8.0 client's own local reference (another llama.cpp than the 7.0 one)
    start_server v8
    s0=$(sends)
    gen v8 -- --rpc $ADDR:$((50052 + 7000))
    BIN=$BIN_SAVED
    s1=$(sends)
    stop_server
    if [ "$(cat $W/v8.rc)" = 0 ] && [ "$(cat $W/local8.rc)" = 0 ] && cmp -s "$W/local8.out" "$W/v8.out"; then
        pass "v8: output identical to the 8.0 client's local run ($(wc -c < $W/v8.out) bytes)"
    else
        bad "v8: exit $(cat $W/v8.rc) (local $(cat $W/local8.rc)) or output differs"; tail -5 "$W/v8.err"
    fi
    if grep -q "RDMA activated (Linux RC flavor)" $W/srv-v8.log; then pass "v8: server activated the RC flavor for the 8.0 client"; else bad "v8: no RC activation"; grep -iE "rdma|error" $W/srv-v8.log | head -5; fi
    [ $((s1 - s0)) -gt 0 ] && pass "v8: rxe sent_pkts +$((s1 - s0))" || bad "v8: rxe counters did not move"
else
    bad "v8: no stock 8.0 RDMA build (E2E_STOCK8_BIN)"
fi

echo "== (d) doctor explains the setup"
"$SRV" doctor --peer $ADDR > $W/doctor.txt 2>&1
sed 's/^/    /' $W/doctor.txt | head -30
grep -q "device rxe0" $W/doctor.txt && grep -q "RDMA can engage: device rxe0" $W/doctor.txt && pass "doctor: rxe0 found and mapped to $ADDR" || bad "doctor: did not explain rxe0"
"$SRV" doctor --peer 127.0.0.1 > $W/doctor-lo.txt 2>&1
grep -q "would NOT engage" $W/doctor-lo.txt && pass "doctor: explains why loopback cannot use RDMA" || bad "doctor: loopback verdict missing"

echo "== summary: $([ $fail = 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
