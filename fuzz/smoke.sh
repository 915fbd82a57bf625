#!/usr/bin/env bash
# Bounded fuzzing smoke run of every target (default 15 s each), from the committed seed corpus.
# Builds the targets the first time (cargo-fuzz, nightly; ggml compiled with AddressSanitizer, which
# takes a while once and is cached in ~/.cache/ggml-rpc-rs/fuzz-target, FUZZ_TARGET_DIR to change). A crash, a leak report or a timeout fails.
#   FUZZ_SECONDS=600 fuzz/smoke.sh            longer run
#   fuzz/smoke.sh graph                      one target
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_EACH="${FUZZ_SECONDS:-15}"
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(codec graph session ops)
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal >&2
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz >&2
# ggml's C/C++ code is instrumented too, so an out-of-bounds access inside a kernel is reported.
export CFLAGS="-fsanitize=address -fno-omit-frame-pointer" CXXFLAGS="-fsanitize=address -fno-omit-frame-pointer"
# Built outside the clone (keyed by nothing but the sources: cargo rebuilds what changed), so a
# fresh checkout does not recompile llama.cpp with ASan every time.
TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/ggml-rpc-rs/fuzz-target}"
mkdir -p "$TARGET_DIR"
cargo +nightly fuzz build -O --target-dir "$TARGET_DIR" >&2
for t in "${targets[@]}"; do
  corpus="corpus/$t"
  mkdir -p "$corpus"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  echo "fuzz: $t for ${SECONDS_EACH}s"
  # -rss_limit_mb: ggml's CPU kernels allocate work buffers; 4 GiB keeps real leaks visible.
  log="$(mktemp)"
  rc=0
  cargo +nightly fuzz run -O --target-dir "$TARGET_DIR" "$t" "$corpus" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=4096 -max_len=262144 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+ *DONE|^==[0-9]+==|^SUMMARY|panicked|Test unit written" "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "fuzz target $t failed (exit $rc); full log: $log" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  rm -f "$log"
done
