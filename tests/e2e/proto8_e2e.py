#!/usr/bin/env python3
"""Protocol 8.0.0 end to end: stock llama.cpp 8.0 clients against our rpc-server, and stock 7.0
clients beside them on its --proto7-port, each compared with the stock server of its major in the
same run (greedy output, byte for byte; nothing expected is hard-coded).

  layer     gemma-3-270m, stock 8.0 llama-completion, layer split: ours vs stock (one server),
            ours x2 vs stock x2 (--rpc a,b)
  tensor    a synthetic llama (synth-llama-f16), -sm tensor over two servers (SET_TENSOR_2D,
            COMM_INIT, COMM_ALLREDUCE): stock x2 is the reference and must have set up the pairwise
            communicator ("pairwise communicator initialized"); ours x2 (through frame-counting
            proxies: the 8.0-only commands must have reached our servers), ours+stock and
            stock+ours (ours as rank 0, then as rank 1). Whether a run had the communicator or fell
            back to reducing through the client (a server may answer COMM_INIT with 0) is noted.
            Linux: ours x2 at another address (127.0.0.2) behind rpc-shim on 127.0.0.1, the way a
            TCP-only client reaches workers on other hosts: the client names the shim's endpoints,
            the workers must dial each other's real address (the shim rewrites COMM_INIT), and must
            have joined the communicator.
  both      ONE rpc-server process (-p P --proto7-port Q, also used by layer and tensor) serves a
            stock 8.0 client on P and a stock 7.0 client on Q at the same time; each gets the text
            it gets from its own stock server (8.0: the layer case's stock run; 7.0: a stock 7.0
            server), and the banner names both ports and both versions.
  mismatch  a stock 8.0 client against our Q and a stock 7.0 client against our P abort (SIGABRT,
            exit 134 in a shell) with upstream's "RPC server version mismatch: 7.0.0" / "8.0.0",
            exactly as against the stock server of the other major; our server lives on.
  http      stock 8.0 llama-server on ours vs on a stock 8.0 server: one /completion request
            (gemma), the same text.

A llama-completion run whose stderr lacks the perf summary is repeated (run_e2e.py's rule, up to
5 attempts). Servers run with -t 1, clients with -t 1.

  python3 tests/e2e/proto8_e2e.py --stock-bin STOCK8 --stock7-bin STOCK7 [--ours target/release/rpc-server]
        [--model GGUF] [--tensor-model GGUF] [--only layer,tensor,both,mismatch,http] [-n N] [--keep]
  STOCK8: STOCK_PROTO=8 scripts/stock-llama.sh; STOCK7: scripts/stock-llama.sh (the defaults when not given)
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (CACHE, CountingProxy, Server, Servers, clean_env, free_port, has_proto7_port,  # noqa: E402
                        log, resolve_ours, resolve_stock_bin, script_output, tail, wait_listening)
from idle_e2e import LlamaServer  # noqa: E402
from run_e2e import (GEMMA_PROMPT, RPC_BUF_RE, SYNTH_PROMPT, Model, Results, completion_cmd,  # noqa: E402
                     show_diff)
from shim_e2e import resolve_shim, run_client  # noqa: E402
import synth_models  # noqa: E402

TENSOR_MODEL = "synth-llama-f16"
COMM_OK = b"pairwise communicator initialized"
MISMATCH_RE = re.compile(rb"RPC server version mismatch: [0-9.]+")
# What a stock 8.0 client's tensor split sends to each of its servers (delta doc sections C, D)
# whether or not the servers set up the pairwise communicator; COMM_ALLREDUCE and COMM_FREE only
# when they did, GET_TENSOR_2D only for multi-row logit reads (counted, not required).
TENSOR_COMMANDS = ("SET_TENSOR_2D", "COMM_INIT", "GRAPH_RECOMPUTE")
TENSOR_COUNTED = TENSOR_COMMANDS + ("COMM_ALLREDUCE", "COMM_FREE", "GET_TENSOR_2D")
TENSOR_TIMEOUT = 90.0  # s; a stock rank 0 whose peer never dials waits in accept() without a timeout

# (mode, endpoints in --rpc order, the mode it must equal; None: a reference)
LAYER_MODES = [
    ("stock", ["stockA"], None),
    ("ours", ["oursA"], "stock"),
    ("stock x2", ["stockA", "stockB"], None),
    ("ours x2", ["oursA", "oursB"], "stock x2"),
]
TENSOR_MODES = [
    ("stock x2", ["stockA", "stockB"], None),
    ("ours x2", ["proxyA", "proxyB"], "stock x2"),  # proxies in front of oursA, oursB
    ("ours+stock", ["oursA", "stockB"], "stock x2"),
    ("stock+ours", ["stockA", "oursB"], "stock x2"),
]
# (mode, client's major, our listener it reaches, the stock server of the other major: reference)
MISMATCH_MODES = [
    ("8.0 client -> our 7.0 port", 8, "oursA7", "stock7"),
    ("7.0 client -> our 8.0 port", 7, "oursA", "stockA"),
]
OTHER = {"stock7": "stock 7.0 server", "stockA": "stock 8.0 server"}
MISMATCH_ATTEMPTS = 10
GROUPS = ("layer", "tensor", "both", "mismatch", "http")
# Our servers listen on random ports here (a rack's share one, inside the default window of
# --comm-peer-ports): each may pair with any.
COMM_PEERS = ["--comm-peer-ports", "1-64535"]


class Suite:
    """The servers, clients and results of one run."""

    def __init__(self, args, servers, workdir):
        self.args, self.servers, self.workdir = args, servers, workdir
        self.results = Results()
        self.refs = {}  # (group, mode) -> stdout
        self.srv = {}
        self.proxies = {}
        self.behind = {"oursA7": "oursA", "proxyA": "oursA", "proxyB": "oursB"}  # endpoint -> its server
        self.ours = args.ours
        self.dual = has_proto7_port(self.ours)  # ours speaks 8.0 on -p and 7.0 on --proto7-port
        self.bins = {8: args.stock_bin, 7: args.stock7_bin}

    # --- servers -------------------------------------------------------------------------------

    def start_servers(self, need7):
        stock8 = os.path.join(self.bins[8], "ggml-rpc-server")
        for name in ("stockA", "stockB"):
            self.add(Server(name, stock8, free_port(), self.workdir, threads=1, proto=8))
        self.port7 = free_port()
        extra = (["--proto7-port", str(self.port7)] if self.dual else []) + COMM_PEERS
        self.add(Server("oursA", self.ours, free_port(), self.workdir, threads=1, proto=8, extra=extra))
        self.add(Server("oursB", self.ours, free_port(), self.workdir, threads=1, proto=8, extra=COMM_PEERS))
        if self.dual and not wait_listening("127.0.0.1", self.port7, 30, self.srv["oursA"].proc):
            raise RuntimeError("oursA does not listen on --proto7-port %d:\n%s"
                               % (self.port7, tail(self.srv["oursA"].log_path)))
        if need7:
            self.add(Server("stock7", os.path.join(self.bins[7], "ggml-rpc-server"), free_port(), self.workdir,
                            threads=1, proto=7))

    def add(self, server):
        self.srv[server.name] = self.servers.add(server)

    def endpoint(self, name):
        if name == "oursA7":
            return "127.0.0.1:%d" % self.port7
        if name in self.proxies:
            return self.proxies[name].endpoint
        return self.srv[name].endpoint

    def restart(self, endpoints):
        """After a failed run: restart the servers it used (a stock server dies of SIGPIPE when its
        client does, and a stock rank 0 whose peer never dialed still waits in accept())."""
        names = {self.behind.get(e, e) for e in endpoints}
        for name in sorted(names & set(self.srv)):
            log("  restarting %s" % name)
            self.srv[name].stop()
            self.srv[name].start()
            if name == "oursA" and self.dual:
                wait_listening("127.0.0.1", self.port7, 30, self.srv[name].proc)

    # --- clients -------------------------------------------------------------------------------

    def complete(self, tag, major, model, rpc, extra=(), timeout=None):
        """llama-completion of the given major; (rc, stdout, stderr, secs)."""
        cmd = completion_cmd(self.bins[major], model, self.args.n_predict, [self.endpoint(e) for e in rpc])
        base = os.path.join(self.workdir, re.sub(r"[^A-Za-z0-9_.-]+", "_", tag))
        rc, out, err, dt, attempts = run_client(cmd + list(extra), timeout or self.args.timeout, base + ".out",
                                                base + ".err")
        if attempts > 1:
            log("  %s: %d attempts (truncated output before)" % (tag, attempts))
        return rc, out, err, dt

    def judge(self, group, model, mode, run, rpc, ref_mode, need=(), layer=False, note=""):
        """Records one run on the endpoints `rpc`: exit 0, the text of `ref_mode` (None: it becomes
        the reference), every byte string in `need` on stderr, the weights on those endpoints
        (`layer`)."""
        rc, out, err, dt = run
        problems = []
        if rc != 0:
            problems.append("exit %s" % rc)
        for n in need:
            if n not in err:
                problems.append("stderr lacks %r" % n.decode())
        if layer:
            bufs = {m.group(1).decode() for m in RPC_BUF_RE.finditer(err)}
            want = {self.endpoint(e) for e in rpc}
            if bufs != want:
                problems.append("weights in RPC buffers of %s, not %s" % (sorted(bufs), sorted(want)))
        if ref_mode is None:
            if not problems:
                self.refs[(group, mode)] = out
        else:
            ref = self.refs.get((group, ref_mode))
            if ref is None:
                problems.append("no reference (%s failed)" % ref_mode)
            elif out != ref and rc == 0:
                problems.append("output differs from %s" % ref_mode)
                print("\n===== %s %s vs %s\n%s" % (group, mode, ref_mode, show_diff(ref, out, ref_mode, mode)),
                      flush=True)
        if problems:
            print("\n===== FAIL %s %s: %s\n--- client stderr tail:\n%s" % (
                group, mode, "; ".join(problems), tail_bytes(err)), flush=True)
            self.restart(rpc)
        ok_note = "%s (%d words)%s" % ("reference" if ref_mode is None else "= " + ref_mode, len(out.split()),
                                       "; " + note if note else "")
        self.results.add(model.name, "%s: %s" % (group, mode), not problems, dt, "; ".join(problems) or ok_note)
        return not problems

    # --- the cases -----------------------------------------------------------------------------

    def layer(self, gemma):
        for mode, rpc, ref in LAYER_MODES:
            run = self.complete("layer-" + mode, 8, gemma, rpc)
            self.judge("layer", gemma, mode, run, rpc, ref, layer=True)

    def tensor(self, synth):
        for name in ("A", "B"):  # a port from free_port: rank 0's comm port (+1000) is free
            self.proxies["proxy" + name] = CountingProxy(self.srv["ours" + name].port, port=free_port())
        for mode, rpc, ref in TENSOR_MODES:
            for p in self.proxies.values():
                p.reset()
            run = self.complete("tensor-" + mode, 8, synth, rpc, extra=["-sm", "tensor"], timeout=TENSOR_TIMEOUT)
            # The reference must have used the pairwise communicator (else COMM_* went untested);
            # a server may answer COMM_INIT with 0 (the client then reduces through itself).
            ok = self.judge("tensor", synth, mode, run, rpc, ref, need=[COMM_OK] if ref is None else [],
                            note="communicator: %s" % ("yes" if COMM_OK in run[2] else "no (fallback)"))
            counted = [p for name, p in self.proxies.items() if name in rpc]
            if ok and counted:
                missing = {"%s: %s" % (name, c) for name, p in self.proxies.items() if name in rpc
                           for c in TENSOR_COMMANDS if c not in p.commands}
                seen = ", ".join("%s %d" % (c, counted[0].commands.get(c, [0])[0])
                                 for c in TENSOR_COUNTED)
                self.results.add(synth.name, "tensor: %s, 8.0 commands" % mode, not missing, 0.0,
                                 "missing %s" % ", ".join(sorted(missing)) if missing
                                 else "each of ours got %s (first: %s)" % ("/".join(TENSOR_COMMANDS), seen))
        self.tensor_bf16(synth)
        if sys.platform.startswith("linux"):
            self.tensor_through_shim(synth)

    def tensor_bf16(self, synth):
        """A prompt long enough that the prompt's partials (n_embd x tokens) reach 32768 elements,
        which the stock link sends as bf16 (each rank adds the peer's rounded partial): ours must
        round as stock does, in either rank."""
        long = Model(synth.name, synth.path, " ".join([SYNTH_PROMPT] * 14))  # ~320 tokens
        ref = None
        modes = [("stock x2", ["stockA", "stockB"], None), ("ours x2", ["oursA", "oursB"], "stock x2")]
        for mode, rpc, ref_mode in modes + [m for m in TENSOR_MODES if "+" in m[0]]:
            run = self.complete("tensor-bf16-" + mode, 8, long, rpc, extra=["-sm", "tensor"], timeout=TENSOR_TIMEOUT)
            self.judge("tensor-bf16", long, mode + ", ~320-token prompt (bf16 partials)", run, rpc,
                       ref_mode and ref_mode + ", ~320-token prompt (bf16 partials)", need=[COMM_OK])
            ref = ref or run

    def tensor_through_shim(self, synth):
        """Two of ours on 127.0.0.2 (another address than the client's), rpc-shim on 127.0.0.1."""
        for name in ("C", "D"):
            self.add(Server("ours" + name, self.ours, free_port(), self.workdir, threads=1, proto=8,
                            host="127.0.0.2", extra=COMM_PEERS))
        listen = [free_port(), free_port()]
        cmd = [self.args.shim]
        for name, port in zip(("C", "D"), listen):
            cmd += ["--worker", self.srv["ours" + name].endpoint, "--listen", "127.0.0.1:%d" % port]
        shim = Server("shim", self.args.shim, listen[0], self.workdir, proto=8, env={"RPC_LOG": "info"})
        shim.cmd = lambda: cmd
        self.add(shim)
        wait_listening("127.0.0.1", listen[1], 30, shim.proc)
        self.proxies["shimC"] = type("Ep", (), {"endpoint": "127.0.0.1:%d" % listen[0]})()
        self.proxies["shimD"] = type("Ep", (), {"endpoint": "127.0.0.1:%d" % listen[1]})()
        self.behind.update({"shimC": "shim", "shimD": "shim"})
        rpc = ["shimC", "shimD"]
        run = self.complete("tensor-shim", 8, synth, rpc, extra=["-sm", "tensor"], timeout=TENSOR_TIMEOUT)
        self.judge("tensor", synth, "ours x2 on 127.0.0.2 through rpc-shim", run, rpc, "stock x2", need=[COMM_OK],
                   note="communicator: %s" % ("yes" if COMM_OK in run[2] else "no (fallback)"))
        del self.proxies["shimC"], self.proxies["shimD"]

    def both(self, gemma):
        if not self.need_dual("both", gemma):
            return
        ref7 = self.complete("both-stock 7.0", 7, gemma, ["stock7"])
        self.judge("both", gemma, "7.0 client, stock 7.0 server", ref7, ["stock7"], None, layer=True)
        if ("layer", "stock") not in self.refs:
            self.judge("layer", gemma, "stock", self.complete("layer-stock", 8, gemma, ["stockA"]), ["stockA"], None)
        runs = {}

        def go(major, where):
            runs[major] = self.complete("both-ours %d.0" % major, major, gemma, [where])

        threads = [threading.Thread(target=go, args=(8, "oursA")), threading.Thread(target=go, args=(7, "oursA7"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.refs[("both", "8.0 client, stock 8.0 server")] = self.refs.get(("layer", "stock"))
        self.judge("both", gemma, "8.0 client on our -p", runs[8], ["oursA"], "8.0 client, stock 8.0 server",
                   layer=True)
        self.judge("both", gemma, "7.0 client on our --proto7-port (same process, same time)", runs[7],
                   ["oursA7"], "7.0 client, stock 7.0 server", layer=True)
        with open(self.srv["oursA"].log_path, "rb") as f:
            banner = f.read()
        want = [b"8.0.0", b"7.0.0", b"%d" % self.srv["oursA"].port, b"%d" % self.port7]
        lacks = [w.decode() for w in want if w not in banner]
        self.results.add(gemma.name, "both: banner names both listeners", not lacks, 0.0,
                         "log lacks %s" % ", ".join(lacks) if lacks else "ports %d (8.0.0), %d (7.0.0)"
                         % (self.srv["oursA"].port, self.port7))

    def mismatch(self, gemma):
        if not self.need_dual("mismatch", gemma):
            return
        for mode, major, ours_ep, stock_ep in MISMATCH_MODES:
            s_rc, s_msg, _, _ = self.refused(gemma, major, stock_ep, "stock")
            o_rc, o_msg, o_err, dt = self.refused(gemma, major, ours_ep, "ours")
            problems = []
            if s_rc != -signal.SIGABRT or s_msg is None:
                problems.append("the stock reference did not abort with a version mismatch (exit %s, %r)"
                                % (s_rc, s_msg))
            if o_rc != -signal.SIGABRT:
                problems.append("exit %s, not SIGABRT (134) as against the stock server" % o_rc)
            if o_msg != s_msg:
                problems.append("message %r, the stock server gives %r" % (o_msg, s_msg))
            if not self.srv["oursA"].alive():
                problems.append("our server died")
            if problems:
                print("\n===== FAIL mismatch %s: %s\n--- client stderr tail:\n%s" % (
                    mode, "; ".join(problems), tail_bytes(o_err)), flush=True)
                self.restart([ours_ep, stock_ep])
            self.results.add(gemma.name, "mismatch: " + mode, not problems, dt, "; ".join(problems) or
                             "SIGABRT, %r, as against the %s" % (o_msg.decode(), OTHER[stock_ep]))

    def refused(self, model, major, endpoint, who):
        """A llama-completion of `major` against `endpoint` that should abort at the handshake:
        (rc, the mismatch message or None, stderr, secs). The message goes through the client's
        asynchronous logger, which the abort may kill before it writes (the abort's own line is
        written directly). Here the abort first tries a backtrace (gdb; no GGML_NO_BACKTRACE), which
        gives the logger time: 10 of 10 runs had the message, against 1 to 3 of 10 without. A run
        without it is still repeated, up to MISMATCH_ATTEMPTS in all."""
        cmd = completion_cmd(self.bins[major], model, 1, [self.endpoint(endpoint)])
        env = clean_env()
        env.pop("GGML_NO_BACKTRACE", None)
        for attempt in range(1, MISMATCH_ATTEMPTS + 1):
            err_path = os.path.join(self.workdir, "mismatch-%d-%s-%d.err" % (major, who, attempt))
            t0 = time.monotonic()
            with open(err_path, "wb") as ef:
                p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=ef,
                                     start_new_session=True, env=env)
                try:
                    rc = p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    rc = p.wait()
            dt = time.monotonic() - t0
            with open(err_path, "rb") as f:
                err = f.read()
            m = MISMATCH_RE.search(err)
            if m or rc != -signal.SIGABRT:
                break
        return rc, m.group(0) if m else None, err, dt

    def http(self, gemma):
        texts = {}
        for who in ("stockA", "oursA"):
            ls = LlamaServer("llama-server-" + who, os.path.join(self.bins[8], "llama-server"), free_port(),
                             self.workdir, gemma.path, [self.endpoint(who)])
            t0 = time.monotonic()
            try:
                self.servers.add(ls)
                texts[who] = ls.complete(self.args.n_predict)
            except RuntimeError as e:  # it did not come up
                texts[who] = None
                log(str(e))
            finally:
                ls.stop()
                if ls in self.servers.items:
                    self.servers.items.remove(ls)
            dt = time.monotonic() - t0
        ref, text = texts["stockA"], texts["oursA"]
        problems = []
        if not ref:
            problems.append("no answer from llama-server on the stock server (%r)" % ref)
        elif text != ref:
            problems.append("answer %r, on the stock server %r" % (text, ref))
        if problems:
            print("\n===== FAIL http: %s\n--- llama-server log:\n%s" % ("; ".join(problems), tail(ls.log_path)),
                  flush=True)
            self.restart(["stockA", "oursA"])
        self.results.add(gemma.name, "http: llama-server on ours vs stock", not problems, dt,
                         "; ".join(problems) or "same answer, %r" % text)

    def need_dual(self, group, model):
        if self.dual:
            return True
        self.results.add(model.name, group, False, 0.0, "%s has no --proto7-port" % self.ours)
        return False


def tail_bytes(b, n=15):
    return "\n".join(b.decode("utf-8", "backslashreplace").splitlines()[-n:])


def resolve_stock8(arg):
    d = arg or os.environ.get("STOCK_BIN8")
    if not d:
        log("--stock-bin not given: running STOCK_PROTO=8 scripts/stock-llama.sh (builds on first use, ~12 min)")
        os.environ["STOCK_PROTO"] = "8"
        try:
            d = script_output("stock-llama.sh", timeout=3600)
        finally:
            del os.environ["STOCK_PROTO"]
    return resolve_stock_bin(d, needed=("ggml-rpc-server", "llama-completion", "llama-server"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock-bin", help="stock 8.0 tools: ggml-rpc-server, llama-completion, llama-server "
                    "(default: $STOCK_BIN8, else STOCK_PROTO=8 scripts/stock-llama.sh)")
    ap.add_argument("--stock7-bin", help="stock 7.0 tools: ggml-rpc-server, llama-completion (default: "
                    "$STOCK_BIN, else scripts/stock-llama.sh); only for the both and mismatch cases")
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--shim", help="rpc-shim binary (default: target/release/rpc-shim)")
    ap.add_argument("--model", help="gemma-3-270m GGUF (default: scripts/test-model.sh)")
    ap.add_argument("--tensor-model", help="GGUF for tensor mode (default: %s written by synth_models.py into "
                    "$RPC_CACHE_DIR/models/synth)" % TENSOR_MODEL)
    ap.add_argument("--only", help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("-n", "--n-predict", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=300.0, help="per client run (s)")
    ap.add_argument("--workdir", help="logs (default: a fresh temp dir, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    args = ap.parse_args()

    groups = [g.strip() for g in args.only.split(",")] if args.only else list(GROUPS)
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        ap.error("unknown group(s) %s (have: %s)" % (", ".join(bad), ", ".join(GROUPS)))
    need7 = any(g in groups for g in ("both", "mismatch"))
    args.stock_bin = resolve_stock8(args.stock_bin)
    args.stock7_bin = resolve_stock_bin(args.stock7_bin, needed=("ggml-rpc-server", "llama-completion")) \
        if need7 else None
    args.ours = resolve_ours(args.ours)
    args.shim = resolve_shim(args.shim) if "tensor" in groups and sys.platform.startswith("linux") else None
    gemma = Model("gemma-3-270m", args.model or script_output("test-model.sh", timeout=900), GEMMA_PROMPT)
    # A client that aborts (a refused handshake, a server that closed) would first attach gdb for
    # a backtrace: slow and noisy.
    os.environ["GGML_NO_BACKTRACE"] = "1"
    tpath = args.tensor_model
    if not tpath and "tensor" in groups:
        d = os.path.join(CACHE, "models", "synth")
        os.makedirs(d, exist_ok=True)
        tpath = os.path.join(d, TENSOR_MODEL + ".gguf")
        synth_models.write_model(tpath, TENSOR_MODEL, synth_models.specs()[TENSOR_MODEL])
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="rpc-proto8-e2e-"))
    os.makedirs(workdir, exist_ok=True)
    log("workdir: %s\nstock 8.0: %s\nstock 7.0: %s\nours: %s (--proto7-port: %s)\ngroups: %s"
        % (workdir, args.stock_bin, args.stock7_bin, args.ours, has_proto7_port(args.ours), ", ".join(groups)))

    t0 = time.monotonic()
    with Servers() as servers:
        suite = Suite(args, servers, workdir)
        suite.start_servers(need7)
        for g in GROUPS:
            if g in groups:
                log("== %s" % g)
                model = Model(os.path.basename(tpath)[:-5], tpath, SYNTH_PROMPT) if g == "tensor" else gemma
                getattr(suite, g)(model)
        dead = [s.name for s in suite.srv.values() if not s.alive()]
        if dead:
            suite.results.add("-", "servers alive at the end", False, 0.0, "died: " + ", ".join(dead))
        for p in suite.proxies.values():
            p.close()

    print("\n" + suite.results.table())
    log("%d checks, %d failed, %.0f s" % (len(suite.results.rows), suite.results.failures, time.monotonic() - t0))
    if suite.results.failures:
        log("logs kept in %s" % workdir)
        return 1
    if not (args.workdir or args.keep):
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
