#!/usr/bin/env python3
"""What a client's first command costs on a fresh connection: our rpc-server contained (a session
process started for the connection), with a pool of pre-started session processes
(`--session-pool N`), and with `--no-isolate` (no session process: the floor), optionally beside
the stock ggml-rpc-server; all built from one binary, all in one run, in turn.

  first command  a fresh connection, HELLO (7.0.0 port), then ALLOC_BUFFER (1 MiB): the front
                 hands the connection to a session process at that command, so its round trip
                 holds the session's start (contained), or the hand-off to a waiting one
                 (pooled); the variants take turns connection by connection
  spaced         --gap ms between connections (default 150: the previous session has ended and
                 a pool has refilled)
  burst          --burst connections back to back (as a stock client's model load opens a dozen
                 in a row): a pool of N serves the first N from waiting processes

  python3 benches/session_start.py [--ours target/release/rpc-server] [--variant LABEL=ARGS ...] \\
      [--stock-bin DIR] [--rounds 4] [--connects 40] [--burst 8]

Default variants: `contained=` (no flag), `pool1=--session-pool 1`, `no-isolate=--no-isolate`.
stdlib only. Prints the load average before each round and after: quote it with the figures.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import first_command_ms, free_port, resolve_ours, wait_port  # noqa: E402



def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def summary(v):
    q = lambda f: sorted(v)[int(f * (len(v) - 1))]
    return "n=%3d  median %7.2f  p10 %7.2f  p90 %7.2f  min %7.2f" % (
        len(v), statistics.median(v), q(.1), q(.9), min(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", help="rpc-server binary (default: target/release/rpc-server)")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=EXTRA ARGS for our server (repeatable)")
    ap.add_argument("--stock-bin", help="also the stock ggml-rpc-server (7.0.0) in this directory")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--connects", type=int, default=40, help="spaced connections per variant per round")
    ap.add_argument("--gap", type=float, default=150, help="ms between spaced connections")
    ap.add_argument("--burst", type=int, default=8, help="back-to-back connections per variant per round (0: none)")
    a = ap.parse_args()
    ours = resolve_ours(a.ours)
    variants = a.variant or ["contained=", "pool1=--session-pool 1", "no-isolate=--no-isolate"]
    procs, ports = [], {}
    print("load before: %s" % loadavg(), flush=True)
    try:
        for v in variants:
            label, _, extra = v.partition("=")
            p7, p8 = free_port(), free_port()
            argv = [ours, "-H", "127.0.0.1", "-p", str(p8), "--proto7-port", str(p7), "-t", "1"] + extra.split()
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            wait_port(p7, p)
            ports[label] = p7
        if a.stock_bin:
            ps = free_port()
            p = subprocess.Popen([os.path.join(a.stock_bin, "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(ps),
                                  "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            wait_port(ps, p)
            ports["stock"] = ps
        time.sleep(1.0)  # pools filled
        spaced = {k: [] for k in ports}
        burst = {k: [] for k in ports}
        for k in ports:
            first_command_ms(ports[k])  # warm-up
        for r in range(a.rounds):
            print("round %d: load %s" % (r + 1, loadavg()), flush=True)
            order = list(ports) if r % 2 == 0 else list(reversed(list(ports)))
            for _ in range(a.connects):
                for k in order:
                    time.sleep(a.gap / 1e3)
                    spaced[k].append(first_command_ms(ports[k]))
            for k in order:
                if a.burst:
                    time.sleep(1.0)
                    burst[k].extend(first_command_ms(ports[k]) for _ in range(a.burst))
        print("\nfirst command (ALLOC_BUFFER round trip on a fresh connection), ms, %d ms apart:" % a.gap)
        for k, v in spaced.items():
            print("  %-14s %s" % (k, summary(v)))
        if a.burst:
            print("\nthe same, %d connections back to back (after 1 s of quiet):" % a.burst)
            for k, v in burst.items():
                print("  %-14s %s" % (k, summary(v)))
        print("load after: %s" % loadavg())
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
