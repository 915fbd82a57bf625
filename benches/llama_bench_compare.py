#!/usr/bin/env python3
"""llama-bench through our RPC server vs. the stock ggml-rpc-server: same client, same model, same run.

Both servers run side by side (same -t); `llama-bench -o json` is run alternately against ours and
stock (`--rounds` times each: ours, stock, ours, stock, ...). Prints a markdown table of tokens/s
(mean ± sample stddev over all samples = rounds x repetitions) for pp and tg, the ratio ours/stock,
and the wall time per llama-bench invocation (includes model upload over RPC and warmup).

  python3 benches/llama_bench_compare.py --stock-bin DIR [--ours target/release/rpc-server] \
      [--model gemma|PATH] [--rounds 3] [-p 64] [-n 32] [-r 3]

See benches/README.md. stdlib only.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
from e2e_common import (Server, Servers, free_port, log, resolve_ours, resolve_stock_bin,  # noqa: E402
                        run, script_output, tail)


def mean_sd(xs):
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs, digits=2):
    m, s = mean_sd(xs)
    return "n/a" if m is None else "%.*f ± %.*f" % (digits, m, digits, s)


def ratio(a, b):
    ma, mb = mean_sd(a)[0], mean_sd(b)[0]
    return "n/a" if not ma or not mb else "%.3f" % (ma / mb)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-bench "
                    "(default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--model", default="gemma", help="'gemma' (scripts/test-model.sh) or a .gguf path")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--abba", action="store_true",
                    help="swap the order every other round (ours,stock,stock,ours,...) to cancel drift")
    ap.add_argument("-p", "--n-prompt", type=int, default=64, help="llama-bench -p (default 64)")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="llama-bench -n (default 32)")
    ap.add_argument("-r", "--repetitions", type=int, default=3, help="llama-bench -r (default 3)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="llama-bench -t (client, default 1)")
    default_st = max(1, (os.cpu_count() or 2) // 2)
    ap.add_argument("--server-threads", type=int, default=default_st,
                    help="-t for both servers (default %d = stock default)" % default_st)
    ap.add_argument("--ngl", default="99", help="llama-bench -ngl (default 99)")
    ap.add_argument("--bench-args", default="", help="extra llama-bench args, e.g. '-fa 1 -ub 256'")
    ap.add_argument("--timeout", type=float, default=900, help="per llama-bench run, seconds")
    ap.add_argument("--logdir", help="server logs and raw outputs (default: target/bench-logs)")
    ap.add_argument("--json-out", help="also write all samples as JSON here")
    args = ap.parse_args()

    stock_bin = resolve_stock_bin(args.stock_bin, needed=("ggml-rpc-server", "llama-bench"))
    ours_bin = resolve_ours(args.ours)
    model = script_output("test-model.sh", timeout=900) if args.model == "gemma" else os.path.abspath(args.model)
    repo = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    logdir = os.path.abspath(args.logdir or os.path.join(repo, "target", "bench-logs"))
    os.makedirs(logdir, exist_ok=True)
    bench = os.path.join(stock_bin, "llama-bench")
    pp_key, tg_key = "pp%d" % args.n_prompt, "tg%d" % args.n_gen
    samples = {w: {pp_key: [], tg_key: [], "wall": []} for w in ("ours", "stock")}
    raw = []
    t0 = time.monotonic()

    with Servers() as servers:
        ports = set()
        srv = {}
        for who, binary in (("ours", ours_bin), ("stock", os.path.join(stock_bin, "ggml-rpc-server"))):
            port = free_port(ports)
            ports.add(port)
            srv[who] = servers.add(Server("bench-" + who, binary, port, logdir, threads=args.server_threads))
        for rnd in range(1, args.rounds + 1):
            order = ("stock", "ours") if args.abba and rnd % 2 == 0 else ("ours", "stock")
            for who in order:
                note = srv[who].ensure()
                if note:
                    log("WARNING: " + note)
                cmd = [bench, "-m", model, "--rpc", srv[who].endpoint, "-ngl", args.ngl,
                       "-p", str(args.n_prompt), "-n", str(args.n_gen), "-r", str(args.repetitions),
                       "-t", str(args.threads), "-o", "json"] + args.bench_args.split()
                tag = "round%d-%s" % (rnd, who)
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
                samples[who]["wall"].append(dt)
                got = []
                for t in tests:
                    key = ("pp%d" % t["n_prompt"]) if t["n_gen"] == 0 else ("tg%d" % t["n_gen"])
                    samples[who].setdefault(key, []).extend(float(x) for x in t["samples_ts"])
                    got.append("%s %.2f" % (key, t["avg_ts"]))
                raw.append(dict(round=rnd, server=who, wall_s=dt, tests=tests))
                log("round %d/%d %-5s %5.1fs  %s" % (rnd, args.rounds, who, dt, ", ".join(got)))

    info = raw[-1]["tests"][0] if raw and raw[-1]["tests"] else {}
    print("\nModel: %s (%s, %s params)  client: llama-bench -ngl %s -p %d -n %d -r %d -t %d %s" % (
        os.path.basename(model), info.get("model_type", "?"), info.get("model_n_params", "?"), args.ngl,
        args.n_prompt, args.n_gen, args.repetitions, args.threads, args.bench_args))
    print("Servers: -t %d; %d alternating rounds (%s); stock = %s; ours = %s; %.0fs total\n" % (
        args.server_threads, args.rounds, "ABBA order" if args.abba else "ours first",
        os.path.join(stock_bin, "ggml-rpc-server"), ours_bin, time.monotonic() - t0))
    print("| test | ours t/s | stock t/s | ours/stock |")
    print("|---|---|---|---|")
    for key in (pp_key, tg_key):
        print("| %s | %s | %s | %s |" % (key, fmt(samples["ours"][key]), fmt(samples["stock"][key]),
                                         ratio(samples["ours"][key], samples["stock"][key])))
    print("| wall s / llama-bench run | %s | %s | %s |" % (fmt(samples["ours"]["wall"]),
          fmt(samples["stock"]["wall"]), ratio(samples["ours"]["wall"], samples["stock"]["wall"])))
    print("\n(t/s: mean ± sample stddev over %d samples each; wall ratio < 1 means ours is faster)"
          % len(samples["ours"][tg_key]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(dict(args=vars(args), model=model, samples=samples, raw=raw), f, indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); servers stopped" % e, file=sys.stderr)
        sys.exit(130)
