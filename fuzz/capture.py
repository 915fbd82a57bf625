#!/usr/bin/env python3
"""Seed corpus for the `session` and `graph` fuzz targets from real client traffic.

Runs a stock llama.cpp client (llama-completion) against a server through a recording proxy,
then converts every recorded connection into the symbolic input format of
fuzz_targets/common/mod.rs: buffer handles become 1-based allocation indices, tensor data
addresses become offsets from their buffer's base, and large SET_TENSOR payloads are trimmed.
Every GRAPH_COMPUTE is also written as a `graph` seed (relative to its own buffers).

  fuzz/capture.py --stock-bin DIR --server target/release/rpc-server --model M.gguf --out fuzz/seeds

Default model: the smallest synthetic model of tests/e2e (~/.cache/ggml-rpc-rs/synth-models).
"""
import argparse
import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time

RT = 296  # sizeof(rpc_tensor)
HAS_RESPONSE = {0: 16, 1: 8, 2: 8, 3: 8, 7: 1, 8: None, 9: 1, 11: 16, 13: 8, 14: 28, 15: 4}
KEEP_DATA = 256  # SET_TENSOR payload bytes kept per command


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Proxy:
    """Forwards 127.0.0.1:port -> target, recording both directions of every connection."""

    def __init__(self, target):
        self.target = target
        self.port = free_port()
        self.conns = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            rec = {"c2s": bytearray(), "s2c": bytearray()}
            self.conns.append(rec)
            for a, b, k in ((c, s, "c2s"), (s, c, "s2c")):
                threading.Thread(target=self._pump, args=(a, b, rec[k]), daemon=True).start()

    @staticmethod
    def _pump(src, dst, buf):
        try:
            while True:
                d = src.recv(1 << 16)
                if not d:
                    break
                buf.extend(d)
                dst.sendall(d)
        except OSError:
            pass
        for x in (src, dst):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def convert(rec):
    """One recorded connection -> (session seed bytes, [graph seed bytes])."""
    c2s, s2c = bytes(rec["c2s"]), bytes(rec["s2c"])
    i = j = 0
    handles = {}  # real handle -> index
    bases = {}  # index -> base
    out = bytearray()
    graphs = []

    def sym_tensor(t):
        t = bytearray(t)
        buf = struct.unpack_from("<Q", t, 12)[0]
        data = struct.unpack_from("<Q", t, 220)[0]
        if buf in handles:
            idx = handles[buf]
            struct.pack_into("<Q", t, 12, idx)
            struct.pack_into("<Q", t, 220, (data - bases.get(idx, 0)) & (2**64 - 1) if data else 0)
        return bytes(t)

    while i + 9 <= len(c2s):
        cmd = c2s[i]
        size = struct.unpack_from("<Q", c2s, i + 1)[0]
        p = bytearray(c2s[i + 9:i + 9 + size])
        i += 9 + size
        rsp = None
        want = HAS_RESPONSE.get(cmd, 0)
        if cmd == 8:
            want = struct.unpack_from("<Q", p, RT + 8)[0]
        if want:
            n = struct.unpack_from("<Q", s2c, j)[0]
            rsp = s2c[j + 8:j + 8 + n]
            j += 8 + n
        if cmd == 14:
            continue  # HELLO: the connection layer's business
        if cmd in (3, 4, 5):
            h = struct.unpack_from("<Q", p, 0)[0]
            struct.pack_into("<Q", p, 0, handles.get(h, h))
        elif cmd in (6, 7, 8, 12, 17):
            p[0:RT] = sym_tensor(p[0:RT])
            if cmd == 6 and len(p) > 305 + KEEP_DATA:
                p = p[:305 + KEEP_DATA]
        elif cmd == 9:
            p[0:RT] = sym_tensor(p[0:RT])
            p[RT:2 * RT] = sym_tensor(p[RT:2 * RT])
        elif cmd == 13:
            for k in range(11):
                a = 4 + k * RT
                p[a:a + RT] = sym_tensor(p[a:a + RT])
        elif cmd == 10:
            n_nodes = struct.unpack_from("<I", p, 4)[0]
            at = 8 + 8 * n_nodes + 4
            n = (len(p) - at) // RT
            for k in range(n):
                a = at + k * RT
                p[a:a + RT] = sym_tensor(p[a:a + RT])
            graphs.append(bytes(p))
        out += bytes([cmd]) + struct.pack("<I", len(p)) + p
        if cmd == 0 and rsp and struct.unpack_from("<Q", rsp, 0)[0]:
            handles[struct.unpack_from("<Q", rsp, 0)[0]] = len(handles) + 1
        if cmd == 3 and rsp:
            bases[struct.unpack_from("<Q", p, 0)[0]] = struct.unpack_from("<Q", rsp, 0)[0]
    return bytes(out), graphs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock-bin", required=True)
    ap.add_argument("--server", default="target/release/rpc-server")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/ggml-rpc-rs/synth-models/synth-llama-f16.gguf"))
    ap.add_argument("--out", default="fuzz/seeds")
    args = ap.parse_args()

    port = free_port()
    srv = subprocess.Popen([args.server, "-p", str(port), "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.1)
        proxy = Proxy(("127.0.0.1", port))
        cli = [os.path.join(args.stock_bin, "llama-completion"), "-m", args.model, "--rpc", f"127.0.0.1:{proxy.port}",
               "-ngl", "99", "-n", "4", "-p", "hello", "-no-cnv", "--temp", "0", "-t", "1"]
        subprocess.run(cli, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        time.sleep(0.5)
    finally:
        srv.terminate()
        srv.wait()
    os.makedirs(os.path.join(args.out, "session"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "graph"), exist_ok=True)
    n_s = n_g = 0
    for rec in proxy.conns:
        seed, graphs = convert(rec)
        if seed:
            name = hashlib.sha1(seed).hexdigest()[:16]
            open(os.path.join(args.out, "session", name), "wb").write(seed)
            n_s += 1
        for g in graphs:
            name = hashlib.sha1(g).hexdigest()[:16]
            open(os.path.join(args.out, "graph", name), "wb").write(g)
            n_g += 1
    print(f"{len(proxy.conns)} connections recorded: {n_s} session seeds, {n_g} graph seeds in {args.out}")


if __name__ == "__main__":
    sys.exit(main())
