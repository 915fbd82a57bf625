#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine or a fresh Mac: installs what it needs,
# builds, runs unit and raw-protocol tests, builds the stock llama.cpp tools (cached in ~/.cache),
# and runs the end-to-end equivalence tests against stock llama.cpp. On macOS it runs every suite
# that applies and prints one `skip:` line, with the reason, for each one that does not.
#   QUICK=1 scripts/test.sh        fewer end-to-end cases
#   TEST_PLAN=1 scripts/test.sh    print what would run and what would be skipped on this OS, run nothing
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
OS="$(uname -s)"
PLAN="${TEST_PLAN:-0}"
step() { printf '\n=== %s [%s, +%d s] ===\n' "$*" "$(date +%T)" $((SECONDS - t0)); }
# suite TITLE [linux:REASON] -- COMMAND...: runs COMMAND under a step line; a suite marked
# linux:REASON is skipped elsewhere with one line saying why.
suite() {
  local title="$1"; shift
  if [ "${1:-}" != -- ]; then
    local reason="${1#linux:}"; shift
    if [ "$OS" != Linux ]; then echo "skip: $title ($reason)"; return 0; fi
  fi
  shift
  step "$title"
  if [ "$PLAN" = 1 ]; then echo "run: $*"; return 0; fi
  "$@"
}
VM="Linux-only: the soft-RoCE VM is QEMU with the Linux kernel's rdma_rxe"

suite "dependencies" -- ./scripts/deps.sh
suite "format (cargo fmt --check)" -- cargo fmt --all --check
suite "format of the fuzz crate (fuzz/ is its own workspace: cargo fmt --manifest-path fuzz/Cargo.toml --check)" -- \
  cargo fmt --manifest-path fuzz/Cargo.toml --check
suite "ARCHITECTURE.md names every source file once, and only paths that exist (scripts/file-index.py --check)" -- \
  python3 scripts/file-index.py --check
suite "the crates' modules import each other in no cycle (scripts/module-graph.py --check)" -- \
  python3 scripts/module-graph.py --check
suite "build" -- cargo build --release --workspace --all-targets
suite "lints (cargo clippy --workspace --all-targets -- -D warnings)" -- \
  cargo clippy --release --workspace --all-targets -- -D warnings
# The fuzz crate on the stable toolchain, in the workspace's target directory and profile, so it
# reuses the dependencies (ggml included) the lines above built; only libfuzzer-sys and the crate
# itself are new. (The smoke run's own directory holds nightly ASan builds, which stable cannot reuse.)
suite "lints of the fuzz crate (cargo clippy --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings)" -- \
  env CARGO_PROFILE_RELEASE_DEBUG=1 cargo clippy --release --manifest-path fuzz/Cargo.toml --target-dir target --all-targets -- -D warnings
suite "unit and protocol tests" -- cargo test --release --workspace
suite "script tests: build-deps.sh, run-server.sh, deps.sh and test.sh's plan under a faked OS (macOS and Linux branches; first command on a fresh Mac: Command Line Tools only, Homebrew, Homebrew Python, no Command Line Tools)" -- \
  python3 tests/scripts/test_build_deps.py
suite "script tests: scripts/service.sh (launchd daemon and agent plists via plistlib, systemd unit via systemd-analyze verify, install/restart/uninstall under a faked OS)" -- \
  python3 tests/scripts/test_service.py --bin target/release/rpc-server
suite "script tests: the Mac path's scripts portable to bash 3.2 and BSD tools (lint; run with a Mac's tools only; under a real bash 3.2 when cached)" -- \
  python3 tests/scripts/test_portable.py --bin target/release/rpc-server
suite "script tests: the macOS CI workflow (.github/workflows/, GitHub's workflow schema, the jobs' steps)" -- \
  python3 tests/scripts/test_workflow.py
if [ "$PLAN" = 1 ]; then
  STOCK_BIN="<stock-bin>"; STOCK_BIN8="<stock-bin8>"
else
  step "stock llama.cpp tools (protocol 7.0.0 and 8.0.0) and test model"
  STOCK_BIN="$(./scripts/stock-llama.sh)"
  STOCK_BIN8="$(STOCK_PROTO=8 ./scripts/stock-llama.sh)"
  MODEL="$(./scripts/test-model.sh)"
  echo "stock tools: $STOCK_BIN"; echo "stock 8.0 tools: $STOCK_BIN8"; echo "model: $MODEL"
fi
e2e_args=(--ours target/release/rpc-server --stock-bin "$STOCK_BIN")
[ "${QUICK:-0}" = 1 ] && e2e_args+=(--quick)
suite "end to end against stock llama.cpp" -- python3 tests/e2e/run_e2e.py "${e2e_args[@]}"
suite "rpc-shim end to end over TCP (stock TCP-only llama.cpp -> rpc-shim -> rpc-server)" -- \
  python3 tests/e2e/shim_e2e.py --shim target/release/rpc-shim --ours target/release/rpc-server --stock-bin "$STOCK_BIN" --quick
idle_args=(--stock-bin "$STOCK_BIN" --ours target/release/rpc-server --shim target/release/rpc-shim)
if [ "$OS" != Linux ]; then
  echo "skip: idle and dead clients, the dead-peer case (Linux-only: it needs a network namespace)"
  idle_args+=(--no-netns)
fi
suite "idle and dead clients: stock llama-server across idle periods (direct, through rpc-shim), a peer that vanishes without a FIN" -- \
  python3 tests/e2e/idle_e2e.py "${idle_args[@]}"
suite "metrics: rpc-server --metrics scraped during a stock llama-completion run, against a frame-counting proxy" -- \
  python3 tests/e2e/metrics_e2e.py --stock-bin "$STOCK_BIN" --ours target/release/rpc-server
suite "weights from the worker's disk: stock llama-completion against rpc-server --gguf (identical output, weights over 10 MiB not uploaded)" -- \
  python3 tests/e2e/gguf_e2e.py --stock-bin "$STOCK_BIN" --ours target/release/rpc-server
suite "protocol 8.0.0: stock 8.0 clients against rpc-server (layer and tensor split, llama-server), a 7.0 client on --proto7-port of the same process, both version mismatches" -- \
  python3 tests/e2e/proto8_e2e.py --ours target/release/rpc-server --stock-bin "$STOCK_BIN8" --stock7-bin "$STOCK_BIN"
suite "one endpoint over many workers (rpc-shim --one-endpoint): layer and tensor split, text identical to separate endpoints, no hidden state through the client" -- \
  python3 tests/e2e/endpoint_e2e.py --ours target/release/rpc-server --shim target/release/rpc-shim --stock-bin "$STOCK_BIN8"
load_bench() {
  local m
  m="$(python3 tests/e2e/synth_models.py --only synth-llama-load-64m "${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models/synth")"
  target/release/rpc-bench load --model "$m" --bin "$STOCK_BIN" --links none,2.5gbe --no-progress --workdir target/rpc-bench-load
}
suite "model load benchmark, small mode (rpc-bench load: stock and ours, cold, warm, --gguf; 58 MB synthetic model over loopback and emulated 2.5 GbE)" -- load_bench
suite "compromised session: a payload (LD_PRELOAD) attacks from inside one sandboxed session process (signals, cache, symlinks, terminal, chmod, control-line flood, early thread, memory, devices, network, the link broker, staging memory); bystander output byte-identical, front serving" "linux:Linux-only: LD_PRELOAD, seccomp and /proc" -- python3 tests/compromise/compromise_e2e.py --ours target/release/rpc-server --stock-bin "$STOCK_BIN"
suite "RDMA end to end in a soft-RoCE VM (stock llama.cpp RDMA clients, both flavors, Apple's verbs)" "linux:$VM" -- \
  tests/vm/test-rdma.sh
# The link suite's reference and its RDMA cases with 8 tokens (the --transport tcp baseline and
# upstream RC between two of ours run with tests/vm/test-link.sh alone).
suite "tensor split's server-to-server link over RDMA in the soft-RoCE VM (stock 8.0 client; ours x2 lean RC and UC, ours with a stock RDMA server in either rank, a TCP fallback, through rpc-shim, through rpc-shim --one-endpoint with the copies over LINK_*; same text as stock x2, nothing on the link's TCP after set-up)" "linux:$VM" -- \
  env E2E_N=8 E2E_ONLY="ours2 ours2-uc stock0-ours1 ours0-stock1 fallback shim one-endpoint" tests/vm/test-link.sh
suite "lean RDMA framing in the soft-RoCE VM (per-token SENDs/packets: stock flavors vs rpc-shim lean; fallbacks)" "linux:$VM" -- \
  tests/vm/test-lean.sh
hostile() {
  STOCK_BIN="$STOCK_BIN" HOSTILE_NO_BUILD=1 cargo test --release -p rpc-tests --test hostile -- --ignored --nocapture \
    2>&1 | grep -E "^(test |churn|stock server)|passed|FAILED|panicked"
}
suite "hostile inputs: the same suite against the stock server (comparison), churn during real generation" -- hostile
suite "op conformance: llama.cpp test-backend-ops against rpc-server (ops of common architectures)" -- \
  env SUBSET=1 ./scripts/test-backend-ops.sh
suite "fuzzing smoke run (codec, graph, session, ops; ${FUZZ_SECONDS:-15} s each)" -- fuzz/smoke.sh
step "all tests passed"
