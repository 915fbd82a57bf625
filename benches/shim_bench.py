#!/usr/bin/env python3
"""llama-bench token generation through rpc-shim (over TCP) vs. direct TCP, on loopback.

One worker (our rpc-server, or --worker-bin) and one rpc-shim in front of it (`--transport tcp`).
The stock `llama-bench -o json` is run alternately against the worker directly and through the
shim (`--rounds` times each; `--abba` swaps the order every other round to cancel drift). Prints a
markdown table of tokens/s (mean ± sample stddev over rounds × repetitions), the ratio shim/direct
(goal >= 0.97) and the per-token time the shim adds.

What the shim costs per token on loopback: the stock client's per-token traffic (9 small
SET_TENSOR, GRAPH_RECOMPUTE, one GET_TENSOR round trip returning the 1 MiB logits; spec §15.3)
crosses one more process: two more copies of the logits and a few more syscalls.

  python3 benches/shim_bench.py --stock-bin DIR [--rounds 5] [--abba] [-n 32] [-r 3]

stdlib only; see benches/README.md for the prerequisites (stock tools, gemma model).
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import (REPO, Server, Servers, free_port, help_mentions, log, resolve_ours,  # noqa: E402
                        resolve_stock_bin, run, script_output, tail)


class Shim(Server):
    """rpc-shim in front of one worker, for the stock 7.0.0 llama-bench: on its 7.0.0 listener
    (--listen7, with a spare --listen) where the shim speaks 8.0.0 on --listen."""

    def __init__(self, binary, port, worker, logdir, extra=()):
        super().__init__("bench-shim", binary, port, logdir, extra=extra, env={"RPC_LOG": "warn"})
        self.worker = worker
        self.listen8 = free_port(exclude=(port,)) if help_mentions(binary, "--listen7") else None

    def cmd(self):
        listen = ["--listen", "127.0.0.1:%d" % self.listen8, "--listen7", self.endpoint] if self.listen8 \
            else ["--listen", self.endpoint]
        return [self.binary, "--worker", self.worker] + listen + ["--transport", "tcp"] + self.extra


def mean_sd(xs):
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs):
    m, s = mean_sd(xs)
    return "n/a" if m is None else "%.2f ± %.2f" % (m, s)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", help="rpc-shim binary (default: target/release/rpc-shim)")
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--worker-bin", help="use this server binary as the worker instead (e.g. the stock "
                    "ggml-rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock llama-bench (default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--model", default="gemma", help="'gemma' (scripts/test-model.sh) or a .gguf path")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--abba", action="store_true", help="swap the order every other round")
    ap.add_argument("-p", "--n-prompt", type=int, default=0, help="llama-bench -p (default 0: tg only)")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="llama-bench -n (default 32)")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="llama-bench -r (default 3)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="llama-bench -t (client, default 1)")
    ap.add_argument("--server-threads", type=int, default=1, help="worker -t (default 1)")
    ap.add_argument("--shim-args", default="", help="extra rpc-shim arguments")
    ap.add_argument("--bench-args", default="", help="extra llama-bench args")
    ap.add_argument("--timeout", type=float, default=900, help="per llama-bench run, seconds")
    ap.add_argument("--logdir", help="logs and raw outputs (default: target/bench-logs/shim)")
    ap.add_argument("--json-out", help="also write all samples as JSON here")
    args = ap.parse_args()

    stock_bin = resolve_stock_bin(args.stock_bin, needed=("llama-bench",))
    worker_bin = os.path.abspath(args.worker_bin) if args.worker_bin else resolve_ours(args.ours)
    shim_bin = os.path.abspath(args.shim or os.path.join(REPO, "target", "release", "rpc-shim"))
    if not os.access(shim_bin, os.X_OK):
        raise SystemExit("rpc-shim binary %s not found (cargo build --release -p rpc-shim)" % shim_bin)
    model = script_output("test-model.sh", timeout=900) if args.model == "gemma" else os.path.abspath(args.model)
    logdir = os.path.abspath(args.logdir or os.path.join(REPO, "target", "bench-logs", "shim"))
    os.makedirs(logdir, exist_ok=True)
    bench = os.path.join(stock_bin, "llama-bench")
    tg_key = "tg%d" % args.n_gen
    pp_key = "pp%d" % args.n_prompt if args.n_prompt else None
    samples = {w: {"wall": []} for w in ("shim", "direct")}
    raw = []
    rounds = {}  # round -> who -> test -> avg t/s
    t0 = time.monotonic()

    with Servers() as servers:
        ports = set()

        def port():
            p = free_port(ports)
            ports.add(p)
            return p

        worker = servers.add(Server("bench-worker", worker_bin, port(), logdir, threads=args.server_threads))
        shim = servers.add(Shim(shim_bin, port(), worker.endpoint, logdir, args.shim_args.split()))
        endpoint = {"direct": worker.endpoint, "shim": shim.endpoint}
        for rnd in range(1, args.rounds + 1):
            order = ("shim", "direct") if args.abba and rnd % 2 == 0 else ("direct", "shim")
            for who in order:
                for s in (worker, shim):
                    note = s.ensure()
                    if note:
                        log("WARNING: " + note)
                cmd = [bench, "-m", model, "--rpc", endpoint[who], "-ngl", "99", "-p", str(args.n_prompt),
                       "-n", str(args.n_gen), "-r", str(args.repetitions), "-t", str(args.threads),
                       "-o", "json"] + args.bench_args.split()
                tag = "round%d-%s" % (rnd, who)
                rc, out, err, dt = run(cmd, args.timeout, os.path.join(logdir, tag + ".json"),
                                       os.path.join(logdir, tag + ".err"))
                if rc != 0:
                    print("llama-bench failed (exit %s) via %s:\n$ %s\n%s\n--- shim log:\n%s\n--- worker log:\n%s" % (
                        rc, who, " ".join(cmd), tail(os.path.join(logdir, tag + ".err"), 30),
                        tail(shim.log_path, 20), tail(worker.log_path, 20)), file=sys.stderr)
                    return 1
                try:
                    tests = json.loads(out.decode("utf-8"))
                except ValueError as e:
                    print("cannot parse llama-bench json (%s):\n%s" % (e, out[:2000]), file=sys.stderr)
                    return 1
                samples[who]["wall"].append(dt)
                rounds.setdefault(rnd, {})[who] = {}
                got = []
                for t in tests:
                    key = ("pp%d" % t["n_prompt"]) if t["n_gen"] == 0 else ("tg%d" % t["n_gen"])
                    samples[who].setdefault(key, []).extend(float(x) for x in t["samples_ts"])
                    rounds[rnd][who][key] = float(t["avg_ts"])
                    got.append("%s %.2f" % (key, t["avg_ts"]))
                raw.append(dict(round=rnd, via=who, wall_s=dt, tests=tests))
                log("round %d/%d %-6s %5.1fs  %s" % (rnd, args.rounds, who, dt, ", ".join(got)))

    print("\nModel: %s  client: llama-bench -ngl 99 -p %d -n %d -r %d -t %d %s" % (
        os.path.basename(model), args.n_prompt, args.n_gen, args.repetitions, args.threads, args.bench_args))
    print("Worker: %s -t %d; shim: %s --transport tcp %s; %d alternating rounds (%s); %.0fs total; host: %d cores, "
          "load average %.2f at the end\n" % (
              worker_bin, args.server_threads, shim_bin, args.shim_args, args.rounds,
              "ABBA" if args.abba else "direct first", time.monotonic() - t0, os.cpu_count() or 0,
              os.getloadavg()[0]))
    print("| test | via shim t/s | direct t/s | shim/direct (means) | shim/direct (median of rounds) | added per token |")
    print("|---|---|---|---|---|---|")
    for key in [k for k in (pp_key, tg_key) if k]:
        s, d = samples["shim"].get(key, []), samples["direct"].get(key, [])
        ms, md = mean_sd(s)[0], mean_sd(d)[0]
        ratio = "%.3f" % (ms / md) if ms and md else "n/a"
        # Paired: each round ran both back to back, so the per-round ratio cancels slow drift of
        # the machine's load; its median ignores rounds disturbed by other processes.
        paired = [r["shim"][key] / r["direct"][key] for r in rounds.values()
                  if key in r.get("shim", {}) and key in r.get("direct", {}) and r["direct"][key]]
        pr = "%.3f (%.3f..%.3f)" % (statistics.median(paired), min(paired), max(paired)) if paired else "n/a"
        added = "%+.2f ms" % (1000.0 / ms - 1000.0 / md) if ms and md and key.startswith("tg") else ""
        print("| %s | %s | %s | %s | %s | %s |" % (key, fmt(s), fmt(d), ratio, pr, added))
    print("| wall s / llama-bench run | %s | %s | %s | | |" % (
        fmt(samples["shim"]["wall"]), fmt(samples["direct"]["wall"]),
        "%.3f" % (mean_sd(samples["shim"]["wall"])[0] / mean_sd(samples["direct"]["wall"])[0])))
    n = len(samples["shim"].get(tg_key, []))
    print("\n(t/s: mean ± sample stddev over %d samples each; goal: tg shim/direct >= 0.97)" % n)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(args=vars(args), model=model, samples=samples, rounds=rounds, raw=raw), f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); processes stopped" % e, file=sys.stderr)
        sys.exit(130)
