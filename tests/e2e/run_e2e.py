#!/usr/bin/env python3
"""End-to-end equivalence test: stock llama.cpp client through our RPC server vs. stock.

For every model, greedy generation with stock `llama-completion` must print byte-identical stdout
(prompt + generated text) in every mode:

  local        no RPC, CPU backend, --no-repack                       (the reference)
  local#2      the same again (is the reference itself deterministic?)   [full]
  stock        --rpc <stock ggml-rpc-server>
  ours         --rpc <our server>
  ours --no-isolate  --rpc <ours with every session in one process (containment off)>
  ours x2      --rpc <ours A>,<ours B>        (layers split over two of our servers)
  stock x2     --rpc <stock A>,<stock B>      (control for "ours x2")      [full]
  stock+ours   --rpc <stock A>,<ours A>       (mixed)                      [full]
  stock -c / ours -c   server file cache (-c, LLAMA_CACHE=<workdir>/cache-*): a cold and a warm run,
               then the cache directories of stock and ours must hold the same file names and sizes
               [full; only models with a tensor > 10 MiB, i.e. gemma]; ours' directory is private
               (0700, as `mktemp -d` makes it): its contained sessions, which run as a uid of their
               own when the suite runs as root, are served the entries by the front

plus `llama-bench -m gemma --rpc <ours> -ngl 99 -p 16 -n 8 -r 1 -t 1` (exit 0, pp16 and tg8 rows).

All client flags are identical across modes except --rpc:
  llama-completion -m M -p PROMPT -n N --temp 0 -s 1 -t 1 -ngl 99 --no-repack -c 512
                   -no-cnv --simple-io --ignore-eos </dev/null
stdout carries only the prompt and the generated text (logs go to stderr). A client run whose stderr
lacks the perf summary lost the tail of its output at exit (see CLIENT_ATTEMPTS) and is repeated.

  python3 tests/e2e/run_e2e.py --stock-bin DIR [--ours target/release/rpc-server] [--quick]
  python3 tests/e2e/run_e2e.py --stock-bin DIR --ours DIR/ggml-rpc-server     # self-test with stock

Exit status 0 iff everything matched. Logs: --workdir (default: a fresh temp dir, kept on failure).
"""

import argparse
import difflib
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (CACHE, CountingProxy, Server, Servers, free_port, log, resolve_ours,  # noqa: E402
                        resolve_stock_bin, run, script_output, tail)
import synth_models  # noqa: E402

GEMMA_PROMPT = "The capital of France is"
SYNTH_PROMPT = "hello world, the quick brown fox"
QUICK_SYNTH = ["synth-qwen2-q8q4", "synth-llama-moe-kquant", "synth-mamba"]
BIG_TENSOR = 10 * 1024 * 1024  # the client uses SET_TENSOR_HASH above this size (server cache -c)
# llama-completion prints the generated text (stdout) and its logs (stderr) through one asynchronous
# log thread (common/log.cpp), and since llama.cpp #22142 that logger is leaked on purpose: main()
# returns 0 while entries may still be queued, and they are lost when the process exits. With a
# fast (synthetic) model on a busy machine the log thread lags behind, so stdout ends early at a
# random token: a prefix of the real output, exit status 0, and no perf summary on stderr (it is
# queued after the text). A run is therefore complete iff its stderr has the perf summary
# ("eval time = ... runs"); incomplete runs are repeated, up to this many attempts in all.
CLIENT_ATTEMPTS = 5

EVAL_RE = re.compile(rb"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs.*?([\d.]+) tokens per second")
RPC_BUF_RE = re.compile(rb"load_tensors: RPC\d+\[([^\]]+)\] model buffer size =\s*([\d.]+) MiB")
OFFLOAD_RE = re.compile(rb"offloaded (\d+)/(\d+) layers")
PROMPT_RE = re.compile(rb"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*?([\d.]+) tokens per second")


class Model:
    def __init__(self, name, path, prompt):
        self.name, self.path, self.prompt = name, path, prompt
        self.big = os.path.getsize(path) > BIG_TENSOR


def resolve_models(args):
    names = args.models or (["gemma"] + (QUICK_SYNTH if args.quick else list(synth_models.specs())))
    synth_dir = args.synth_dir or os.path.join(CACHE, "synth-models")
    sp = synth_models.specs()
    out = []
    for n in names:
        if n == "gemma":
            out.append(Model("gemma-3-270m", script_output("test-model.sh", timeout=900), GEMMA_PROMPT))
        elif n in sp:
            os.makedirs(synth_dir, exist_ok=True)
            path = os.path.join(synth_dir, n + ".gguf")
            synth_models.write_model(path, n, sp[n])
            out.append(Model(n, path, SYNTH_PROMPT))
        elif os.path.isfile(n):
            base = os.path.basename(n)
            out.append(Model(base[:-5] if base.endswith(".gguf") else base, os.path.abspath(n),
                             GEMMA_PROMPT if "gemma" in base.lower() else SYNTH_PROMPT))
        else:
            raise SystemExit("unknown model %r: use 'gemma', a synthetic name (%s) or a .gguf path"
                             % (n, ", ".join(sp)))
    return out


def completion_cmd(stock_bin, model, n_predict, rpc=None, ctx=512):
    cmd = [os.path.join(stock_bin, "llama-completion"), "-m", model.path, "-p", model.prompt,
           "-n", str(n_predict), "--temp", "0", "-s", "1", "-t", "1", "-ngl", "99", "--no-repack",
           "-c", str(ctx), "-no-cnv", "--simple-io", "--ignore-eos", "-lv", "4"]
    if rpc:
        cmd += ["--rpc", ",".join(rpc)]
    return cmd


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n if len(a) != len(b) else None


def show_diff(ref, out, ref_name, name):
    i = first_difference(ref, out)
    lines = ["first differing byte: %s (lengths %d vs %d)" % (i, len(ref), len(out))]
    if i is not None:
        lo = max(0, i - 40)
        lines.append("  %-12s ...%r" % (ref_name, ref[lo:i + 40]))
        lines.append("  %-12s ...%r" % (name, out[lo:i + 40]))
    a = ref.decode("utf-8", "backslashreplace").splitlines(keepends=True)
    b = out.decode("utf-8", "backslashreplace").splitlines(keepends=True)
    lines += [l.rstrip("\n") for l in difflib.unified_diff(a, b, ref_name, name)]
    return "\n".join(lines)


def parse_perf(err):
    m, p = EVAL_RE.search(err), PROMPT_RE.search(err)
    return dict(eval_runs=int(m.group(2)) if m else None, tg_tps=float(m.group(3)) if m else None,
                pp_tokens=int(p.group(2)) if p else None, pp_tps=float(p.group(3)) if p else None)


BENCH_ROW = re.compile(r"^\|.*\|\s*(pp\d+|tg\d+)\s*\|\s*([\d.]+)\s*±\s*([\d.]+)\s*\|\s*$")


def parse_bench_md(text):
    rows = {}
    for line in text.splitlines():
        m = BENCH_ROW.match(line.strip())
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows


class Results:
    def __init__(self):
        self.rows = []
        self.failures = 0

    def add(self, model, mode, ok, secs, note="", tps=None):
        self.rows.append(dict(model=model, mode=mode, ok=ok, secs=secs, note=note, tps=tps))
        if not ok:
            self.failures += 1
        status = "ok  " if ok else "FAIL"
        log("[%s] %-24s %-13s %6.2fs %s" % (status, model, mode, secs, note))

    def table(self):
        out = ["| model | mode | result | time (s) | tg t/s | note |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            out.append("| %s | %s | %s | %.2f | %s | %s |" % (
                r["model"], r["mode"], "ok" if r["ok"] else "**FAIL**", r["secs"],
                "%.1f" % r["tps"] if r["tps"] else "", r["note"].replace("|", "/")))
        return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="dir with stock ggml-rpc-server, llama-completion, llama-bench "
                    "(default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--models", nargs="+", help="'gemma', synthetic model names or .gguf paths "
                    "(default: gemma + all synthetic; --quick: gemma + %s)" % ", ".join(QUICK_SYNTH))
    ap.add_argument("--quick", action="store_true",
                    help="fewer models; modes local, stock, ours, ours x2 only; no cache modes")
    ap.add_argument("-n", "--n-predict", type=int, help="tokens to generate (default 64, --quick 32)")
    ap.add_argument("--server-threads", type=int, default=1, help="-t for every server (default 1)")
    ap.add_argument("--timeout", type=float, default=300, help="per client run, seconds (default 300)")
    ap.add_argument("--no-bench", action="store_true", help="skip the llama-bench smoke run")
    ap.add_argument("--workdir", help="logs and outputs (default: fresh temp dir, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir on success too")
    ap.add_argument("--synth-dir", help="where synthetic models are cached (default: %s)"
                    % os.path.join(CACHE, "synth-models"))
    args = ap.parse_args()

    t_start = time.monotonic()
    n_predict = args.n_predict or (32 if args.quick else 64)
    stock_bin = resolve_stock_bin(args.stock_bin)
    ours_bin = resolve_ours(args.ours)
    models = resolve_models(args)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="rpc-e2e-"))
    os.makedirs(workdir, exist_ok=True)
    log("workdir: %s\nstock: %s\nours:  %s\nmodels: %s" % (workdir, stock_bin, ours_bin,
                                                           ", ".join(m.name for m in models)))
    results = Results()
    stock_srv = os.path.join(stock_bin, "ggml-rpc-server")
    full = not args.quick
    any_big = any(m.big for m in models)

    with Servers() as servers:
        used = set()

        def new(name, binary, env=None, extra=()):
            port = free_port(used)
            used.add(port)
            return servers.add(Server(name, binary, port, workdir, threads=args.server_threads,
                                      env=env, extra=extra))

        srv = {"stockA": new("stockA", stock_srv), "oursA": new("oursA", ours_bin),
               "oursB": new("oursB", ours_bin),
               "oursI": new("oursI", ours_bin, extra=["--no-isolate"])}
        if full:
            srv["stockB"] = new("stockB", stock_srv)
        cache_dirs, proxies = {}, {}
        if full and any_big:
            for who, binary in (("stock", stock_srv), ("ours", ours_bin)):
                d = os.path.join(workdir, "cache-" + who)
                os.makedirs(d, exist_ok=True)
                cache_dirs[who] = os.path.join(d, "rpc")
                if who == "ours":
                    os.makedirs(cache_dirs[who], exist_ok=True)
                    os.chmod(cache_dirs[who], 0o700)
                srv[who + "C"] = new(who + "C", binary, env={"LLAMA_CACHE": d}, extra=["-c"])
                proxies[who + "C"] = CountingProxy(srv[who + "C"].port)

        def ep(x):
            return proxies[x].endpoint if x in proxies else srv[x].endpoint

        modes = [("local", [])]
        if full:
            modes.append(("local#2", []))
        modes += [("stock", ["stockA"]), ("ours", ["oursA"]), ("ours --no-isolate", ["oursI"]),
                  ("ours x2", ["oursA", "oursB"])]
        if full:
            modes += [("stock x2", ["stockA", "stockB"]), ("stock+ours", ["stockA", "oursA"])]

        for model in models:
            mmodes = list(modes)
            if model.big and cache_dirs:
                mmodes += [("stock -c cold", ["stockC"]), ("stock -c warm", ["stockC"]),
                           ("ours -c cold", ["oursC"]), ("ours -c warm", ["oursC"])]
            ref = None
            cold_up = {}
            for mode, names in mmodes:
                for x in names:
                    if x in proxies:
                        proxies[x].reset()
                notes = [n for n in (srv[x].ensure() for x in names) if n]
                tag = "%s.%s" % (model.name, mode.replace(" ", "_").replace("#", "").replace("+", "_"))
                cmd = completion_cmd(stock_bin, model, n_predict, [ep(x) for x in names])
                out_path, err_path = os.path.join(workdir, tag + ".out"), os.path.join(workdir, tag + ".err")
                attempt = 1
                while True:
                    rc, out, err, dt = run(cmd, args.timeout, out_path, err_path)
                    if rc != 0 or EVAL_RE.search(err) or attempt >= CLIENT_ATTEMPTS:
                        break
                    # exit 0 but no perf summary: the client's log thread lost the tail (see
                    # CLIENT_ATTEMPTS); keep the truncated files and run the same command again
                    for path in (out_path, err_path):
                        os.replace(path, "%s.truncated%d%s" % (path[:-4], attempt, path[-4:]))
                    log("  %s / %s: client output truncated at exit (%d bytes, no perf summary); "
                        "rerunning" % (model.name, mode, len(out)))
                    attempt += 1
                    time.sleep(0.5)
                    for x in names:  # a cold cache run counts the bytes of all its attempts
                        if x in proxies and not mode.endswith("cold"):
                            proxies[x].reset()
                if attempt > 1:
                    notes.append("run %d times: client output truncated at exit" % attempt)
                perf = parse_perf(err)
                problems = []
                if rc != 0:
                    problems.append("exit %s" % rc)
                if not out.strip():
                    problems.append("empty stdout")
                if rc == 0 and perf["eval_runs"] is None:
                    problems.append("no perf summary on stderr in %d attempts: output truncated at exit"
                                    % attempt)
                if perf["eval_runs"] is not None and perf["eval_runs"] < n_predict - 1:
                    problems.append("only %d eval runs" % perf["eval_runs"])
                eps = [ep(x) for x in names]
                bufs = {ep.decode(): float(mib) for ep, mib in RPC_BUF_RE.findall(err)}
                if names and rc == 0:
                    if not bufs or not set(bufs) <= set(eps):
                        problems.append("weights not on the RPC servers (model buffers: %s)" % (bufs or "none"))
                    else:
                        off = OFFLOAD_RE.search(err)
                        notes.append("%slayers on RPC, MiB per server: %s" % (
                            "%s/%s " % (off.group(1).decode(), off.group(2).decode()) if off else "",
                            "/".join("%.1f" % bufs.get(ep, 0.0) for ep in eps)))
                elif not names and bufs:
                    problems.append("local run used RPC buffers?")
                for x in names:
                    if x in proxies:
                        px = proxies[x]
                        notes.append("sent %.1f MB in %d connections" % (px.up / 1e6, px.conns))
                        if mode.endswith("cold"):
                            cold_up[x] = px.up
                        elif x in cold_up and not px.up < 0.5 * cold_up[x]:
                            problems.append("warm cache run sent %d bytes, cold %d: no hash-cache hit?"
                                            % (px.up, cold_up[x]))
                dead = [x for x in names if not srv[x].alive()]
                if dead:
                    problems.append("server died: " + ",".join(dead))
                if ref is None:  # the first mode is "local": the reference
                    ref = b"" if problems else out
                    if not problems:
                        notes.append("%d bytes" % len(out))
                elif not ref:
                    if not problems:
                        problems.append("no local reference to compare with")
                elif out != ref and not problems:
                    problems.append("output differs from local")
                ok = not problems
                if not ok:
                    # a failed/killed client can take a server down a moment later (the stock server
                    # dies of SIGPIPE when its client vanishes mid-reply): restart the servers involved
                    # so that one failure does not cascade into the following modes
                    time.sleep(1.0)
                    for x in names:
                        was = "alive" if srv[x].alive() else "dead (exit %s)" % srv[x].proc.returncode
                        srv[x].stop()
                        srv[x].start()
                        notes.append("restarted %s (was %s)" % (x, was))
                results.add(model.name, mode, ok, dt, "; ".join(problems + notes), perf["tg_tps"])
                if not ok:
                    print("\n===== FAIL %s / %s: %s\n$ %s" % (model.name, mode, "; ".join(problems),
                                                           " ".join(cmd)), flush=True)
                    if out != ref and ref:
                        print(show_diff(ref, out, "local", mode), flush=True)
                    print("--- client stderr (tail):\n" + tail(os.path.join(workdir, tag + ".err"), 30))
                    for x in names:
                        print("--- server %s log (tail):\n%s" % (x, tail(srv[x].log_path, 30)), flush=True)

        if cache_dirs:
            # The entries (one file per hash, named by 16 hex digits) must be the same files; besides
            # them ours keeps one record of the entries it has verified (`verified-entries`, which the
            # stock server ignores), and nothing else.
            listing, extra = {}, {}
            for who, d in cache_dirs.items():
                files, others = {}, []
                for root, _, fs in os.walk(d):
                    for f in fs:
                        p = os.path.join(root, f)
                        rel = os.path.relpath(p, d)
                        if len(rel) == 16 and all(c in "0123456789abcdef" for c in rel):
                            files[rel] = os.path.getsize(p)
                        else:
                            others.append(rel)
                listing[who], extra[who] = files, sorted(others)
            ok = (bool(listing["stock"]) and listing["stock"] == listing["ours"] and not extra["stock"]
                  and extra["ours"] in ([], ["verified-entries"]))
            note = "stock %d entries / %d B, ours %d entries / %d B; other files: stock %s, ours %s" % (
                len(listing["stock"]), sum(listing["stock"].values()),
                len(listing["ours"]), sum(listing["ours"].values()),
                extra["stock"] or "none", extra["ours"] or "none")
            results.add("(server cache -c)", "same entries", ok, 0.0, note)
            if not ok:
                print("\n===== FAIL cache directories differ\nstock: %s %s\nours:  %s %s"
                      % (sorted(listing["stock"].items()), extra["stock"], sorted(listing["ours"].items()),
                         extra["ours"]), flush=True)

        gemma = [m for m in models if m.name == "gemma-3-270m"]
        if not args.no_bench and gemma:
            n = srv["oursA"].ensure()
            cmd = [os.path.join(stock_bin, "llama-bench"), "-m", gemma[0].path, "--rpc", srv["oursA"].endpoint,
                   "-ngl", "99", "-p", "16", "-n", "8", "-r", "1", "-t", "1"]
            rc, out, err, dt = run(cmd, args.timeout, os.path.join(workdir, "bench.out"),
                                   os.path.join(workdir, "bench.err"))
            rows = parse_bench_md(out.decode("utf-8", "replace"))
            problems = []
            if rc != 0:
                problems.append("exit %s" % rc)
            for k in ("pp16", "tg8"):
                if k not in rows:
                    problems.append("no %s row" % k)
            note = ", ".join("%s %.1f t/s" % (k, v[0]) for k, v in sorted(rows.items()))
            results.add("gemma-3-270m", "llama-bench", not problems, dt,
                        "; ".join(problems + ([n] if n else []) + [note]), rows.get("tg8", (None,))[0])
            if problems:
                print("\n===== FAIL llama-bench: %s\n$ %s\n--- stdout:\n%s\n--- stderr (tail):\n%s\n"
                      "--- server oursA log (tail):\n%s" % ("; ".join(problems), " ".join(cmd),
                      out.decode("utf-8", "replace"), tail(os.path.join(workdir, "bench.err"), 30),
                      tail(srv["oursA"].log_path, 30)), flush=True)

    total = time.monotonic() - t_start
    print("\n" + results.table())
    n_ok = sum(1 for r in results.rows if r["ok"])
    print("\n%d/%d checks passed in %.1fs (%s; n_predict=%d; stock=%s; ours=%s)" % (
        n_ok, len(results.rows), total, "quick" if args.quick else "full", n_predict, stock_bin, ours_bin))
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(dict(rows=results.rows, total_secs=total, quick=args.quick, n_predict=n_predict,
                       stock_bin=stock_bin, ours=ours_bin), f, indent=1)
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
        print("interrupted (%s); servers stopped" % e, file=sys.stderr)
        sys.exit(130)
