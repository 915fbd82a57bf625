#!/usr/bin/env bash
# cargo for binaries that must run inside the soft-RoCE VM.
#
# The workspace builds with `-C target-cpu=native` (.cargo/config.toml); on an
# AVX-512 host that yields instructions QEMU's TCG `-cpu max` does not
# emulate (the guest CPU is x86-64-v3: AVX2/FMA/BMI2, no AVX-512) and the
# binary dies with SIGILL (exit 132) in the VM.  This wrapper builds into a
# separate target dir (target/vm, so the shared target/ is not rebuilt) with
# the portable flags (scripts/portable-rustflags.sh: `-C target-cpu=x86-64-v3` on
# x86_64), which llama-cpp-sys-2 also applies to ggml (GGML_NATIVE off, -march=x86-64-v3).
#
#   tests/vm/cargo-vm.sh build --release -p rdma-verbs --examples
#   -> target/vm/release/examples/pingpong
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CARGO_TARGET_DIR=${RVM_CARGO_TARGET_DIR:-$ROOT/target/vm}
export RUSTFLAGS="${RVM_RUSTFLAGS:-$("$ROOT/scripts/portable-rustflags.sh")}"
cd "$ROOT"
exec cargo "$@"
