#!/usr/bin/env python3
"""`rpc-server --gguf <the model>`: a stock client's weights come from the worker's own disk.

Stock `llama-completion --rpc` generates greedily with the test model through a frame-counting
proxy (e2e_common.CountingProxy) to our server, without `--gguf` and with `--gguf <the model>`
(its index in a fresh LLAMA_CACHE), in alternating rounds; `--link-mbit` paces the client's
uploads to a link's bandwidth. Checks:
- the generated text is identical with and without `--gguf`;
- with `--gguf`, SET_TENSOR carried fewer bytes than without by at least the size of every tensor
  of the model over the 10 MiB hashing threshold (read with the `gguf` package), i.e. those
  weights were not uploaded, and SET_TENSOR_HASH was asked for each of them;
- the server wrote no weight-cache entry (nothing copied into the cache directory).
Prints the client's model load time (its `load time`, median per mode) and the bytes saved.
'N passed, N failed'.

  python3 tests/e2e/gguf_e2e.py --stock-bin DIR [--ours PATH] [--model GGUF] [--rounds N] [--link-mbit M]
"""

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (Checks, CountingProxy, Server, Servers, add_completion_args,  # noqa: E402
                        completion_cmd, free_port, log, resolve_completion, run)

PROMPT = "The capital of France is"
N_PREDICT = 16
HASH_THRESHOLD = 10 * 1024 * 1024


class _Paced:
    """A socket whose sendall paces the bytes to `rate` bytes/s (a link's bandwidth, no latency)."""

    def __init__(self, sock, rate):
        self.sock, self.rate, self.t = sock, rate, time.monotonic()

    def sendall(self, data):
        self.t = max(self.t, time.monotonic()) + len(data) / self.rate
        self.sock.sendall(data)
        d = self.t - time.monotonic()
        if d > 0:
            time.sleep(d)

    def __getattr__(self, k):
        return getattr(self.sock, k)


class LinkProxy(CountingProxy):
    """CountingProxy whose client-to-server direction runs at `mbit` Mbit/s (0: unpaced)."""

    def __init__(self, target_port, mbit):
        self.rate = mbit * 1e6 / 8
        super().__init__(target_port)

    def _pump(self, src, dst, attr, state):
        if attr == "up" and self.rate > 0:
            dst = _Paced(dst, self.rate)
        super()._pump(src, dst, attr, state)


def big_tensor_bytes(model):
    """Bytes and count of the model's tensors over the client's hashing threshold."""
    import gguf
    r = gguf.GGUFReader(model)
    big = [int(t.n_bytes) for t in r.tensors if int(t.n_bytes) > HASH_THRESHOLD]
    return sum(big), len(big)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_completion_args(ap)
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (load times: median)")
    ap.add_argument("--link-mbit", type=float, default=0,
                    help="pace the client's uploads to this many Mbit/s (a link's bandwidth; default: loopback)")
    a = ap.parse_args()
    stock, ours, model = resolve_completion(a)
    big_bytes, big_count = big_tensor_bytes(model)
    work = tempfile.mkdtemp(prefix="gguf-e2e-")
    cache = os.path.join(work, "llama-cache")
    check = Checks()

    results = {"plain": [], "gguf": []}
    with Servers() as servers:
        srv = {
            "plain": servers.add(Server("plain", ours, free_port(), work, threads=2,
                                        env={"LLAMA_CACHE": cache})),
            "gguf": servers.add(Server("gguf", ours, free_port(), work, threads=2,
                                       extra=["--gguf", model], env={"LLAMA_CACHE": cache})),
        }
        for rnd in range(a.rounds):
            for mode in ("plain", "gguf"):
                proxy = LinkProxy(srv[mode].port, a.link_mbit)
                cmd = completion_cmd(stock, model, PROMPT, N_PREDICT, proxy.endpoint)
                rc, out, err, dt = run(cmd, timeout=600, err_path=os.path.join(work, "%s-%d.err" % (mode, rnd)))
                proxy.close()
                m = re.search(rb"load time =\s*([\d.]+) ms", err)
                cmds = {k: tuple(v) for k, v in proxy.commands.items()}
                results[mode].append({"rc": rc, "out": out, "load_ms": float(m.group(1)) if m else None,
                                      "wall": dt, "cmds": cmds})
                log("%s round %d: rc=%s load %s ms, wall %.1f s, SET_TENSOR %s, SET_TENSOR_HASH %s"
                    % (mode, rnd, rc, m and m.group(1).decode(), dt, cmds.get("SET_TENSOR"),
                       cmds.get("SET_TENSOR_HASH")))

    plain, withg = results["plain"], results["gguf"]
    check("llama-completion succeeded in every run", all(r["rc"] == 0 for r in plain + withg),
          "rcs %s" % [r["rc"] for r in plain + withg])
    ref = plain[0]["out"]
    check("output identical with and without --gguf (%d runs)" % (len(plain) + len(withg)),
          all(r["out"] == ref for r in plain + withg) and PROMPT.encode() in ref,
          "\nplain: %r\ngguf:  %r" % (ref[-200:], withg[0]["out"][-200:]))
    set_plain = plain[0]["cmds"].get("SET_TENSOR", (0, 0))[1]
    for i, r in enumerate(withg):
        set_g = r["cmds"].get("SET_TENSOR", (0, 0))[1]
        hashes = r["cmds"].get("SET_TENSOR_HASH", (0, 0))[0]
        check("round %d: SET_TENSOR bytes with --gguf %d <= without %d - %d (%d tensors over 10 MiB)"
              % (i, set_g, set_plain, big_bytes, big_count),
              big_count > 0 and set_g <= set_plain - big_bytes)
        check("round %d: SET_TENSOR_HASH asked for each of them (%d)" % (i, hashes), hashes >= big_count)
    rpc_dir = os.path.join(cache, "rpc")
    entries = [n for n in (os.listdir(rpc_dir) if os.path.isdir(rpc_dir) else []) if len(n) == 16]
    check("no weight-cache entry written (%s)" % (entries or "none"), not entries)
    check("the index was persisted (%s)" % os.path.join(rpc_dir, "gguf-index"),
          os.path.isfile(os.path.join(rpc_dir, "gguf-index")))

    def med(rs, k):
        v = [r[k] for r in rs if r[k] is not None]
        return statistics.median(v) if v else float("nan")
    log("model load (client's load time, median of %d, %s): without --gguf %.0f ms, with %.0f ms; "
        "wall %.1f s vs %.1f s; %d MiB not uploaded"
        % (a.rounds, "uplink %g Mbit/s" % a.link_mbit if a.link_mbit else "loopback",
           med(plain, "load_ms"), med(withg, "load_ms"),
                                                       med(plain, "wall"), med(withg, "wall"), big_bytes >> 20))
    shutil.rmtree(work, ignore_errors=True)
    return check.summary()


if __name__ == "__main__":
    sys.exit(main())
