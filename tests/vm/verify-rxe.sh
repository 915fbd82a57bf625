#!/bin/bash
# Smoke test of the VM itself (tests/vm/run-in-vm.sh tests/vm/verify-rxe.sh):
# ibv_devices, ibv_rc_pingpong and ibv_uc_pingpong on rxe0, server and client
# in the guest, the client connecting to 127.0.0.1 for the out-of-band exchange.
set -u
fail=0
pp() { # tool args...
    local tool=$1; shift
    local port=$((18700 + RANDOM % 1000)) out rc src
    timeout 60 "$tool" -d rxe0 -g 1 -p "$port" "$@" > /tmp/pp-srv.log 2>&1 &
    local spid=$!
    for _ in $(seq 100); do
        sleep 0.2
        out=$(timeout 60 "$tool" -d rxe0 -g 1 -p "$port" "$@" 127.0.0.1 2>&1); rc=$?
        echo "$out" | grep -q "Couldn't connect" || break
    done
    wait "$spid"; src=$?
    echo "\$ $tool -d rxe0 -g 1 $* 127.0.0.1"
    echo "$out" | sed 's/^/    /'
    if [ $rc -ne 0 ] || [ $src -ne 0 ]; then echo "    FAILED (client $rc, server $src)"; sed 's/^/    srv: /' /tmp/pp-srv.log; fail=1; fi
}
echo "\$ ibv_devices"; ibv_devices | sed 's/^/    /'; ibv_devices | grep -q rxe0 || fail=1
echo "\$ ibv_devinfo -d rxe0"; ibv_devinfo -d rxe0 | grep -E 'state|mtu|link_layer' | sed 's/^/    /'
pp ibv_rc_pingpong
pp ibv_uc_pingpong -s 4096 -n 200
[ $fail = 0 ] && echo "verify-rxe: PASS" || echo "verify-rxe: FAIL"
exit $fail
