#!/bin/bash
# rpc-shim end to end over real verbs (soft-RoCE), modelled on tests/vm/rdma-e2e.sh.
#
# A stock llama.cpp built WITHOUT RDMA talks TCP to rpc-shim on 127.0.0.1; the shim carries the
# traffic to the worker at 10.77.0.1 (rxe0) over RDMA: our rpc-server (Linux RC and Apple UC
# flavors, each with upstream's framing and with the lean framing) and the stock ggml-rpc-server
# built with RDMA (RC; a serial server, and the real stock receiver of the RC segmentation). Every output must equal the local run; the logs and
# the rxe counters must prove the bytes went over RDMA. Then fallbacks and a killed worker.
#
# Two roles in one file:
#   on the host:   tests/vm/shim-e2e.sh
#                  builds what the VM needs (rpc-server and rpc-shim for the VM's CPU, stock
#                  llama-completion without RDMA, stock ggml-rpc-server with RDMA, a synthetic
#                  model; all cached), then runs this same script inside the VM
#                  (tests/vm/run-in-vm.sh). Env: E2E_N (tokens, default 12), RVM_TIMEOUT (900).
#   in the VM:     SHIM_E2E_IN_VM=1 with E2E_SERVER, E2E_SHIM, E2E_TCP_BIN, E2E_STOCK_BIN, E2E_MODEL.
set -u

if [ -z "${SHIM_E2E_IN_VM:-}" ]; then
    set -euo pipefail
    ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    cd "$ROOT"
    # The VM emulates an x86-64-v3 CPU (no AVX-512): build everything it runs for that.
    VMFLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    echo "shim-e2e: building rpc-server and rpc-shim for the VM" >&2
    tests/vm/cargo-vm.sh build --release -q -p rpc-server -p rpc-shim >&2
    TCP_BIN=$(STOCK_RDMA=OFF STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="llama-completion" scripts/stock-llama.sh)
    STOCK=$(STOCK_RDMA=ON STOCK_CMAKE_FLAGS="$VMFLAGS" STOCK_TARGETS="ggml-rpc-server llama-completion" scripts/stock-llama.sh)
    MODELS=${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models/synth
    python3 tests/e2e/synth_models.py "$MODELS" >/dev/null
    MODEL="$MODELS/synth-llama-f16.gguf"
    [ -s "$MODEL" ] || { echo "shim-e2e: no model at $MODEL" >&2; exit 1; }
    export SHIM_E2E_IN_VM=1 E2E_SERVER="$ROOT/target/vm/release/rpc-server" E2E_SHIM="$ROOT/target/vm/release/rpc-shim" \
        E2E_TCP_BIN="$TCP_BIN" E2E_STOCK_BIN="$STOCK" E2E_MODEL="$MODEL"
    RVM_PASS_ENV="SHIM_E2E_IN_VM E2E_SERVER E2E_SHIM E2E_TCP_BIN E2E_STOCK_BIN E2E_MODEL E2E_N" \
        RVM_TIMEOUT=${RVM_TIMEOUT:-900} exec tests/vm/run-in-vm.sh tests/vm/shim-e2e.sh
fi

# ------------------------------------------------------------------------------ in the VM
N=${E2E_N:-12}
ADDR=10.77.0.1
SRV=$E2E_SERVER
SHIM=$E2E_SHIM
TCP_BIN=$E2E_TCP_BIN      # stock llama.cpp built without RDMA (the client)
STOCK=$E2E_STOCK_BIN      # stock llama.cpp built with RDMA (its ggml-rpc-server is a worker)
M=$E2E_MODEL
W=/tmp/shim-e2e; mkdir -p $W
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

if ldd "$TCP_BIN/llama-completion" | grep -q ibverbs; then
    bad "the client $TCP_BIN/llama-completion links libibverbs: not a TCP-only build"
fi

gen() { # name -- extra llama-completion args
    local name=$1; shift; shift
    timeout 300 "$TCP_BIN/llama-completion" -m "$M" -p "hello world" -n "$N" --temp 0 -s 1 -t 1 \
        -ngl 99 --no-repack -c 256 -no-cnv --simple-io --ignore-eos --no-warmup "$@" \
        > "$W/$name.out" 2> "$W/$name.err" < /dev/null
    echo $? > "$W/$name.rc"
}
sends() { rdma statistic show link rxe0/1 2>/dev/null | tr ' ' '\n' | awk 'p{print; exit} /^sent_pkts$/{p=1}'; }
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
start_worker() { # name binary port [args]
    local name=$1 bin=$2 port=$3; shift 3
    RPC_LOG=info "$bin" -H $ADDR $(listen_flags "$bin" "$port") -t 1 "$@" > "$W/worker-$name.log" 2>&1 &
    WORKER_PID=$!
    wait_port $ADDR "$port" || { bad "worker $name did not start"; tail -5 "$W/worker-$name.log"; }
}
stop_worker() { kill "$WORKER_PID" 2>/dev/null; wait "$WORKER_PID" 2>/dev/null; }
# rpc-shim speaks 8.0.0 on --listen; the stock 7.0.0 clients here reach its 7.0.0 listener
# (--listen7) at the address they are given, and --listen gets port + 7000. An older shim: --listen.
shim_listen() { # shim address:port
    case "$("$1" --help 2>&1)" in
        *--listen7*) echo "--listen ${2%:*}:$((${2##*:} + 7000)) --listen7 $2" ;;
        *) echo "--listen $2" ;;
    esac
}
start_shim() { # name worker-port [args]
    local name=$1 port=$2; shift 2
    RPC_LOG=info "$SHIM" --worker $ADDR:"$port" $(shim_listen "$SHIM" 127.0.0.1:50152) "$@" > "$W/shim-$name.out" 2> "$W/shim-$name.log" &
    SHIM_PID=$!
    wait_port 127.0.0.1 50152 || { bad "shim $name did not start"; tail -5 "$W/shim-$name.log"; }
}
stop_shim() { kill "$SHIM_PID" 2>/dev/null; wait "$SHIM_PID" 2>/dev/null; }
same_as_local() { # name
    if [ "$(cat $W/$1.rc)" != 0 ]; then bad "$1: client exit $(cat $W/$1.rc)"; tail -5 "$W/$1.err"; return 1; fi
    if cmp -s "$W/local.out" "$W/$1.out"; then pass "$1: output identical to local ($(wc -c < $W/$1.out) bytes)"; else
        bad "$1: output differs from local"; diff "$W/local.out" "$W/$1.out" | head -5; return 1; fi
}
logged() { # name file pattern what
    if grep -q "$3" "$2"; then pass "$1: $4"; else bad "$1: $4 (no '$3' in $(basename $2))"; grep -iE "rdma|error|warn" "$2" | head -5; fi
}

echo "== local reference (stock llama.cpp without RDMA, no RPC)"
gen local --
[ "$(cat $W/local.rc)" = 0 ] || { bad "local run failed"; tail -20 $W/local.err; exit 1; }

echo "== (a) client -TCP-> shim -RDMA/RC (upstream framing)-> our rpc-server"
start_worker rc "$SRV" 50052
start_shim rc 50052 --transport rdma --rdma-flavor rc --no-lean
s0=$(sends)
gen rc -- --rpc 127.0.0.1:50152
s1=$(sends)
stop_shim; stop_worker
same_as_local rc
logged rc "$W/shim-rc.log" "RDMA activated (Linux RC flavor, upstream framing)" "shim activated the RC flavor"
logged rc "$W/worker-rc.log" "RDMA activated (Linux RC flavor)" "worker activated the RC flavor"
n=$(grep -c "RDMA activated" "$W/worker-rc.log")
[ "$n" = 1 ] && pass "rc: one queue pair for the whole run (short connections answered by the shim)" || bad "rc: $n RDMA activations on the worker (expected 1)"
c=$(grep -c "accepted client connection" "$W/worker-rc.log")
pass "rc: the worker accepted $c connections (a direct stock client opens ~13)"
rs=$(grep -o "RDMA connection done sends=[0-9]*" "$W/worker-rc.log" | awk -F= '{s+=$2} END{print s+0}')
[ "${rs:-0}" -gt 0 ] && pass "rc: worker posted $rs RDMA SENDs" || bad "rc: the worker counted no RDMA SENDs"
[ $((s1 - s0)) -gt 0 ] && pass "rc: rxe sent_pkts +$((s1 - s0))" || bad "rc: rxe counters did not move"

echo "== (a2) client -TCP-> shim -RDMA/RC (lean framing, both ends ours)-> our rpc-server"
start_worker rclean "$SRV" 50052
start_shim rclean 50052 --transport rdma --rdma-flavor rc
gen rclean -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local rclean
logged rclean "$W/shim-rclean.log" "RDMA activated (Linux RC flavor, lean framing)" "shim activated lean over RC"
logged rclean "$W/worker-rclean.log" "RDMA activated (lean framing over RC)" "worker activated lean over RC"

echo "== (b) client -TCP-> shim -RDMA/UC (Apple flavor, upstream framing)-> our rpc-server"
start_worker uc "$SRV" 50052
start_shim uc 50052 --transport rdma --rdma-flavor uc --no-lean
gen uc -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local uc
logged uc "$W/shim-uc.log" "RDMA activated (Apple UC flavor, upstream framing)" "shim activated the UC flavor"
logged uc "$W/worker-uc.log" "RDMA activated (Apple UC flavor)" "worker activated the UC flavor"

echo "== (b2) client -TCP-> shim -RDMA/UC (lean framing)-> our rpc-server"
start_worker uclean "$SRV" 50052
start_shim uclean 50052 --transport rdma --rdma-flavor uc
gen uclean -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local uclean
logged uclean "$W/shim-uclean.log" "RDMA activated (Apple UC flavor, lean framing)" "shim activated lean over UC"
logged uclean "$W/worker-uclean.log" "RDMA activated (lean framing over UC)" "worker activated lean over UC"

echo "== (c) client -TCP-> shim -RDMA/RC-> stock ggml-rpc-server (RDMA build; serves one connection at a time)"
start_worker stock "$STOCK/ggml-rpc-server" 50053
start_shim stock 50053 --transport rdma
s0=$(sends)
gen stock -- --rpc 127.0.0.1:50152
s1=$(sends)
stop_shim; stop_worker
same_as_local stock
logged stock "$W/shim-stock.log" "RDMA activated (Linux RC flavor, upstream framing)" "shim (offering lean too) got upstream RC framing from the stock server"
logged stock "$W/worker-stock.log" "RDMA activated" "the stock server activated RDMA"
[ $((s1 - s0)) -gt 0 ] && pass "stock: rxe sent_pkts +$((s1 - s0))" || bad "stock: rxe counters did not move"

echo "== (d) shim cannot engage RDMA (--rdma-device no-such-device) -> TCP fallback"
start_worker fallback "$SRV" 50052
start_shim fallback 50052 --rdma-device no-such-device
gen fallback -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local fallback
logged fallback "$W/shim-fallback.log" "RDMA does not engage" "shim logged the TCP fallback"
grep -q "RDMA activated" "$W/worker-fallback.log" && bad "fallback: the worker activated RDMA" || pass "fallback: stayed on TCP"

echo "== (e) worker without RDMA (--transport tcp answers zero caps) -> TCP fallback"
start_worker zerocaps "$SRV" 50052 --transport tcp
start_shim zerocaps 50052
gen zerocaps -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local zerocaps
logged zerocaps "$W/shim-zerocaps.log" "zero caps" "shim noticed the zero caps and stayed on TCP"

echo "== (f) worker killed mid-generation over RDMA: the client's connection closes promptly"
start_worker kill "$SRV" 50052
start_shim kill 50052 --transport rdma
# GGML_NO_BACKTRACE: the client's abort would otherwise attach gdb for a backtrace, which takes
# ~20 s under TCG and is not what is measured here.
GGML_NO_BACKTRACE=1 timeout 300 "$TCP_BIN/llama-completion" -m "$M" -p "hello world" -n 100000 --temp 0 -t 1 -ngl 99 --no-repack -c 2048 \
    -no-cnv --simple-io --ignore-eos --no-warmup --rpc 127.0.0.1:50152 > $W/killed.out 2> $W/killed.err < /dev/null &
cpid=$!
for _ in $(seq 300); do [ "$(wc -c < $W/killed.out)" -gt 100 ] && break; sleep 0.2; done
grep -q "RDMA activated" "$W/shim-kill.log" && pass "kill: generating over RDMA" || bad "kill: no RDMA before the kill"
t0=$(date +%s%N)
kill -9 "$WORKER_PID"; wait "$WORKER_PID" 2>/dev/null
for _ in $(seq 300); do kill -0 $cpid 2>/dev/null || break; sleep 0.1; done
t1=$(date +%s%N)
if kill -0 $cpid 2>/dev/null; then
    bad "kill: the client still runs 30 s after its worker died (hang)"; kill -9 $cpid
else
    wait $cpid; rc=$?
    pass "kill: the client exited $(( (t1 - t0) / 1000000 )) ms after the worker was killed (exit $rc)"
fi
closed=$(grep "closing the client connection" "$W/shim-kill.log" | head -1 | awk '{print $1}')
if [ -n "$closed" ]; then
    pass "kill: the shim closed the client connection $(( ($(date -d "$closed" +%s%N) - t0) / 1000000 )) ms after the kill: $(grep -o 'closing the client connection.*' "$W/shim-kill.log" | head -1)"
else
    bad "kill: no 'closing the client connection' in the shim log"
fi
kill -0 "$SHIM_PID" 2>/dev/null && pass "kill: shim still running" || bad "kill: shim died"
start_worker kill2 "$SRV" 50052
gen afterkill -- --rpc 127.0.0.1:50152
stop_shim; stop_worker
same_as_local afterkill

echo "== summary: $([ $fail = 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
