#!/usr/bin/env python3
"""Two builds of rpc-server (e.g. before and after a containment change) and the stock
ggml-rpc-server, side by side in one run: what a session process costs to start, and generation
speed under the stock llama-bench.

  start     a fresh connection, HELLO (7.0.0), then ALLOC_BUFFER (1 MiB): the front hands the
            connection to a new session process at that command, so its round trip is the
            session's start-up; connections go to the servers in turn (150 ms apart, so the
            previous session has ended), --connects per server per round; ours also with
            --no-isolate (no session process) as the floor
  generate  stock `llama-bench -p 64 -n 32 -r 2 -t 1` (gemma-3-270m) against each server in the
            order before, after, stock, stock, after, before per round; median t/s per server

  python3 benches/containment_before_after.py --before OLD_BIN [--after target/release/rpc-server] \\
      --stock-bin DIR [--rounds 4] [--connects 40]

stdlib only. Prints the load average before each round: quote figures from an idle run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import first_command_ms, free_port, resolve_ours, resolve_stock_bin, script_output, wait_port  # noqa: E402



def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def llama_bench(stock, model, port):
    out = subprocess.run([os.path.join(stock, "llama-bench"), "-m", model, "-p", "64", "-n", "32",
                          "-r", "2", "-t", "1", "-ngl", "99", "--rpc", "127.0.0.1:%d" % port, "-o", "json"],
                         capture_output=True, timeout=900, check=True).stdout
    rows = json.loads(out)
    return {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the older rpc-server binary")
    ap.add_argument("--after", help="the newer rpc-server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-bench (7.0.0)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--connects", type=int, default=40, help="fresh connections per server per round")
    a = ap.parse_args()
    after = resolve_ours(a.after)
    stock = resolve_stock_bin(a.stock_bin)
    model = script_output("test-model.sh", timeout=1800)
    procs, ports = [], {}

    def start(label, argv, port):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        wait_port(port, p)
        ports[label] = port

    try:
        for label, binary, extra in [("before", a.before, []), ("after", after, []),
                                     ("after --no-isolate", after, ["--no-isolate"])]:
            p7, p8 = free_port(), free_port()
            start(label, [binary, "-H", "127.0.0.1", "-p", str(p8), "--proto7-port", str(p7), "-t", "1"] + extra, p7)
        ps = free_port()
        start("stock", [os.path.join(stock, "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(ps), "-t", "1"], ps)
        starts = {k: [] for k in ports if k != "stock"}
        gen = {k: [] for k in ("before", "after", "stock")}
        for k in starts:
            first_command_ms(ports[k])  # warm-up
        for r in range(a.rounds):
            print("round %d: load %.2f" % (r + 1, loadavg()), flush=True)
            for _ in range(a.connects):
                for k in starts:
                    starts[k].append(first_command_ms(ports[k]))
                    time.sleep(0.15)
            for k in ("before", "after", "stock", "stock", "after", "before"):
                gen[k].append(llama_bench(stock, model, ports[k]))
        print("\nsession start (ALLOC_BUFFER round trip on a fresh connection), ms:")
        q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]
        for k, v in starts.items():
            print("  %-20s n=%d median %.2f  p10 %.2f  p90 %.2f  min %.2f"
                  % (k, len(v), statistics.median(v), q(v, .1), q(v, .9), min(v)))
        med = {k: {m: statistics.median(x[m] for x in v) for m in ("pp", "tg")} for k, v in gen.items()}
        print("\nstock llama-bench (gemma-3-270m, -p 64 -n 32 -r 2), median t/s over %d runs each:" % (2 * a.rounds))
        for k, v in med.items():
            print("  %-8s pp %.1f  tg %.2f" % (k, v["pp"], v["tg"]))
        for m in ("pp", "tg"):
            print("  %s: after/before %.3f, after/stock %.3f, before/stock %.3f"
                  % (m, med["after"][m] / med["before"][m], med["after"][m] / med["stock"][m],
                     med["before"][m] / med["stock"][m]))
        print("load after: %.2f" % loadavg())
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
