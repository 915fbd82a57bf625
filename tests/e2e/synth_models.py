#!/usr/bin/env python3
"""Small deterministic synthetic GGUF models for the end-to-end RPC tests.

Usage: python3 tests/e2e/synth_models.py [--list] [--only NAME[,NAME...]] OUTDIR

Writes a handful of tiny models (random weights from a fixed seed, a generated tokenizer) that
stock llama.cpp loads and generates from, covering architectures and tensor types that the
gemma-3-270m Q4_K_M test model does not:

  synth-llama-f16        llama, SPM vocab, F16 matrices / F32 norms + output, GQA
  synth-qwen2-q8q4       qwen2, BPE vocab, Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, QKV biases, tied embeddings,
                         n_embd=192 and n_ff=480 (ne0 % 512 != 0 -> INIT_TENSOR / GET_ALLOC_SIZE)
  synth-gpt2-mixed       gpt2, BPE vocab, LayerNorm+bias, GELU, fused QKV, learned positions,
                         F32/F16/Q8_0/MXFP4
  synth-llama-moe-kquant llama MoE (4 experts, 2 used -> MUL_MAT_ID, ARGSORT/TOP_K),
                         Q2_K/Q3_K/Q4_K/Q5_K/Q6_K (crafted blocks), Q6_K token embeddings
  synth-qwen3-iquant     qwen3 (Q/K norm, 8 heads x 64 != n_embd 256), IQ4_NL/IQ4_XS/IQ2_XXS/IQ2_XS/
                         IQ2_S/IQ3_XXS/IQ3_S/IQ1_S (crafted blocks), TQ1_0/TQ2_0, Q8_0, BF16
  synth-mamba            mamba (recurrent: SSM_CONV, SSM_SCAN, recurrent state cache), F32/F16

Models for `rpc-bench load` (not part of "all": written only when named with --only), F16 with
large matrices so that most bytes are in tensors over 10 MiB (the stock client's SET_TENSOR_HASH
threshold), fast to generate:

  synth-llama-load-1g    llama, 6 layers, n_embd 3072, n_ff 8192: 1.21 GB
  synth-llama-load-64m   llama, 1 layer, n_embd 1024, n_ff 8192: 58 MB (rpc-bench load --quick)
  synth-llama-8l         llama, 8 layers, n_embd 256, n_ff 768, F16: a layer split over 4 workers
                         whose tokens take about a millisecond, so that the links weigh
                         (benches/one_endpoint_bench.py --model)

Each file carries the key `synth.fingerprint` (content version + spec); an existing file with the
same fingerprint is kept as is. Prints the absolute paths of the models, one per line, on stdout.
Only stdlib + numpy + gguf (gguf==0.19.0).
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

import gguf
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize

CONTENT_VERSION = 1
T = gguf.GGMLQuantizationType

# ---------------------------------------------------------------------------------------------
# tokenizers

WORDS = """the of and to in is was for on that with as by at from his her it an were are which
this be or has had not but first one their its new after who they have two been she he all
also other more time into most only over city when may made year these than world some during
would later many about where years between under known such three him up then state can while
both used out year hello world capital france paris is the of a model token test rpc server
client graph tensor buffer compute remote local quick brown fox jumps lazy dog once upon there
lived king queen castle river mountain forest small large red green blue black white number
zero four five six seven eight nine ten day night sun moon star water fire earth air""".split()


def _uniq(seq):
    seen, out = set(), []
    for s in seq:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def spm_vocab(n_vocab):
    """llama (SentencePiece) vocab: <unk> <s> </s>, 256 byte tokens, chars and word prefixes."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(gguf.TokenType.BYTE)
        scores.append(0.0)
    pieces = ["\u2581"] + list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()")
    for w in WORDS:
        full = "\u2581" + w
        pieces += [full[:i] for i in range(2, len(full) + 1)]
        pieces += [w[:i] for i in range(2, len(w) + 1)]
    pieces = [p for p in _uniq(pieces) if p not in tokens]
    i = 0
    while len(tokens) + len(pieces) < n_vocab:
        pieces.append("\u2581x%d" % i)
        i += 1
    pieces = pieces[: n_vocab - len(tokens)]
    for k, p in enumerate(pieces):
        tokens.append(p)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(k) if len(p) == 1 else float(len(p)) - k * 1e-3)
    return dict(model="llama", pre=None, tokens=tokens, types=types, scores=scores, merges=None,
                bos=1, eos=2, unk=0, add_bos=True)


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def bpe_vocab(n_vocab, pre):
    """gpt2-style byte-level BPE vocab: 256 byte symbols, left-to-right merges of words."""
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    have = set(tokens)
    sp = b2u[ord(" ")]
    for w in WORDS:
        for word in (sp + w, w):
            cur = word[0]
            for ch in word[1:]:
                nxt = cur + ch
                if nxt not in have:
                    merges.append(cur + " " + ch)
                    tokens.append(nxt)
                    have.add(nxt)
                cur = nxt
    n_special = 2
    tokens = tokens[: n_vocab - n_special]
    merges = [m for m in merges if m.replace(" ", "") in set(tokens)]
    i = 0
    while len(tokens) < n_vocab - n_special:  # pad with unreachable (merge-less) tokens
        tokens.append(sp + "zz%d" % i)
        i += 1
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += ["<|endoftext|>", "<|pad|>"]
    types += [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    eos = len(tokens) - 2
    return dict(model="gpt2", pre=pre, tokens=tokens, types=types, scores=None, merges=merges,
                bos=eos, eos=eos, unk=None, add_bos=False)


def write_vocab(w, v):
    w.add_tokenizer_model(v["model"])
    if v["pre"]:
        w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types([int(t) for t in v["types"]])
    if v["scores"] is not None:
        w.add_token_scores(v["scores"])
    if v["merges"] is not None:
        w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    if v["unk"] is not None:
        w.add_unk_token_id(v["unk"])
    w.add_add_bos_token(v["add_bos"])


# ---------------------------------------------------------------------------------------------
# tensors

# byte offsets of the f16 scale fields of block types we craft from random bytes
_SCALE_FIELDS = {
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,),
    T.IQ3_XXS: (0,), T.IQ3_S: (0,), T.IQ1_S: (0,),
}
# types gguf.quantize() implements (in gguf 0.19.0)
_PY_QUANT = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4, T.BF16}


class TensorMaker:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def make(self, shape, qtype, std=0.05, values=None):
        """shape is numpy order (rows..., ne0). Returns (array, raw_dtype or None)."""
        if qtype == T.F32:
            return (values if values is not None else self.normal(shape, std)).astype(np.float32), None
        if qtype == T.F16:
            return (values if values is not None else self.normal(shape, std)).astype(np.float16), None
        if qtype in _PY_QUANT:
            x = values if values is not None else self.normal(shape, std)
            return quantize(x.astype(np.float32), qtype), qtype
        if qtype in _SCALE_FIELDS:
            return self._crafted(shape, qtype, std), qtype
        raise ValueError("unsupported type %s" % qtype.name)

    def _crafted(self, shape, qtype, std):
        """Random block bytes with sane f16 scales, calibrated so the weights have ~std."""
        bs, ts = GGML_QUANT_SIZES[qtype]
        assert shape[-1] % bs == 0, (shape, qtype.name)
        nb = shape[-1] // bs
        raw = self.rng.integers(0, 256, size=tuple(shape[:-1]) + (nb, ts), dtype=np.uint8)
        flat = raw.reshape(-1, ts)
        fields = _SCALE_FIELDS[qtype]
        jitter = (0.5 + self.rng.random(flat.shape[0], dtype=np.float32)).astype(np.float32)

        def set_scales(mult):
            for off in fields:
                flat[:, off:off + 2] = (jitter * np.float32(mult)).astype(np.float16).view(np.uint8).reshape(-1, 2)

        set_scales(1.0)
        probe = dequantize(flat[: min(64, flat.shape[0])].reshape(-1, ts).copy(), qtype)
        s = float(np.std(probe))
        set_scales(std / s if s > 0 else 1e-3)
        out = raw.reshape(tuple(shape[:-1]) + (nb * ts,))
        assert np.isfinite(dequantize(out.reshape(-1, nb * ts)[:4].copy(), qtype)).all()
        return out


# ---------------------------------------------------------------------------------------------
# model specs


def _transformer_common(w, arch, c, ctx_len):
    w.add_context_length(ctx_len)
    w.add_embedding_length(c["n_embd"])
    w.add_block_count(c["n_layer"])
    w.add_feed_forward_length(c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_head_kv"])
    w.add_rope_freq_base(10000.0)


def build_llama_like(w, tm, c):
    """llama / qwen2 / qwen3 (incl. llama MoE). Tensors in numpy order (rows, ne0)."""
    arch = c["arch"]
    E, F, L = c["n_embd"], c["n_ff"], c["n_layer"]
    hd = c.get("head_dim", E // c["n_head"])
    nq, nkv = hd * c["n_head"], hd * c["n_head_kv"]
    V = len(c["vocab"]["tokens"])
    ty = c["types"]
    _transformer_common(w, arch, c, c.get("ctx", 512))
    w.add_layer_norm_rms_eps(1e-5)
    if "head_dim" in c:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if c.get("n_expert"):
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
    t = {}

    def put(name, shape, qtype, std=0.05, values=None):
        t[name] = tm.make(shape, qtype, std, values)

    put("token_embd.weight", (V, E), ty["embd"], 0.5)
    put("output_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
    if ty.get("output") is not None:
        put("output.weight", (V, E), ty["output"], 0.1)
    for i in range(L):
        p = "blk.%d." % i
        lt = dict(ty, **c["types_odd"]) if i % 2 and c.get("types_odd") else ty
        put(p + "attn_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
        put(p + "attn_q.weight", (nq, E), lt["q"], 0.08)
        put(p + "attn_k.weight", (nkv, E), lt["k"], 0.08)
        put(p + "attn_v.weight", (nkv, E), lt["v"], 0.08)
        if c.get("qkv_bias"):
            put(p + "attn_q.bias", (nq,), T.F32, 0.02)
            put(p + "attn_k.bias", (nkv,), T.F32, 0.02)
            put(p + "attn_v.bias", (nkv,), T.F32, 0.02)
        if arch == "qwen3":
            put(p + "attn_q_norm.weight", (hd,), T.F32, values=1.0 + tm.normal((hd,), 0.1))
            put(p + "attn_k_norm.weight", (hd,), T.F32, values=1.0 + tm.normal((hd,), 0.1))
        put(p + "attn_output.weight", (E, nq), lt["o"], 0.08)
        put(p + "ffn_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
        if c.get("n_expert"):
            X = c["n_expert"]
            put(p + "ffn_gate_inp.weight", (X, E), T.F32, 0.3)
            put(p + "ffn_gate_exps.weight", (X, F, E), lt["gate"], 0.08)
            put(p + "ffn_up_exps.weight", (X, F, E), lt["up"], 0.08)
            put(p + "ffn_down_exps.weight", (X, E, F), lt["down"], 0.08)
        else:
            put(p + "ffn_gate.weight", (F, E), lt["gate"], 0.08)
            put(p + "ffn_up.weight", (F, E), lt["up"], 0.08)
            put(p + "ffn_down.weight", (E, F), lt["down"], 0.08)
    return t


def build_gpt2(w, tm, c):
    E, F, L, ctx = c["n_embd"], c["n_ff"], c["n_layer"], c["ctx"]
    V = len(c["vocab"]["tokens"])
    ty = c["types"]
    _transformer_common(w, "gpt2", c, ctx)
    w.add_layer_norm_eps(1e-5)
    t = {}

    def put(name, shape, qtype, std=0.05, values=None):
        t[name] = tm.make(shape, qtype, std, values)

    put("token_embd.weight", (V, E), ty["embd"], 0.5)
    put("position_embd.weight", (ctx, E), T.F32, 0.1)
    put("output_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
    put("output_norm.bias", (E,), T.F32, 0.02)
    put("output.weight", (V, E), ty["output"], 0.1)
    for i in range(L):
        p = "blk.%d." % i
        put(p + "attn_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
        put(p + "attn_norm.bias", (E,), T.F32, 0.02)
        put(p + "attn_qkv.weight", (3 * E, E), ty["qkv"], 0.08)
        put(p + "attn_qkv.bias", (3 * E,), T.F32, 0.02)
        put(p + "attn_output.weight", (E, E), ty["o"], 0.08)
        put(p + "attn_output.bias", (E,), T.F32, 0.02)
        put(p + "ffn_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
        put(p + "ffn_norm.bias", (E,), T.F32, 0.02)
        put(p + "ffn_up.weight", (F, E), ty["up"], 0.08)
        put(p + "ffn_up.bias", (F,), T.F32, 0.02)
        put(p + "ffn_down.weight", (E, F), ty["down"], 0.08)
        put(p + "ffn_down.bias", (E,), T.F32, 0.02)
    return t


def build_mamba(w, tm, c):
    E, L = c["n_embd"], c["n_layer"]
    DI, DS, DC, R = 2 * E, c["d_state"], c["d_conv"], c["dt_rank"]
    V = len(c["vocab"]["tokens"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(DC)
    w.add_ssm_inner_size(DI)
    w.add_ssm_state_size(DS)
    w.add_ssm_time_step_rank(R)
    w.add_layer_norm_rms_eps(1e-5)
    t = {}

    def put(name, shape, qtype, std=0.05, values=None):
        t[name] = tm.make(shape, qtype, std, values)

    put("token_embd.weight", (V, E), T.F16, 0.5)
    put("output_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
    put("output.weight", (V, E), T.F16, 0.1)
    for i in range(L):
        p = "blk.%d." % i
        put(p + "attn_norm.weight", (E,), T.F32, values=1.0 + tm.normal((E,), 0.1))
        put(p + "ssm_in.weight", (2 * DI, E), T.F16, 0.08)
        put(p + "ssm_conv1d.weight", (DI, DC), T.F32, 0.3)
        put(p + "ssm_conv1d.bias", (DI,), T.F32, 0.05)
        put(p + "ssm_x.weight", (R + 2 * DS, DI), T.F16, 0.08)
        put(p + "ssm_dt.weight", (DI, R), T.F32, 0.2)
        put(p + "ssm_dt.bias", (DI,), T.F32, values=np.float32(-2.0) + tm.normal((DI,), 0.5))
        a = -np.tile(np.arange(1, DS + 1, dtype=np.float32), (DI, 1))  # S4D-real init: A = -(1..N)
        put(p + "ssm_a", (DI, DS), T.F32, values=a)
        put(p + "ssm_d", (DI,), T.F32, values=np.ones(DI, dtype=np.float32))
        put(p + "ssm_out.weight", (E, DI), T.F16, 0.08)
    return t


def specs():
    Q = T
    return {
        "synth-llama-f16": dict(
            arch="llama", builder=build_llama_like, seed=101, vocab=("spm", 512),
            n_embd=128, n_head=4, n_head_kv=2, n_ff=384, n_layer=2, ctx=512,
            types=dict(embd=Q.F16, output=Q.F32, q=Q.F16, k=Q.F16, v=Q.F16, o=Q.F16,
                       gate=Q.F16, up=Q.F16, down=Q.F16)),
        "synth-qwen2-q8q4": dict(
            arch="qwen2", builder=build_llama_like, seed=202, vocab=("bpe:qwen2", 640),
            n_embd=192, n_head=6, n_head_kv=2, n_ff=480, n_layer=3, ctx=512, qkv_bias=True,
            types=dict(embd=Q.Q8_0, output=None, q=Q.Q8_0, k=Q.Q4_0, v=Q.Q4_1, o=Q.Q5_0,
                       gate=Q.Q5_1, up=Q.Q8_0, down=Q.Q4_0)),
        "synth-gpt2-mixed": dict(
            arch="gpt2", builder=build_gpt2, seed=303, vocab=("bpe:gpt-2", 576),
            n_embd=128, n_head=4, n_head_kv=4, n_ff=512, n_layer=2, ctx=256,
            types=dict(embd=Q.F16, output=Q.Q8_0, qkv=Q.F16, o=Q.Q8_0, up=Q.MXFP4, down=Q.F32)),
        "synth-llama-moe-kquant": dict(
            arch="llama", builder=build_llama_like, seed=404, vocab=("spm", 768),
            n_embd=256, n_head=4, n_head_kv=1, n_ff=256, n_layer=2, ctx=512,
            n_expert=4, n_expert_used=2,
            types=dict(embd=Q.Q6_K, output=Q.Q6_K, q=Q.Q4_K, k=Q.Q5_K, v=Q.Q3_K, o=Q.Q2_K,
                       gate=Q.Q4_K, up=Q.Q5_K, down=Q.Q6_K)),
        "synth-qwen3-iquant": dict(
            arch="qwen3", builder=build_llama_like, seed=505, vocab=("bpe:qwen2", 512),
            n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=512, n_layer=2, ctx=512,
            types=dict(embd=Q.IQ4_NL, output=Q.BF16, q=Q.IQ4_XS, k=Q.IQ2_XXS, v=Q.IQ3_S,
                       o=Q.IQ3_XXS, gate=Q.IQ2_XS, up=Q.TQ2_0, down=Q.IQ1_S),
            types_odd=dict(q=Q.IQ2_S, k=Q.TQ1_0, v=Q.IQ4_NL, o=Q.Q8_0, gate=Q.IQ3_S, up=Q.IQ4_XS,
                           down=Q.TQ2_0)),
        "synth-mamba": dict(
            arch="mamba", builder=build_mamba, seed=606, vocab=("bpe:gpt-2", 512),
            n_embd=128, n_layer=2, d_state=16, d_conv=4, dt_rank=8, ctx=1024),
    }


def load_specs():
    """Large models for `rpc-bench load`, kept out of specs() (the end-to-end tests load all of those)."""
    f16 = dict(embd=T.F16, output=T.F16, q=T.F16, k=T.F16, v=T.F16, o=T.F16, gate=T.F16, up=T.F16, down=T.F16)
    return {
        "synth-llama-load-1g": dict(
            arch="llama", builder=build_llama_like, seed=707, vocab=("spm", 512),
            n_embd=3072, n_head=24, n_head_kv=8, n_ff=8192, n_layer=6, ctx=256, types=f16),
        "synth-llama-load-64m": dict(
            arch="llama", builder=build_llama_like, seed=808, vocab=("spm", 512),
            n_embd=1024, n_head=8, n_head_kv=4, n_ff=8192, n_layer=1, ctx=256, types=f16),
        "synth-llama-8l": dict(
            arch="llama", builder=build_llama_like, seed=909, vocab=("spm", 512),
            n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_layer=8, ctx=512, types=f16),
    }


def fingerprint(name, spec):
    s = {k: (v.__name__ if callable(v) else v) for k, v in spec.items()}
    for key in ("types", "types_odd"):
        if key in spec:
            s[key] = {k: (v.name if v is not None else None) for k, v in spec[key].items()}
    blob = json.dumps(dict(v=CONTENT_VERSION, name=name, spec=s, gguf=gguf.GGUF_VERSION),
                      sort_keys=True, default=str)
    return "v%d-%s" % (CONTENT_VERSION, hashlib.sha256(blob.encode()).hexdigest()[:16])


def existing_fingerprint(path):
    try:
        r = gguf.GGUFReader(path)
        f = r.fields.get("synth.fingerprint")
        if f is None:
            return None
        return bytes(f.parts[f.data[0]]).decode()
    except Exception:
        return None


def write_model(path, name, spec):
    fp = fingerprint(name, spec)
    if os.path.exists(path) and existing_fingerprint(path) == fp:
        return False
    kind, n_vocab = spec["vocab"]
    vocab = spm_vocab(n_vocab) if kind == "spm" else bpe_vocab(n_vocab, kind.split(":", 1)[1])
    c = dict(spec, vocab=vocab)
    tmp = path + ".tmp%d" % os.getpid()
    w = gguf.GGUFWriter(tmp, arch=spec["arch"])
    try:
        w.add_name(name)
        w.add_description("synthetic random-weight model for ggml RPC end-to-end tests")
        w.add_string("synth.fingerprint", fp)
        tm = TensorMaker(spec["seed"])
        tensors = spec["builder"](w, tm, c)
        write_vocab(w, vocab)
        for tname, (arr, raw) in tensors.items():
            if raw is None:
                w.add_tensor(tname, arr)
            else:
                w.add_tensor(tname, arr, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    ap.add_argument("--list", action="store_true", help="list model names and exit")
    a = ap.parse_args(argv)
    sp = specs()
    if a.list:
        for n in list(sp) + list(load_specs()):
            print(n)
        return 0
    names = list(sp) if not a.only else [n.strip() for n in a.only.split(",") if n.strip()]
    sp.update(load_specs())
    for n in names:
        if n not in sp:
            ap.error("unknown model %r (have: %s)" % (n, ", ".join(sp)))
    os.makedirs(a.outdir, exist_ok=True)
    for n in names:
        path = os.path.abspath(os.path.join(a.outdir, n + ".gguf"))
        wrote = write_model(path, n, sp[n])
        print("%s %s (%d bytes)" % ("wrote" if wrote else "kept ", path, os.path.getsize(path)),
              file=sys.stderr)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
