#!/usr/bin/env python3
"""llama-bench through our RPC server vs. the stock ggml-rpc-server: same client, same model, same run.

For each server thread count (`--server-threads 1,2`), both servers run side by side with that `-t`
and the stock `llama-bench -o json` runs alternately against each (ABBA order: ours, stock, stock,
ours, ...), `--rounds` times each. Per round, the ratio ours/stock of the median t/s of that
round's samples (pp and tg); the table gives the median of those round ratios with their min..max
spread, the median t/s of each server, and the machine's load average before and during the run
(the benchmark itself adds about server threads + client threads while a run is active).

  python3 benches/llama_bench_compare.py --stock-bin DIR [--ours target/release/rpc-server] \
      [--model gemma|synth-llama-f16|PATH] [--server-threads 1,2] [--rounds 4] [-p 64] [-n 32] [-r 2]
  python3 benches/llama_bench_compare.py --pool RUN1.json RUN2.json ...   # pool runs' --json-out

An A/A run (`--ours DIR/ggml-rpc-server`: the stock server against itself) shows how far this
machine moves the ratio when nothing differs; read every ours/stock figure against it.

See benches/README.md. stdlib only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import (CACHE, Server, Servers, free_port, log, resolve_ours, resolve_stock_bin,  # noqa: E402
                        run, script_output, tail)

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class LoadSampler:
    """Samples the 1-minute load average every second while running."""

    def __init__(self):
        self.samples, self._stop = [], threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(1.0):
            self.samples.append(loadavg())

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def cpu_busy(seconds=5.0):
    """Share of CPU time not idle over `seconds` (from /proc/stat), before anything of ours runs."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def resolve_model(name):
    if name == "gemma":
        return script_output("test-model.sh", timeout=900)
    if os.path.exists(name):
        return os.path.abspath(name)
    synth = os.path.join(CACHE, "models", "synth")
    r = subprocess.run([sys.executable, os.path.join(REPO, "tests", "e2e", "synth_models.py"), synth, "--only", name],
                       stdout=subprocess.PIPE, check=True, text=True, timeout=600)
    return r.stdout.strip().splitlines()[-1]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def pool(paths):
    """Pools the rounds of several runs' --json-out files: per server -t and test, the median of
    all round ratios, their interquartile range, and how many rounds had ours >= stock. An A/A run
    (--ours pointed at the stock server) pooled alone shows how far this machine moves a ratio
    when nothing differs."""
    ratios = {}
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        per = {}
        for r in d["raw"]:
            for t in r["tests"]:
                k = ("pp%d" % t["n_prompt"]) if t["n_gen"] == 0 else ("tg%d" % t["n_gen"])
                per.setdefault((r["server_threads"], k, r["round"]), {})[r["server"]] = med(t["samples_ts"])
        for (st, k, _), v in per.items():
            if v.get("ours") and v.get("stock"):
                ratios.setdefault((st, k), []).append(v["ours"] / v["stock"])
    print("Pooled: %s\n" % ", ".join(os.path.basename(p) for p in paths))
    print("| server -t | test | ours/stock (median of rounds) | interquartile range | rounds with ours >= stock |")
    print("|---|---|---|---|---|")
    for (st, k), v in sorted(ratios.items()):
        v = sorted(v)
        n = len(v)
        print("| %d | %s | **%.3f** | %.3f..%.3f | %d of %d |" % (st, k, med(v), v[n // 4], v[(3 * n) // 4],
                                                               sum(1 for x in v if x >= 1.0), n))
    return 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--pool":
        return pool(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-bench "
                    "(default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--model", default="gemma",
                    help="'gemma' (scripts/test-model.sh), a synthetic model name (tests/e2e/synth_models.py) or "
                    "a .gguf path")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per thread count (default 4)")
    ap.add_argument("-p", "--n-prompt", type=int, default=64, help="llama-bench -p (default 64)")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="llama-bench -n (default 32)")
    ap.add_argument("-r", "--repetitions", type=int, default=2, help="llama-bench -r (default 2)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="llama-bench -t (client, default 1)")
    ap.add_argument("--server-threads", default="1,2", help="comma-separated -t values for both servers "
                    "(default 1,2)")
    ap.add_argument("--ngl", default="99", help="llama-bench -ngl (default 99)")
    ap.add_argument("--bench-args", default="", help="extra llama-bench args, e.g. '-fa 1 -ub 256'")
    ap.add_argument("--timeout", type=float, default=900, help="per llama-bench run, seconds")
    ap.add_argument("--logdir", help="server logs and raw outputs (default: target/bench-logs)")
    ap.add_argument("--json-out", help="also write all samples as JSON here")
    ap.add_argument("--ours-args", default="", help="extra args for our server only, e.g. '--no-isolate'")
    ap.add_argument("--pool", nargs="+", metavar="JSON", help="instead of running: pool the rounds of earlier "
                    "runs' --json-out files (must be the first argument)")
    args = ap.parse_args()

    stock_bin = resolve_stock_bin(args.stock_bin, needed=("ggml-rpc-server", "llama-bench"))
    ours_bin = resolve_ours(args.ours)
    model = resolve_model(args.model)
    logdir = os.path.abspath(args.logdir or os.path.join(REPO, "target", "bench-logs"))
    os.makedirs(logdir, exist_ok=True)
    bench = os.path.join(stock_bin, "llama-bench")
    thread_counts = [int(x) for x in args.server_threads.split(",") if x.strip()]
    keys = ("pp%d" % args.n_prompt, "tg%d" % args.n_gen)
    load_before = loadavg()
    busy_before = cpu_busy()
    t0 = time.monotonic()
    rows, raw = [], []

    with Servers() as servers:
        for st in thread_counts:
            srv = {}
            for who, binary in (("ours", ours_bin), ("stock", os.path.join(stock_bin, "ggml-rpc-server"))):
                extra = args.ours_args.split() if who == "ours" else []
                srv[who] = servers.add(Server("bench-%s-t%d" % (who, st), binary, free_port(), logdir, threads=st,
                                              extra=extra))
            per_round = {k: [] for k in keys}
            tps = {w: {k: [] for k in keys} for w in srv}
            with LoadSampler() as load:
                for rnd in range(1, args.rounds + 1):
                    order = ("stock", "ours") if rnd % 2 == 0 else ("ours", "stock")
                    got = {}
                    for who in order:
                        note = srv[who].ensure()
                        if note:
                            log("WARNING: " + note)
                        cmd = [bench, "-m", model, "--rpc", srv[who].endpoint, "-ngl", args.ngl,
                               "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", str(args.repetitions),
                               "-t", str(args.threads), "-o", "json"] + args.bench_args.split()
                        tag = "t%d-round%d-%s" % (st, rnd, who)
                        rc, out, err, dt = run(cmd, args.timeout, os.path.join(logdir, tag + ".json"),
                                               os.path.join(logdir, tag + ".err"))
                        if rc != 0:
                            print("llama-bench failed (exit %s) against %s:\n$ %s\n%s\n--- server log:\n%s" % (
                                rc, who, " ".join(cmd), tail(os.path.join(logdir, tag + ".err"), 30),
                                tail(srv[who].log_path, 30)), file=sys.stderr)
                            return 1
                        try:
                            tests = json.loads(out.decode("utf-8"))
                        except ValueError as e:
                            print("cannot parse llama-bench json (%s):\n%s" % (e, out[:2000]), file=sys.stderr)
                            return 1
                        got[who] = {}
                        for t in tests:
                            key = ("pp%d" % t["n_prompt"]) if t["n_gen"] == 0 else ("tg%d" % t["n_gen"])
                            got[who][key] = [float(x) for x in t["samples_ts"]]
                            tps[who].setdefault(key, []).extend(got[who][key])
                        raw.append(dict(server_threads=st, round=rnd, server=who, wall_s=dt, tests=tests))
                    for k in keys:
                        if got["ours"].get(k) and got["stock"].get(k):
                            per_round[k].append(med(got["ours"][k]) / med(got["stock"][k]))
                    log("-t %d round %d/%d: %s" % (st, rnd, args.rounds, ", ".join(
                        "%s ours %.2f stock %.2f (%.3f)" % (k, med(got["ours"].get(k, [])), med(got["stock"].get(k, [])),
                                                              per_round[k][-1] if per_round[k] else float("nan"))
                        for k in keys)))
            for who in srv:
                srv[who].stop()
            servers.items = [s for s in servers.items if s not in srv.values()]
            for k in keys:
                r = per_round[k]
                rows.append((st, k, med(tps["ours"][k]), med(tps["stock"][k]), med(r), min(r) if r else float("nan"),
                             max(r) if r else float("nan"), len(r)))
            rows.append((st, "load", min(load.samples or [loadavg()]), max(load.samples or [loadavg()])))

    if args.ours_args:
        print("\nours: rpc-server %s" % args.ours_args)
    print("\nModel: %s  client: llama-bench -ngl %s -p %d -n %d -r %d -t %d %s" % (
        os.path.basename(model), args.ngl, args.n_prompt, args.n_gen, args.repetitions, args.threads,
        args.bench_args))
    print("%d cores; before the run: CPU %.0f%% busy (5 s of /proc/stat), load average %.2f; %d ABBA rounds per "
          "thread count; %.0f s total\n" % (os.cpu_count() or 0, 100 * busy_before, load_before, args.rounds,
                                             time.monotonic() - t0))
    print("| server -t | test | ours t/s (median) | stock t/s (median) | ours/stock (median of rounds) | spread (min..max) |")
    print("|---|---|---|---|---|---|")
    loads = {}
    for row in rows:
        if row[1] == "load":
            loads[row[0]] = row[2:]
            continue
        st, k, o, s, r, lo, hi, n = row
        print("| %d | %s | %.2f | %.2f | **%.3f** | %.3f..%.3f (%d rounds) |" % (st, k, o, s, r, lo, hi, n))
    print("\nload average during the runs (1-min, incl. the benchmark itself): " + "; ".join(
        "-t %d: %.2f..%.2f" % (st, lo, hi) for st, (lo, hi) in loads.items()))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(args=vars(args), model=model, load_before=load_before, busy_before=busy_before, rows=rows, raw=raw), f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); servers stopped" % e, file=sys.stderr)
        sys.exit(130)
