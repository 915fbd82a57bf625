#!/usr/bin/env bash
# llama.cpp's op conformance suite (test-backend-ops, mode `test`) against our rpc-server: every
# op/type case compares the RPC device with the local CPU backend. test-backend-ops comes from the
# pinned sdist with patches/test-backend-ops-rpc.patch (registers GGML_RPC_SERVERS endpoints).
# Each op runs in its own test-backend-ops process, so a refused graph (the stock client aborts when
# a server closes the connection) costs one op, not the run; the server is restarted if it died.
#   scripts/test-backend-ops.sh                 every op test-backend-ops knows
#   scripts/test-backend-ops.sh ADD MUL_MAT ... only these ops
#   scripts/test-backend-ops.sh 'MUL_MAT=type_a=(f32|q4_0)'   an op with a -p filter (regex over params)
#   SUBSET=1 scripts/test-backend-ops.sh        the ops llama.cpp's common architectures use (CI)
#   TBO_PARAMS='type=f32' scripts/...           extra -p filter (regex over the case params)
#   SERVER=target/release/rpc-server PORT=50098 THREADS=2 TBO_TIMEOUT=1800
# Prints one line per op and a summary; exits non-zero if any case failed or any op crashed.
# Portable: bash 3.2 and BSD tools (macOS).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER="${SERVER:-target/release/rpc-server}"
PORT="${PORT:-50098}"
THREADS="${THREADS:-2}"
TBO_TIMEOUT="${TBO_TIMEOUT:-1800}"
bin="$(STOCK_PATCHES=patches/test-backend-ops-rpc.patch STOCK_TARGETS=test-backend-ops ./scripts/stock-llama.sh)"
tbo="$bin/test-backend-ops"
logs="$(mktemp -d /tmp/test-backend-ops.XXXXXX)"
echo "test-backend-ops: $tbo; logs in $logs"

# Our rpc-server speaks 8.0.0 on -p; the stock 7.0.0 clients here reach its 7.0.0 listener
# (--proto7-port) on the port they are given, and -p gets port + 7000, which nothing here uses.
# A server without --proto7-port (stock, or ours before 8.0.0) listens with -p.
listen_flags() { # binary port
  case "$("$1" --help 2>&1)" in *--proto7-port*) echo "-p $(($2 + 7000)) --proto7-port $2" ;; *) echo "-p $2" ;; esac
}
# timeout(1) is GNU coreutils (macOS has none; Homebrew's is gtimeout): else the command in the
# background, killed after SECONDS (exit 143 then).
with_timeout() { # SECONDS COMMAND...
  local secs="$1"; shift
  if command -v timeout >/dev/null; then timeout "$secs" "$@"; return; fi
  if command -v gtimeout >/dev/null; then gtimeout "$secs" "$@"; return; fi
  "$@" & local pid=$! waited=0 rc
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((secs * 5)) ]; do sleep 0.2; waited=$((waited + 1)); done
  kill "$pid" 2>/dev/null || true
  wait "$pid" && rc=0 || rc=$?
  return "$rc"
}
server_pid=""
start_server() {
  # shellcheck disable=SC2046
  "$SERVER" -H 127.0.0.1 $(listen_flags "$SERVER" "$PORT") -t "$THREADS" >>"$logs/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server did not start" >&2; exit 1
}
stop_server() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true; }
trap stop_server EXIT
start_server

# The ops of llama.cpp's common architectures (llama, qwen2/3, qwen3-next, gemma, gpt2/oss, mamba,
# rwkv, MoE, vision), with the type grids of the heaviest ones trimmed to common model types.
subset=(
  ADD SUB MUL DIV SCALE ADD_ID ADD1 ACC SQR SQRT CLAMP FILL CUMSUM TRI SOLVE_TRI
  RMS_NORM NORM L2_NORM GROUP_NORM SOFT_MAX DIAG_MASK_INF SUM SUM_ROWS MEAN ARGMAX ARGSORT TOP_K
  'MUL_MAT=type_a=(f32|f16|bf16|q4_0|q8_0|q4_K|q6_K),'
  'MUL_MAT_ID=type_a=(f16|q4_0|q8_0|q4_K|mxfp4),.*,m=512,'
  'GET_ROWS=type=(f32|f16|q4_0|q8_0|q4_K|q6_K),' SET_ROWS
  'CPY=type_src=(f32|f16),type_dst=(f32|f16|q8_0|q4_0),' CONT DUP CONCAT REPEAT PAD
  'ROPE=type=f32,' 'FLASH_ATTN_EXT=hsk=(64|128),.*type_K=(f16|q8_0),'
  SILU GELU GELU_ERF GELU_QUICK SIGMOID TANH EXP SOFTPLUS RELU NEG ABS
  SWIGLU GEGLU GEGLU_ERF REGLU SWIGLU_OAI
  SSM_CONV SSM_SCAN GATED_DELTA_NET RWKV_WKV6 RWKV_WKV7 GATED_LINEAR_ATTN IM2COL UPSCALE
)
if [ "$#" -gt 0 ]; then
  ops=("$@")
elif [ "${SUBSET:-0}" = 1 ]; then
  ops=("${subset[@]}")
else
  ops=()
  while IFS= read -r op; do ops+=("$op"); done < <("$tbo" --list-ops | sed -n 's/^  \([A-Z0-9_]*\)$/\1/p')
fi

total_pass=0; total_cases=0; bad_ops=()
for spec in "${ops[@]}"; do
  op="${spec%%=*}"
  args=(test -b RPC0 -o "$op")
  if [ "$spec" != "$op" ]; then
    args+=(-p "${spec#*=}")
  elif [ -n "${TBO_PARAMS:-}" ]; then
    args+=(-p "$TBO_PARAMS")
  fi
  set +e
  GGML_RPC_SERVERS="127.0.0.1:$PORT" with_timeout "$TBO_TIMEOUT" "$tbo" "${args[@]}" >"$logs/$op.log" 2>&1
  rc=$?
  set -e
  line="$(grep -Eo '[0-9]+/[0-9]+ tests passed' "$logs/$op.log" | tail -1 || true)"
  pass="${line%%/*}"; rest="${line#*/}"; cases="${rest%% *}"
  skipped="$(grep -c 'not supported' "$logs/$op.log" || true)"
  if [ -z "$line" ]; then
    if grep -q "0 tests passed\|No tests" "$logs/$op.log" 2>/dev/null; then pass=0; cases=0; fi
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "  $op: SERVER DIED (see $logs/server.log)"; bad_ops+=("$op"); start_server; continue
  fi
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    if [ -z "$line" ] && [ "$rc" -eq 0 ]; then
      printf '  %-28s no cases\n' "$op"; continue
    fi
    echo "  $op: FAILED (exit $rc, ${line:-no summary}; log $logs/$op.log)"; bad_ops+=("$op")
    [ -n "$pass" ] && { total_pass=$((total_pass + pass)); total_cases=$((total_cases + cases)); }
    continue
  fi
  total_pass=$((total_pass + pass)); total_cases=$((total_cases + cases))
  printf '  %-28s %s (%s skipped: not supported by the CPU reference)\n' "$op" "$line" "$skipped"
done
echo "test-backend-ops against rpc-server: $total_pass/$total_cases cases passed, ${#ops[@]} ops, ${#bad_ops[@]} failed: ${bad_ops[*]:-none}"
[ "${#bad_ops[@]}" -eq 0 ] && [ "$total_pass" -eq "$total_cases" ]
