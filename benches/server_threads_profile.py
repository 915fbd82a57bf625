#!/usr/bin/env python3
"""Where a server's time goes during token generation: per-thread CPU time, run-queue wait,
migrations and context switches, from /proc (no perf needed), for our rpc-server and the stock
ggml-rpc-server under the same `llama-bench -p 0 -n N` client.

Each server runs alone (started fresh, a warm-up llama-bench run first); then /proc is sampled
every 20 ms through two llama-bench runs that differ only in the tokens generated (N/4 and N), and
the difference of the two is divided by the difference in tokens: the cost of one generated token,
with model upload, context set-up and exit cancelled out. Threads that come and go are caught by
the sampling.

  python3 benches/server_threads_profile.py --stock-bin DIR [--ours PATH] [--model gemma|NAME|PATH] \
      [-t 2] [-n 64] [--rounds 2]

Columns per server: threads seen, then per token: wall ms (llama-bench), server CPU ms, run-queue
wait ms (runnable but not running), off-CPU ms of the busiest thread, migrations and voluntary /
involuntary switches summed over threads. stdlib only.
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import Server, Servers, free_port, log, resolve_ours, resolve_stock_bin, run  # noqa: E402
from llama_bench_compare import resolve_model  # noqa: E402


def thread_stats(pid):
    """{tid: dict(name, exec_ns, wait_ns, migrations, vol, invol)} for every thread of pid."""
    out = {}
    base = "/proc/%d/task" % pid
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("%s/%s/schedstat" % (base, tid)) as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            with open("%s/%s/comm" % (base, tid)) as f:
                name = f.read().strip()
            d = dict(name=name, exec_ns=run_ns, wait_ns=wait_ns, migrations=0, vol=0, invol=0)
            with open("%s/%s/sched" % (base, tid)) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    k = k.strip()
                    if k == "se.nr_migrations":
                        d["migrations"] = int(float(v))
                    elif k == "nr_voluntary_switches":
                        d["vol"] = int(float(v))
                    elif k == "nr_involuntary_switches":
                        d["invol"] = int(float(v))
            out[int(tid)] = d
        except (OSError, ValueError):
            continue
    return out


class Sampler:
    def __init__(self, pid):
        self.pid, self.first, self.last = pid, {}, {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            s = thread_stats(self.pid)
            for tid, d in s.items():
                self.first.setdefault(tid, d)
                self.last[tid] = d
            if self._stop.wait(0.02):
                return

    def __enter__(self):
        self.first = thread_stats(self.pid)
        self.initial = set(self.first)
        self.last = dict(self.first)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def deltas(self):
        """Per thread: counters over the sampled interval (threads born during it start at 0)."""
        out = {}
        for tid, last in self.last.items():
            first = self.first.get(tid) if tid in self.initial else None
            d = {k: last[k] - (first[k] if first else 0) for k in ("exec_ns", "wait_ns", "migrations", "vol", "invol")}
            d["name"] = last["name"]
            out[tid] = d
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--extra-ours", action="append", default=[], metavar="NAME=PATH",
                    help="another server binary to profile (e.g. an older build)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server and llama-bench")
    ap.add_argument("--model", default="gemma")
    ap.add_argument("-t", "--server-threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="measured runs per server, alternating")
    ap.add_argument("--per-thread", action="store_true", help="also log each thread's share per token")
    ap.add_argument("--logdir", default=os.path.join("target", "bench-logs", "profile"))
    args = ap.parse_args()
    stock_bin = resolve_stock_bin(args.stock_bin, needed=("ggml-rpc-server", "llama-bench"))
    model = resolve_model(args.model)
    bench = os.path.join(stock_bin, "llama-bench")
    bins = [("ours", resolve_ours(args.ours)), ("stock", os.path.join(stock_bin, "ggml-rpc-server"))]
    for e in args.extra_ours:
        name, _, path = e.partition("=")
        bins.append((name, os.path.abspath(path)))
    os.makedirs(args.logdir, exist_ok=True)
    rows = {name: [] for name, _ in bins}
    with Servers() as servers:
        for rnd in range(args.rounds):
            for name, binary in (bins if rnd % 2 == 0 else bins[::-1]):
                srv = servers.add(Server("%s-%d" % (name, rnd), binary, free_port(), args.logdir,
                                         threads=args.server_threads))
                def measure(n):
                    cmd = [bench, "-m", model, "--rpc", srv.endpoint, "-ngl", "99", "-p", "0", "-n", str(n),
                           "-r", "1", "-t", "1", "-o", "json"]
                    with Sampler(srv.proc.pid) as smp:
                        rc, out, err, dt = run(cmd, 600)
                    if rc != 0:
                        raise SystemExit("llama-bench failed against %s:\n%s" % (name, err.decode()[-2000:]))
                    d = smp.deltas()
                    tot = {k: sum(x[k] for x in d.values()) for k in ("exec_ns", "wait_ns", "migrations", "vol", "invol")}
                    busiest = max(d.values(), key=lambda x: x["exec_ns"])["exec_ns"]
                    gen_s = n / json.loads(out)[0]["avg_ts"]
                    return d, tot, busiest, gen_s

                measure(args.n_gen)  # warm-up: first upload, page cache
                # Two runs that differ only in the number of generated tokens: their difference is
                # the cost of the extra tokens alone (upload, context set-up and prompt cancel out).
                n_lo, n_hi = max(1, args.n_gen // 4), args.n_gen
                d_lo, lo, busy_lo, gen_lo = measure(n_lo)
                d, hi, busy_hi, gen_hi = measure(n_hi)
                n = n_hi - n_lo
                wall_ms = (gen_hi - gen_lo) * 1000.0 / n
                per = {k: (hi[k] - lo[k]) / n for k in hi}
                # Per thread over the whole -n N run (connection threads are new in every run, so
                # no difference of runs is possible per thread), divided by N: includes set-up.
                per_thread = []
                for tid, x in sorted(d.items()):
                    per_thread.append("%s/%d: cpu %.2f ms, wait %.3f ms, migr %.2f, vol %.1f, invol %.2f" % (
                        x["name"], tid, x["exec_ns"] / 1e6 / n_hi, x["wait_ns"] / 1e6 / n_hi, x["migrations"] / n_hi,
                        x["vol"] / n_hi, x["invol"] / n_hi))
                if args.per_thread:
                    log("  per thread, whole -n %d run / %d (%s):\n    %s" % (n_hi, n_hi, name, "\n    ".join(per_thread)))
                rows[name].append(dict(
                    threads=len(d), names=sorted({x["name"] for x in d.values()}), tps=n_hi / gen_hi, wall_ms=wall_ms,
                    cpu_ms=per["exec_ns"] / 1e6, wait_ms=per["wait_ns"] / 1e6,
                    busiest_off_ms=wall_ms - (busy_hi - busy_lo) / 1e6 / n,
                    migrations=per["migrations"], vol=per["vol"], invol=per["invol"],
                    active=sum(1 for x in d.values() if x["exec_ns"] > 1e6)))
                srv.stop()
                servers.items.remove(srv)
                r = rows[name][-1]
                tps = r["tps"]
                log("%s round %d: %.2f t/s, %d threads (%d active: %s)" % (name, rnd + 1, tps, r["threads"],
                                                                          r["active"], ", ".join(r["names"])))
    print("\nllama-bench -p 0 -n %d vs -n %d, -t 1, against each server alone (-t %d); per generated token, "
          "mean of %d runs; t/s of the -n %d run:\n" % (args.n_gen, max(1, args.n_gen // 4), args.server_threads,
                                                     args.rounds, args.n_gen))
    print("| server | t/s | threads (active) | wall ms | server CPU ms | run-queue wait ms | busiest thread off-CPU ms "
          "| migrations | vol switches | invol switches |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        m = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        print("| %s | %.2f | %.0f (%.0f) | %.2f | %.2f | %.3f | %.2f | %.2f | %.1f | %.2f |" % (
            name, m("tps"), m("threads"), m("active"), m("wall_ms"), m("cpu_ms"), m("wait_ms"), m("busiest_off_ms"),
            m("migrations"), m("vol"), m("invol")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
