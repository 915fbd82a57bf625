#!/bin/bash
# Runs inside the soft-RoCE VM: the rdma-verbs test binaries (unit tests +
# tests/device.rs) against rxe0.
#
#   tests/vm/cargo-vm.sh test --release -p rdma-verbs --no-run
#   tests/vm/run-in-vm.sh tests/vm/rdma-verbs-tests.sh
set -u
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEPS=${RV_DEPS:-$REPO/target/vm/release/deps}
rc=0
for name in rdma_verbs device; do
    bin=$(ls -t "$DEPS/$name"-* 2>/dev/null | grep -v '\.d$' | head -1)
    [ -n "$bin" ] && [ -x "$bin" ] || { echo "no test binary $DEPS/$name-* (build with tests/vm/cargo-vm.sh test --release -p rdma-verbs --no-run)"; rc=1; continue; }
    echo "== $bin"
    RDMA_VERBS_TEST_DEVICE=rxe0 RDMA_VERBS_TEST_IP=10.77.0.1 timeout 120 "$bin" --test-threads=1 || rc=1
done
exit $rc
