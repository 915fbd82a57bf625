#!/usr/bin/env bash
# Prints the RUSTFLAGS of a portable build: a binary that runs on every machine of its
# architecture generation instead of only on CPUs like the build machine's (the default build
# uses -C target-cpu=native, .cargo/config.toml). llama-cpp-sys-2 reads the same target-cpu and
# then builds ggml without GGML_NATIVE, for that baseline.
#   x86_64: x86-64-v3 (AVX2/FMA/F16C/BMI2: Intel Haswell 2013+, AMD Excavator 2015+, Zen)
#   arm64:  nothing, i.e. the target's own baseline (apple-m1 on macOS: every M1..M4 Mac;
#           armv8-a on Linux)
# Used by `PORTABLE=1 scripts/run-server.sh` and the soft-RoCE VM builds (tests/vm/cargo-vm.sh).
set -euo pipefail
case "$(uname -m)" in
  x86_64|amd64) echo "-C target-cpu=x86-64-v3" ;;
  *) echo "" ;;
esac
