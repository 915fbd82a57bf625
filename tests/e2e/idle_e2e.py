#!/usr/bin/env python3
"""A long-running `llama-server --rpc` keeps its workers across idle periods, and a worker still
finds a client that vanished without a FIN.

The stock client treats any failed RPC as fatal, so a worker that closed the connection holding the
model kills `llama-server` at the first request after a quiet spell. Cases (each one a fresh
`llama-server` from the stock tools, two greedy /completion requests with an idle period between):

  stock      --rpc <stock ggml-rpc-server>                                         (reference text)
  direct     --rpc <rpc-server --idle-timeout I --keepalive K>, idle > every timeout
  shim       --rpc <rpc-shim, every timeout shortened> -> rpc-server as above
  defaults   rpc-server and rpc-shim with their default flags (idle for --default-idle seconds;
             pass --default-idle 660 to sit past the 600 s default idle timeout by hand)

Both answers of every case must match the stock reference; llama-server, the shim and the worker
must still be alive. Then, unless --no-netns (needs root and iproute2):

  dead peer  a raw client in a network namespace of our own allocates most of the server's
             --max-alloc-total, then its veth is deleted and it is SIGKILLed (no FIN or RST can
             reach the server). With --keepalive K the server must drop it and free its buffer (a
             new client can allocate that memory) within ~2K s; with --keepalive 0 (control) the
             buffer must still be held after the same time: idleness alone never frees a model.

  python3 tests/e2e/idle_e2e.py --stock-bin DIR [--ours PATH] [--shim PATH] [--model GGUF]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import (CACHE, Server, Servers, free_port, log, resolve_ours,  # noqa: E402
                        resolve_stock_bin, tail)
from shim_e2e import Shim, resolve_shim  # noqa: E402

PROMPT = "The fastest way to split a model across machines is"
HELLO, ALLOC_BUFFER = 14, 0


class LlamaServer(Server):
    """A stock llama-server with its model on RPC workers (HTTP on `port`)."""

    def __init__(self, name, binary, port, logdir, model, rpc):
        super().__init__(name, binary, port, logdir)
        self.model, self.rpc = model, rpc

    def cmd(self):
        return [self.binary, "-m", self.model, "-ngl", "99", "--rpc", ",".join(self.rpc), "--host", "127.0.0.1",
                "--port", str(self.port), "-c", "256", "-np", "1", "-t", "1", "--no-warmup"]

    def start(self, timeout=180.0):
        super().start(timeout=timeout)  # listening: the model is still loading
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError("%s exited while loading:\n%s" % (self.name, tail(self.log_path)))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=5) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError("%s not healthy within %.0f s:\n%s" % (self.name, timeout, tail(self.log_path)))

    def complete(self, n_predict, timeout=120.0):
        body = json.dumps({"prompt": PROMPT, "n_predict": n_predict, "temperature": 0, "top_k": 1, "seed": 1,
                           "cache_prompt": False}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/completion" % self.port, data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())["content"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            return None if self.alive() else "<llama-server died: %s>" % e


def frame(cmd, payload):
    return struct.pack("<BQ", cmd, len(payload)) + payload


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed after %d of %d bytes" % (len(b), n))
        b += c
    return b


def try_alloc(host, port, size, keep=False):
    """HELLO + ALLOC_BUFFER(device 0, size) on a fresh connection: (handle, socket or None)."""
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(frame(HELLO, bytes(24)))
    n, = struct.unpack("<Q", recv_exact(s, 8))
    recv_exact(s, n)
    s.sendall(frame(ALLOC_BUFFER, struct.pack("<IQ", 0, size)))
    n, = struct.unpack("<Q", recv_exact(s, 8))
    handle, _ = struct.unpack("<QQ", recv_exact(s, n))
    if keep:
        return handle, s
    s.close()
    return handle, None


# The client that vanishes: allocates, says so, then sits silent holding its buffer.
VANISHING_CLIENT = r"""
import socket, struct, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rx(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c: raise SystemExit("closed")
        b += c
    return b
s = socket.create_connection((host, port), timeout=10)
s.sendall(struct.pack("<BQ", 14, 24) + bytes(24)); rx(s, struct.unpack("<Q", rx(s, 8))[0])
s.sendall(struct.pack("<BQ", 0, 12) + struct.pack("<IQ", 0, size))
h, _ = struct.unpack("<QQ", rx(s, struct.unpack("<Q", rx(s, 8))[0]))
print(h, flush=True)
time.sleep(3600)
"""


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=30, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stdout.strip()))
    return r


def dead_peer_case(ours_bin, workdir, keepalive, wait_s, servers, tag):
    """Returns (ok, detail). The server listens on the host end of a veth pair; the client runs in
    a namespace of ours behind the other end."""
    ns = "rpcidle%d%s" % (os.getpid() % 100000, tag[:1])
    host_if, ns_if = "ri%d%sh" % (os.getpid() % 100000, tag[:1]), "ri%d%sn" % (os.getpid() % 100000, tag[:1])
    net = "10.231.%d." % (77 if keepalive else 78)
    host_ip, ns_ip = net + "1", net + "2"
    total = 64 << 20
    size = 48 << 20  # two of these never fit in the budget at once
    sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", host_if, check=False)
    client = None
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", host_ip + "/30", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", ns_ip + "/30", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        port = free_port()
        srv = servers.add(Server("dead-peer-%s" % tag, ours_bin, port, workdir, threads=1, host=host_ip,
                                 extra=["--max-alloc-total", str(total), "--idle-timeout", "3",
                                        "--keepalive", str(keepalive)]))
        client = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", VANISHING_CLIENT, host_ip,
                                   str(port), str(size)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = client.stdout.readline().strip()
        if not line or line == "0":
            return False, "the namespaced client could not allocate (%r): %s" % (line, client.stderr.read()[-500:])
        held, _ = try_alloc(host_ip, port, size)
        if held != 0:
            return False, "a second %d MiB allocation succeeded while the first was held: budget not enforced" % (
                size >> 20)
        # The peer vanishes: its end of the link goes down (the cable is pulled: the host end
        # keeps its address and routes, but nothing it sends arrives), then the process is
        # killed (its FIN goes nowhere).
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "down")
        os.killpg(client.pid, signal.SIGKILL)
        client.wait(10)
        t0 = time.monotonic()
        freed_after = None
        while time.monotonic() - t0 < wait_s:
            time.sleep(1.0)
            try:
                h, _ = try_alloc(host_ip, port, size)
            except OSError as e:
                return False, "server unreachable after the peer vanished: %s" % e
            if h:
                freed_after = time.monotonic() - t0
                break
        if not srv.alive():
            return False, "server died:\n" + tail(srv.log_path)
        if keepalive:
            if freed_after is None:
                return False, "the vanished client's buffer was still held %.0f s later (keepalive %d s)" % (
                    wait_s, keepalive)
            return True, "buffer freed %.1f s after the peer vanished (keepalive %d s)" % (freed_after, keepalive)
        if freed_after is not None:
            return False, "buffer freed after %.1f s without keepalive: a silent session holding memory " \
                          "was ended by something else" % freed_after
        return True, "without keepalive the buffer is still held after %.0f s (control)" % wait_s
    finally:
        if client and client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
        sh("ip", "link", "del", host_if, check=False)
        sh("ip", "netns", "del", ns, check=False)


def llama_case(name, servers, llama_bin, workdir, model, rpc, n_predict, idle_s, watched):
    """Start llama-server, complete, idle, complete again. Returns (texts, problems)."""
    ls = servers.add(LlamaServer("llama-server-" + name, llama_bin, free_port(), workdir, model, rpc))
    problems, texts = [], []
    try:
        texts.append(ls.complete(n_predict))
        if texts[0] is None:
            problems.append("first request failed:\n" + tail(ls.log_path))
            return texts, problems
        log("  %s: first answer %r; idle %.0f s" % (name, texts[0], idle_s))
        time.sleep(idle_s)
        texts.append(ls.complete(n_predict))
        if texts[1] is None or texts[1].startswith("<llama-server died"):
            problems.append("request after %.0f s idle failed (%s):\n%s" % (idle_s, texts[1], tail(ls.log_path)))
        elif texts[1] != texts[0]:
            problems.append("answer after idle differs: %r vs %r" % (texts[1], texts[0]))
        dead = [p.name for p in [ls] + watched if not p.alive()]
        if dead:
            problems.append("died: " + ", ".join(dead))
        return texts, problems
    finally:
        ls.stop()
        servers.items.remove(ls)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-server (default: $STOCK_BIN "
                    "or scripts/stock-llama.sh)")
    ap.add_argument("--ours", help="rpc-server binary (default: target/release/rpc-server)")
    ap.add_argument("--shim", help="rpc-shim binary (default: target/release/rpc-shim)")
    ap.add_argument("--model", help="GGUF (default: the synthetic llama from synth_models.py)")
    ap.add_argument("-n", "--n-predict", type=int, default=8)
    ap.add_argument("--idle-timeout", type=int, default=3, help="rpc-server --idle-timeout in the shortened "
                    "cases (default 3)")
    ap.add_argument("--keepalive", type=int, default=2, help="rpc-server --keepalive in the shortened cases")
    ap.add_argument("--default-idle", type=float, default=5.0,
                    help="idle seconds in the defaults case (default 5; 660 sits past the default idle timeout)")
    ap.add_argument("--no-netns", action="store_true", help="skip the dead-peer case (needs root and iproute2)")
    ap.add_argument("--only", help="comma-separated cases: stock,direct,shim,defaults,dead-peer")
    ap.add_argument("--workdir", help="logs (default: a fresh temp dir, removed on success)")
    args = ap.parse_args()

    stock_bin = resolve_stock_bin(args.stock_bin, needed=("ggml-rpc-server", "llama-server"))
    ours, shim_bin = resolve_ours(args.ours), resolve_shim(args.shim)
    model = args.model
    if not model:
        synth = os.path.join(CACHE, "models", "synth")
        r = subprocess.run([sys.executable, os.path.join(HERE, "synth_models.py"), synth, "--only", "synth-llama-f16"],
                           stdout=subprocess.PIPE, check=True, text=True, timeout=600)
        model = r.stdout.strip().splitlines()[-1]
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="rpc-idle-e2e-"))
    os.makedirs(workdir, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    want = lambda c: only is None or c in only  # noqa: E731
    llama_bin = os.path.join(stock_bin, "llama-server")
    # Every timeout of the shim and the server, shortened; the idle period sits well past all of them.
    short_server = ["--idle-timeout", str(args.idle_timeout), "--keepalive", str(args.keepalive)]
    short_shim = ["--transport", "tcp", "--connect-timeout", "1", "--handshake-timeout", "2", "--query-timeout", "2"]
    idle_s = 2.5 * max(args.idle_timeout, 2 * args.keepalive, 2)
    log("workdir: %s\nmodel: %s\nidle period: %.0f s (server --idle-timeout %d --keepalive %d)"
        % (workdir, model, idle_s, args.idle_timeout, args.keepalive))
    results, failed = [], False

    def report(case, ok, detail):
        nonlocal failed
        failed |= not ok
        results.append((case, ok, detail))
        log("%s %s: %s" % ("PASS" if ok else "FAIL", case, detail))

    with Servers() as servers:
        ref = None
        cases = [("stock", os.path.join(stock_bin, "ggml-rpc-server"), [], None, idle_s),
                 ("direct", ours, short_server, None, idle_s),
                 ("shim", ours, short_server, short_shim, idle_s),
                 ("defaults", ours, [], [], args.default_idle),
                 ("defaults-shim", ours, [], ["--transport", "tcp"], args.default_idle)]
        for case, binary, sflags, shim_flags, idle in cases:
            if not want(case.split("-")[0]) and not want(case):
                continue
            srv = servers.add(Server("worker-" + case, binary, free_port(), workdir, threads=1, extra=sflags,
                                     env={"RPC_LOG": "info"}))
            watched, rpc = [srv], [srv.endpoint]
            if shim_flags is not None:
                shim = servers.add(Shim("shim-" + case, shim_bin, [free_port()], [srv.endpoint], workdir,
                                        shim_flags))
                watched.append(shim)
                rpc = shim.endpoints()
            texts, problems = llama_case(case, servers, llama_bin, workdir, model, rpc, args.n_predict, idle, watched)
            if not problems and case == "stock":
                ref = texts[0]
            elif not problems and ref is not None and texts[0] != ref:
                problems.append("answer %r differs from the stock server's %r" % (texts[0], ref))
            elif not problems and ref is None:
                problems.append("no stock reference to compare with")
            report(case, not problems, "; ".join(problems) or "both answers identical to stock after %.0f s idle: %r"
                   % (idle, texts[0]))
            for p in watched:
                p.stop()
                servers.items.remove(p)

        if not args.no_netns and (want("dead-peer")):
            if os.geteuid() != 0 or not shutil.which("ip"):
                report("dead-peer", False, "needs root and iproute2 (or pass --no-netns)")
            else:
                wait = 2 * args.keepalive + 4 * max(1, args.keepalive // 6) + 12
                for ka, tag in ((args.keepalive, "keepalive"), (0, "control")):
                    ok, detail = dead_peer_case(ours, workdir, ka, wait, servers, tag)
                    report("dead-peer (%s)" % tag, ok, detail)

    print("\n| case | result | detail |\n|---|---|---|")
    for case, ok, detail in results:
        print("| %s | %s | %s |" % (case, "pass" if ok else "FAIL", detail.splitlines()[0] if detail else ""))
    print("\n%d passed, %d failed" % (sum(1 for r in results if r[1]), sum(1 for r in results if not r[1])))
    if failed:
        log("logs kept in %s" % workdir)
        return 1
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
