#!/usr/bin/env python3
"""End-to-end test of rpc-shim: stock, TCP-only llama.cpp -> rpc-shim -> RPC workers, over TCP.

For every model, greedy generation with stock `llama-completion` must print byte-identical stdout
(prompt + generated text) in every mode:

  local         no RPC, CPU backend, --no-repack                        (the reference)
  direct        --rpc <our server>                                      (what the shim replaces)
  shim          --rpc <shim> -> our server
  shim warm     the same again through the same shim (cache warm, control connection reopened)
  shim->stock   --rpc <shim> -> stock ggml-rpc-server (serves one connection at a time: the shim
                must release its control connection before the client's session connects)
  shim x2       --rpc <shim:A>,<shim:B>  one shim process fronting two of our servers (layer split)

`direct` and `shim` run through byte-counting TCP proxies in front of the worker, so the table also
shows how many upstream connections each made (the stock client opens ~13 per model load; through
the shim: the session, plus the control connection when it had to be reopened).

Then, unless --quick:
  kill          a long generation through the shim; the worker is SIGKILLed mid-run: the client's
                connection must be closed promptly (the stock client then aborts: "Remote RPC server
                crashed") -- it must exit within --kill-deadline seconds, never hang; then the worker
                is restarted on the same port and the same shim must serve an identical generation
  bench         llama-bench --rpc <shim> -p 16 -n 8 (exit 0, pp16 and tg8 rows)

  python3 tests/e2e/shim_e2e.py --stock-bin DIR [--shim target/release/rpc-shim] [--ours ...] [--quick]
  python3 tests/e2e/shim_e2e.py --stock-bin DIR --models gemma synth-qwen2-q8q4 -n 48

Client flags as in run_e2e.py (-no-cnv --simple-io --ignore-eos, truncated output re-run). Exit
status 0 iff everything matched. Logs: --workdir (default: a fresh temp dir, kept on failure).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import (REPO, CountingProxy, Server, Servers, clean_env, free_port, help_mentions, log,  # noqa: E402
                        resolve_ours, resolve_stock_bin, run, tail)
from run_e2e import (CLIENT_ATTEMPTS, EVAL_RE, RPC_BUF_RE, Results, completion_cmd, parse_bench_md,  # noqa: E402
                     parse_perf, resolve_models, show_diff)


class Shim(Server):
    """An rpc-shim process: one listen port per worker (same CLI order) for 7.0.0 clients: where
    the shim speaks 8.0.0 on --listen (it has --listen7), `ports` are its --listen7 listeners and
    --listen gets spare ports."""

    def __init__(self, name, binary, ports, workers, logdir, extra=()):
        super().__init__(name, binary, ports[0], logdir, extra=extra, env={"RPC_LOG": "info"})
        self.ports, self.workers = list(ports), list(workers)
        self.listen8 = [free_port(exclude=self.ports) for _ in self.ports] \
            if help_mentions(binary, "--listen7") else None

    def cmd(self):
        c = [self.binary]
        for i, (w, p) in enumerate(zip(self.workers, self.ports)):
            if self.listen8:
                c += ["--worker", w, "--listen", "127.0.0.1:%d" % self.listen8[i], "--listen7", "127.0.0.1:%d" % p]
            else:
                c += ["--worker", w, "--listen", "127.0.0.1:%d" % p]
        return c + self.extra

    def endpoints(self):
        return ["127.0.0.1:%d" % p for p in self.ports]


def resolve_shim(arg):
    p = os.path.abspath(arg or os.path.join(REPO, "target", "release", "rpc-shim"))
    if not os.access(p, os.X_OK):
        raise SystemExit("rpc-shim binary %s not found (cargo build --release -p rpc-shim, or --shim PATH)" % p)
    return p


def run_client(cmd, timeout, out_path, err_path):
    """run() with run_e2e's rule: a run whose stderr lacks the perf summary lost the tail of its
    output at exit (leaked async logger) and is repeated. Returns (rc, out, err, secs, attempts)."""
    attempt = 1
    while True:
        rc, out, err, dt = run(cmd, timeout, out_path, err_path)
        if rc != 0 or EVAL_RE.search(err) or attempt >= CLIENT_ATTEMPTS:
            return rc, out, err, dt, attempt
        for path in (out_path, err_path):
            os.replace(path, "%s.truncated%d%s" % (path[:-4], attempt, path[-4:]))
        attempt += 1
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shim", help="rpc-shim binary (default: target/release/rpc-shim)")
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server, llama-completion, llama-bench "
                    "(default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--models", nargs="+", default=["gemma"],
                    help="'gemma', synthetic model names (see synth_models.py) or .gguf paths (default: gemma)")
    ap.add_argument("--quick", action="store_true", help="modes local, direct, shim, shim->stock only")
    ap.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate (default 32)")
    ap.add_argument("--server-threads", type=int, default=1, help="-t for every worker (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="per client run, seconds (default 300)")
    ap.add_argument("--kill-deadline", type=float, default=20.0,
                    help="seconds the client may take to exit after its worker was killed (default 20)")
    ap.add_argument("--shim-args", default="", help="extra rpc-shim args (e.g. '--transport tcp')")
    ap.add_argument("--workdir", help="logs and outputs (default: fresh temp dir, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir on success too")
    ap.add_argument("--synth-dir", help="where synthetic models are cached")
    args = ap.parse_args()

    t_start = time.monotonic()
    stock_bin = resolve_stock_bin(args.stock_bin)
    ours_bin = resolve_ours(args.ours)
    shim_bin = resolve_shim(args.shim)
    models = resolve_models(args)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="rpc-shim-e2e-"))
    os.makedirs(workdir, exist_ok=True)
    log("workdir: %s\nstock: %s\nours:  %s\nshim:  %s\nmodels: %s" % (
        workdir, stock_bin, ours_bin, shim_bin, ", ".join(m.name for m in models)))
    results = Results()
    stock_srv = os.path.join(stock_bin, "ggml-rpc-server")
    shim_extra = args.shim_args.split()

    with Servers() as servers:
        used = set()

        def port():
            p = free_port(used)
            used.add(p)
            return p

        def new_server(name, binary):
            return servers.add(Server(name, binary, port(), workdir, threads=args.server_threads))

        srv = {"oursA": new_server("oursA", ours_bin), "oursB": new_server("oursB", ours_bin),
               "stockA": new_server("stockA", stock_srv)}
        # Counting proxies in front of ours A: one for the direct client, one for the shim.
        px_direct = CountingProxy(srv["oursA"].port, exclude=used)
        px_shim = CountingProxy(srv["oursA"].port, exclude=used)
        shim = {
            "shim": servers.add(Shim("shim", shim_bin, [port()], [px_shim.endpoint], workdir, shim_extra)),
            "shim->stock": servers.add(Shim("shim-stock", shim_bin, [port()], [srv["stockA"].endpoint], workdir,
                                            shim_extra)),
        }
        if not args.quick:
            shim["shim x2"] = servers.add(Shim("shim-x2", shim_bin, [port(), port()],
                                               [srv["oursA"].endpoint, srv["oursB"].endpoint], workdir, shim_extra))

        # mode -> (endpoints, proxy counting the worker side, processes that must stay alive)
        modes = [("local", [], None, []), ("direct", [px_direct.endpoint], px_direct, ["oursA"]),
                 ("shim", shim["shim"].endpoints(), px_shim, ["oursA"])]
        if not args.quick:
            modes.append(("shim warm", shim["shim"].endpoints(), px_shim, ["oursA"]))
        modes.append(("shim->stock", shim["shim->stock"].endpoints(), None, ["stockA"]))
        if not args.quick:
            modes.append(("shim x2", shim["shim x2"].endpoints(), None, ["oursA", "oursB"]))

        refs = {}
        for model in models:
            ref = None
            for mode, eps, proxy, workers in modes:
                for x in workers:
                    srv[x].ensure()
                if proxy:
                    proxy.reset()
                tag = "%s.%s" % (model.name, mode.replace(" ", "_").replace("->", "_to_"))
                cmd = completion_cmd(stock_bin, model, args.n_predict, eps)
                out_path, err_path = os.path.join(workdir, tag + ".out"), os.path.join(workdir, tag + ".err")
                rc, out, err, dt, attempts = run_client(cmd, args.timeout, out_path, err_path)
                perf = parse_perf(err)
                problems, notes = [], []
                if attempts > 1:
                    notes.append("run %d times: client output truncated at exit" % attempts)
                if rc != 0:
                    problems.append("exit %s" % rc)
                if rc == 0 and perf["eval_runs"] is None:
                    problems.append("no perf summary: output truncated at exit in %d attempts" % attempts)
                if perf["eval_runs"] is not None and perf["eval_runs"] < args.n_predict - 1:
                    problems.append("only %d eval runs" % perf["eval_runs"])
                bufs = {e.decode(): float(mib) for e, mib in RPC_BUF_RE.findall(err)}
                if eps and rc == 0:
                    if not bufs or not set(bufs) <= set(eps):
                        problems.append("weights not on the RPC endpoints (model buffers: %s)" % (bufs or "none"))
                    else:
                        notes.append("MiB per endpoint: %s" % "/".join("%.1f" % bufs.get(e, 0.0) for e in eps))
                if proxy:
                    notes.append("%d upstream connections, %.1f MB sent" % (proxy.conns, proxy.up / 1e6))
                    if mode.startswith("shim") and proxy.conns > 2:
                        problems.append("%d upstream connections through the shim (expected <= 2)" % proxy.conns)
                dead = [x for x in workers if not srv[x].alive()]
                dead += [s.name for s in shim.values() if not s.alive()]
                if dead:
                    problems.append("died: " + ",".join(dead))
                if ref is None:
                    ref = b"" if problems else out
                    if not problems:
                        notes.append("%d bytes" % len(out))
                elif not ref:
                    problems.append("no local reference to compare with")
                elif out != ref and not problems:
                    problems.append("output differs from local")
                results.add(model.name, mode, not problems, dt, "; ".join(problems + notes), perf["tg_tps"])
                if problems:
                    print("\n===== FAIL %s / %s: %s\n$ %s" % (model.name, mode, "; ".join(problems), " ".join(cmd)))
                    if ref and out != ref:
                        print(show_diff(ref, out, "local", mode))
                    print("--- client stderr (tail):\n" + tail(err_path, 30))
                    for s in shim.values():
                        print("--- %s log (tail):\n%s" % (s.name, tail(s.log_path, 15)))
                    for x in workers:
                        print("--- worker %s log (tail):\n%s" % (x, tail(srv[x].log_path, 15)), flush=True)
                    for x in workers:  # do not cascade into the next mode
                        srv[x].stop()
                        srv[x].start()
                    for s in shim.values():
                        s.ensure()
            refs[model.name] = ref

        model = models[0]
        ref = refs.get(model.name)
        if not args.quick:
            # Kill the worker in the middle of a generation through the shim.
            k = new_server("oursK", ours_bin)
            ks = servers.add(Shim("shim-kill", shim_bin, [port()], [k.endpoint], workdir, shim_extra))
            cmd = completion_cmd(stock_bin, model, 100000, ks.endpoints(), ctx=2048)
            err_path = os.path.join(workdir, "kill.err")
            t0 = time.monotonic()
            with open(err_path, "wb") as ef, open(os.path.join(workdir, "kill.out"), "wb") as of:
                # GGML_NO_BACKTRACE: the client's abort would attach gdb for a backtrace first
                p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=of, stderr=ef, start_new_session=True,
                                     env=dict(clean_env(), GGML_NO_BACKTRACE="1"))
            problems, notes = [], []
            started = False
            while time.monotonic() - t0 < args.timeout and p.poll() is None:
                if os.path.getsize(os.path.join(workdir, "kill.out")) > 200:
                    started = True
                    break
                time.sleep(0.2)
            if not started:
                problems.append("generation did not start (client exit %s)" % p.poll())
            os.killpg(k.proc.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            try:
                rc = p.wait(timeout=args.kill_deadline)
                dt = time.monotonic() - t_kill
                notes.append("client exited %.2f s after the kill (exit %s%s)" % (
                    dt, rc, ", %s" % signal.Signals(-rc).name if rc < 0 else ""))
                if rc == 0:
                    problems.append("client exited 0 although its worker died")
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                dt = time.monotonic() - t_kill
                problems.append("client still running %.0f s after its worker was killed (hang)" % args.kill_deadline)
            if not ks.alive():
                problems.append("the shim died")
            results.add(model.name, "kill worker", not problems, dt, "; ".join(problems + notes))
            if problems:
                print("\n===== FAIL kill worker: %s\n--- client stderr:\n%s\n--- shim log:\n%s" % (
                    "; ".join(problems), tail(err_path, 20), tail(ks.log_path, 20)), flush=True)
            # The worker comes back on the same port: the same shim serves again.
            k.stop()
            k.start()
            tag = "%s.after_kill" % model.name
            cmd = completion_cmd(stock_bin, model, args.n_predict, ks.endpoints())
            out_path, err_path = os.path.join(workdir, tag + ".out"), os.path.join(workdir, tag + ".err")
            rc, out, err, dt, _ = run_client(cmd, args.timeout, out_path, err_path)
            ok = rc == 0 and bool(ref) and out == ref
            results.add(model.name, "after restart", ok, dt,
                        "same shim, worker restarted: %s" % ("identical to local" if ok else "exit %s / differs" % rc))
            if not ok:
                print("--- client stderr (tail):\n" + tail(err_path, 20), flush=True)

            # llama-bench smoke through the shim.
            bench = os.path.join(stock_bin, "llama-bench")
            cmd = [bench, "-m", model.path, "--rpc", shim["shim"].endpoints()[0], "-ngl", "99", "-p", "16",
                   "-n", "8", "-r", "1", "-t", "1"]
            rc, out, err, dt = run(cmd, args.timeout, os.path.join(workdir, "bench.out"),
                                   os.path.join(workdir, "bench.err"))
            rows = parse_bench_md(out.decode("utf-8", "replace"))
            problems = (["exit %s" % rc] if rc != 0 else []) + ["no %s row" % r for r in ("pp16", "tg8") if r not in rows]
            results.add(model.name, "llama-bench", not problems, dt,
                        "; ".join(problems + [", ".join("%s %.1f t/s" % (r, v[0]) for r, v in sorted(rows.items()))]),
                        rows.get("tg8", (None,))[0])

    total = time.monotonic() - t_start
    print("\n" + results.table())
    n_ok = sum(1 for r in results.rows if r["ok"])
    print("\n%d/%d checks passed in %.1fs (n_predict=%d; stock=%s; ours=%s; shim=%s)" % (
        n_ok, len(results.rows), total, args.n_predict, stock_bin, ours_bin, shim_bin))
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(dict(rows=results.rows, total_secs=total, n_predict=args.n_predict), f, indent=1)
    if results.failures:
        print("FAILED: %d check(s); logs kept in %s" % (results.failures, workdir))
        return 1
    if args.workdir or args.keep:
        print("logs in %s" % workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); processes stopped" % e, file=sys.stderr)
        sys.exit(130)
