#!/usr/bin/env python3
"""What containment (a process per session, `rpc-server`'s default) costs: connection set-up,
model load, memory.

Three servers side by side, each with `-t 1`: ours with `--no-isolate`, ours (contained), and
the stock ggml-rpc-server. Alternating rounds (the order rotates every round):

  connect   a client connects, sends HELLO and one DEVICE_COUNT and waits for the reply, 30 times
            per round; median milliseconds (contained, this includes starting the session
            process, which answers the HELLO)
  load      stock `llama-completion -n 1` with the model on the server (`-ngl 99`): the client's own
            "load time" (model load incl. every tensor upload) from its perf summary, median ms
  memory    during one generation: resident KiB of the server process, and when contained of
            the session processes (its children) too

  python3 benches/isolate_cost.py --stock-bin DIR [--ours target/release/rpc-server] \\
      [--model gemma|PATH] [--rounds 4]

stdlib only. Prints the machine's load average before and after: quote figures from an idle run.
"""

import argparse
import os
import re
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import (Server, Servers, free_port, log, resolve_ours, resolve_stock_bin,  # noqa: E402
                        script_output)

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HELLO, DEVICE_COUNT = 14, 15
LOAD_RE = re.compile(rb"load time\s*=\s*([0-9.]+) ms")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise OSError("closed")
        b += c
    return b


def connect_ms(endpoint):
    """Connect, HELLO, DEVICE_COUNT: milliseconds until the DEVICE_COUNT reply."""
    host, port = endpoint.rsplit(":", 1)
    t = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(struct.pack("<BQ", HELLO, 24) + bytes(24))
        n = struct.unpack("<Q", recv_exact(s, 8))[0]
        recv_exact(s, n)
        s.sendall(struct.pack("<BQ", DEVICE_COUNT, 0))
        n = struct.unpack("<Q", recv_exact(s, 8))[0]
        recv_exact(s, n)
    return 1000 * (time.perf_counter() - t)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid):
    out = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


class PeakRss:
    """Peak resident KiB of a process and of its children, sampled every 50 ms."""

    def __init__(self, pid):
        self.pid, self.front, self.sessions = pid, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            self.front = max(self.front, rss_kib(self.pid))
            self.sessions = max(self.sessions, sum(rss_kib(c) for c in children(self.pid)))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *a):
        self._stop.set()
        self._t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-completion")
    ap.add_argument("--model", default="gemma", help="'gemma' (the test model) or a .gguf path")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--connects", type=int, default=30, help="connections per server per round")
    args = ap.parse_args()
    stock_bin = resolve_stock_bin(args.stock_bin, needed=("ggml-rpc-server", "llama-completion"))
    ours = resolve_ours(args.ours)
    model = script_output("test-model.sh", 1800) if args.model == "gemma" else args.model
    logdir = os.path.join(REPO, "target", "bench-logs")
    os.makedirs(logdir, exist_ok=True)
    load_before = loadavg()
    kinds = [("ours --no-isolate", ours, ["--no-isolate"]), ("ours", ours, []),
             ("stock", os.path.join(stock_bin, "ggml-rpc-server"), [])]
    conn = {k[0]: [] for k in kinds}
    load = {k[0]: [] for k in kinds}
    mem = {k[0]: (0, 0) for k in kinds}
    with Servers() as servers:
        srv = {name: servers.add(Server("isolate-cost-" + name.replace(" ", ""), b, free_port(), logdir,
                                        threads=1, extra=extra))
               for name, b, extra in kinds}
        for rnd in range(args.rounds):
            order = kinds[rnd % 3:] + kinds[:rnd % 3]
            for name, _, _ in order:
                s = srv[name]
                s.ensure()
                conn[name] += [connect_ms(s.endpoint) for _ in range(args.connects)]
                cmd = [os.path.join(stock_bin, "llama-completion"), "-m", model, "--rpc", s.endpoint,
                       "-ngl", "99", "-p", "Hello", "-n", "16", "-t", "1", "--temp", "0", "-no-cnv",
                       "--simple-io"]
                with PeakRss(s.proc.pid) as peak:
                    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, timeout=600)
                m = LOAD_RE.search(r.stderr)
                if r.returncode != 0 or not m:
                    print("llama-completion failed against %s:\n%s" % (name, r.stderr[-2000:].decode(
                        errors="replace")), file=sys.stderr)
                    return 1
                load[name].append(float(m.group(1)))
                mem[name] = (max(mem[name][0], peak.front), max(mem[name][1], peak.sessions))
            log("round %d/%d done" % (rnd + 1, args.rounds))
    med = statistics.median
    print("\nModel: %s; %d rounds; load average before %.2f, after %.2f; %d cores\n" % (
        os.path.basename(model), args.rounds, load_before, loadavg(), os.cpu_count() or 0))
    print("| server | connect + HELLO + DEVICE_COUNT, ms (median, p90) | model load, ms (median) | "
          "peak RSS front KiB | peak RSS session processes KiB |")
    print("|---|---|---|---|---|")
    for name, _, _ in kinds:
        c = sorted(conn[name])
        print("| %s | %.2f, %.2f | %.0f | %d | %s |" % (
            name, med(c), c[int(0.9 * (len(c) - 1))], med(load[name]), mem[name][0],
            mem[name][1] if name == "ours" else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
