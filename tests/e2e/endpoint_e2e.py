#!/usr/bin/env python3
"""One endpoint over many workers: `rpc-shim --one-endpoint --worker A --worker B ...` gives a stock
llama.cpp 8.0 client ONE RPC endpoint whose devices are the workers' devices, in worker order. The
client's copies between two devices of one endpoint are a COPY_TENSOR on that endpoint, so the data
goes worker to worker behind the shim; between devices of two endpoints the client reads the tensor
(GET_TENSOR) and writes it (SET_TENSOR) itself. Each one-endpoint run is compared with the same
client over the same N of our rpc-servers named as N separate endpoints (greedy, byte for byte; the
expected text is never hard-coded). Every client runs behind frame-counting proxies, which also
attribute each answer to the request it answers, so the GET_TENSOR bytes that reached the client
are known per run.

  layer   gemma-3-270m, layer split (the default -sm layer), N = 2 and 4. The reference, --rpc A,B,..
          (N endpoints), passes each hidden state through the client (GET_TENSOR from the device of
          one layer range, SET_TENSOR to the next); --rpc <shim> (one endpoint of N devices) must
          print the same text, have the weights on N devices of that endpoint, send at least one
          COPY_TENSOR (all answered 1, i.e. copied), and read no more GET_TENSOR bytes per generated
          token than a single server (--rpc A) plus a small margin: half of the per-token excess
          that the 2-endpoint reference shows over the single server, which is (about) one hidden
          state (n_embd 640 x f32) per decode step. That proves the hidden states stay behind the
          shim. The references themselves must show the excess (else the bound proves nothing).
  tensor  synth-llama-f16, -sm tensor, N = 2, 3, 4; reference: N endpoints. With N = 2 separate
          endpoints the stock client sets up the servers' pairwise communicator (COMM_INIT,
          COMM_ALLREDUCE: the partial sums go server to server; required, "pairwise communicator
          initialized"); with N > 2 it has none (the stock communicator is pairwise only) and
          reduces by recursive doubling itself: per reduction, copies between devices plus a
          one-node ADD graph on the receiving device, the copies through the client. One endpoint
          of N devices never gets a communicator either (the stock client refuses two ranks on one
          endpoint: "multiple ranks on endpoint ... are not supported") and reduces the same way,
          its copies now COPY_TENSORs on the shim. It must print the reference's text (also for
          N = 2: the pairwise link's sum and the fallback's are the same f32 additions), send
          COPY_TENSORs, every one answered 1, no COMM_INIT answered anything but 0, and for N > 2 read
          fewer GET_TENSOR bytes than the reference (whose partial sums crossed the client).

          Also with --no-worker-links (N = 2): the same text, every copy through the shim.
  mixed   one endpoint over ours A and a stock 8.0 server: same text as the two as separate
          endpoints; the copies pass through the shim (a stock worker has no LINK_*).
  dies    a worker dies mid-generation while the copies go over the workers' own link (layer split,
          gemma, one endpoint over two fresh servers of ours, P -> Q): (1) every session process of
          the source P is killed (SIGKILL; P's front lives on), (2) the whole destination worker Q
          (its process group) is killed. Each time the client must fail (exit non-zero, never a
          text that looks complete) within DIES_BOUND s of the kill, never hang; the survivors'
          sessions of that client must end within DIES_BOUND s (none left waiting on the dead
          link), and the survivors and the shim must serve a fresh client (exit 0).

A summary table (mode, N, seconds, bytes per generated token) ends the output; informational, never
asserted. "client B/token" counts the client's bytes both ways from its first GRAPH_COMPUTE on (the
model upload excluded; the warm-up and prompt steps included) divided by -n. A llama-completion run
whose stderr lacks the perf summary is repeated (run_e2e.py's rule; counters reset per attempt).
Servers run with -t 1 and --comm-peer-ports as in proto8_e2e.py, clients with -t 1.

  python3 tests/e2e/endpoint_e2e.py --ours target/release/rpc-server --shim target/release/rpc-shim
        --stock-bin STOCK8 [--only layer,tensor] [-n N] [--keep]
  STOCK8: STOCK_PROTO=8 scripts/stock-llama.sh (the default when not given)
"""

import argparse
import collections
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
from e2e_common import (CACHE, CountingProxy, FrameCounter, Server, Servers, clean_env, free_port,  # noqa: E402
                        help_mentions, log, resolve_ours, run, script_output, tail)
from proto8_e2e import COMM_OK, COMM_PEERS, TENSOR_MODEL, TENSOR_TIMEOUT, resolve_stock8, tail_bytes  # noqa: E402
from run_e2e import (CLIENT_ATTEMPTS, EVAL_RE, GEMMA_PROMPT, SYNTH_PROMPT, Model, Results,  # noqa: E402
                     completion_cmd, show_diff)
from shim_e2e import resolve_shim  # noqa: E402
import synth_models  # noqa: E402

GROUPS = ("layer", "tensor", "mixed", "dies")
LAYER_NS = (2, 4)
TENSOR_NS = (2, 3, 4)
NAMES = "ABCD"  # our servers, in --rpc and --worker order
DIES_BOUND = 20.0  # s: a kill to the client's exit, and to the survivors' sessions' end
DIES_COPIES = 16  # copies the client sends before the kill (generation under way)
FLAG = "--one-endpoint"
NO_RANKS = b"multiple ranks on endpoint"  # the stock client's warning when it declines a communicator
# The client's devices as it loads a model (-lv 4): "RPC<device>[<endpoint>]" with its weights.
DEV_BUF_RE = re.compile(rb"load_tensors: (RPC\d+)\[([^\]]+)\] model buffer size")
# The devices the client uses, "RPC<n> (<endpoint>)": as themselves (layer split) or as the parts of
# its tensor split's Meta device.
DEVICE_RE = re.compile(rb"llama_prepare_model_devices: (?:using device|- device \d+:) (RPC\d+) \(([^)]+)\)")
# rpc-shim's own count when a one-endpoint client leaves (informational; its wording may change).
SHIM_COPIES_RE = re.compile(r"copies of this client connection .*?between_workers=(\d+) "
                            r"bytes_between_workers=(\d+) over_worker_links=(\d+) within_a_worker=(\d+)")

# Requests the server answers (rpc-proto's Command::has_response; the rest get no answer).
ANSWERED = {"ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "SET_TENSOR_HASH", "GET_TENSOR",
            "COPY_TENSOR", "GET_DEVICE_MEMORY", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GET_TENSOR_2D",
            "COMM_INIT"}
# Answers whose first payload byte is kept: COPY_TENSOR's result (1 = copied; 0 makes the client copy
# through itself) and COMM_INIT's (1 = joined the communicator).
KEPT = ("COPY_TENSOR", "COMM_INIT")
READS = ("GET_TENSOR", "GET_TENSOR_2D")  # answers that carry tensor data to the client


class _Tap:
    """A socket whose recv() hands what it returns to `feed` first (CountingProxy._pump's source)."""

    def __init__(self, sock, feed):
        self._sock, self._feed = sock, feed

    def recv(self, n):
        data = self._sock.recv(n)
        if data:
            self._feed(data)
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _Pending(dict):
    """FrameCounter's tally that also queues, in order, the requests that get an answer."""

    def __init__(self, on_request):
        super().__init__()
        self.on_request = on_request

    def setdefault(self, name, default):
        self.on_request(name)
        return super().setdefault(name, default)


class _Answers:
    """One connection: splits the server-to-client bytes into `| size u64 | payload |` answers and
    gives each to the oldest request that awaits one (a server answers in order). The request side
    is parsed as it is received, before it is forwarded, so a request is always queued before its
    answer arrives."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.pending = collections.deque()
        self.requests = FrameCounter(_Pending(self._request))
        self.head = b""
        self.left = 0
        self.keep = None  # the name of the answer whose first byte is due next

    def _request(self, name):
        if name == "GRAPH_COMPUTE":
            ReplyCountingProxy.computing.set()
        if name in ANSWERED:
            self.pending.append(name)

    def up(self, data):
        self.requests.feed(data)
        self.proxy._phase("up", len(data))

    def down(self, data):
        self.proxy._phase("down", len(data))
        i = 0
        while i < len(data):
            if self.left:
                if self.keep:
                    self.proxy._kept(self.keep, data[i])
                    self.keep = None
                n = min(self.left, len(data) - i)
                self.left -= n
                i += n
                continue
            piece = data[i:i + 8 - len(self.head)]
            self.head += piece
            i += len(piece)
            if len(self.head) == 8:
                size = int.from_bytes(self.head, "little")
                name = self.pending.popleft() if self.pending else "UNASKED"
                self.proxy._answer(name, size)
                self.head, self.left = b"", size
                self.keep = name if name in KEPT and size else None


class ReplyCountingProxy(CountingProxy):
    """CountingProxy that also counts, per request name, the answers and their bytes (`answers`:
    name -> [count, bytes], header included), keeps the first byte of each KEPT answer (`kept`:
    name -> list), and counts the bytes both ways after the first GRAPH_COMPUTE that any such proxy
    forwarded since `computing` was cleared (`after`: {"up": n, "down": n})."""

    computing = threading.Event()  # shared: a client's first GRAPH_COMPUTE, on any of its endpoints

    def __init__(self, target_port, port=0):
        self.answers, self.kept, self.after = {}, {}, {"up": 0, "down": 0}
        super().__init__(target_port, port=port)

    def reset(self):
        super().reset()
        with self.lock:
            self.answers.clear()
            self.kept.clear()
            self.after.update(up=0, down=0)

    def _pump(self, src, dst, attr, state):
        answers = state.setdefault("answers", _Answers(self))
        super()._pump(_Tap(src, answers.up if attr == "up" else answers.down), dst, attr, state)

    def _answer(self, name, size):
        with self.lock:
            c = self.answers.setdefault(name, [0, 0])
            c[0] += 1
            c[1] += 8 + size

    def _kept(self, name, byte):
        with self.lock:
            self.kept.setdefault(name, []).append(byte)

    def _phase(self, attr, n):
        if ReplyCountingProxy.computing.is_set():
            with self.lock:
                self.after[attr] += n


class Counts:
    """What the client sent and got through a set of proxies in one run."""

    def __init__(self, proxies, n_predict):
        self.n = n_predict
        self.requests, self.answers, self.kept = collections.Counter(), collections.Counter(), {}
        self.after = 0
        for p in proxies:
            with p.lock:
                for name, (count, _) in p.commands.items():
                    self.requests[name] += count
                for name, (_, size) in p.answers.items():
                    self.answers[name] += size
                for name, bytes_ in p.kept.items():
                    self.kept.setdefault(name, []).extend(bytes_)
                self.after += p.after["up"] + p.after["down"]

    @property
    def reads(self):
        """GET_TENSOR(_2D) answer bytes: tensor data that reached the client."""
        return sum(self.answers[c] for c in READS)

    def per_token(self, n_bytes):
        return n_bytes / self.n

    def brief(self):
        return "COPY_TENSOR %d, reads %.0f B/token, client %.0f B/token" % (
            self.requests["COPY_TENSOR"], self.per_token(self.reads), self.per_token(self.after))


class OneEndpointShim(Server):
    """rpc-shim --one-endpoint over `workers`, listening on 127.0.0.1:port."""

    def __init__(self, name, binary, port, workers, logdir, extra=()):
        super().__init__(name, binary, port, logdir, env={"RPC_LOG": "info"}, proto=8)
        self.workers = list(workers)
        self.shim_extra = list(extra)
        self.log_seen = 0  # the log's size when the last client attempt started

    def cmd(self):
        c = [self.binary, FLAG]
        for w in self.workers:
            c += ["--worker", w]
        return c + ["--listen", self.endpoint] + self.shim_extra


class Suite:
    def __init__(self, args, servers, workdir):
        self.args, self.servers, self.workdir = args, servers, workdir
        self.results = Results()
        self.summary = []  # (group, mode, N, secs, Counts or None, ok)
        self.srv, self.px, self.shims, self.shim_px = {}, {}, {}, {}
        self.has_flag = help_mentions(args.shim, FLAG)

    def start_servers(self, n):
        for name in NAMES[:n]:
            self.srv[name] = self.servers.add(Server("ours" + name, self.args.ours, free_port(), self.workdir,
                                                     threads=1, proto=8, extra=COMM_PEERS))
            # a port from free_port: a rank 0's comm port (its port + 1000) stays free
            self.px[name] = ReplyCountingProxy(self.srv[name].port, port=free_port())

    def shim(self, n):
        """The one-endpoint shim over our first n servers and the proxy in front of it (started on
        first use; shared by the groups)."""
        if n not in self.shims:
            s = OneEndpointShim("shim%d" % n, self.args.shim, free_port(),
                                [self.srv[x].endpoint for x in NAMES[:n]], self.workdir)
            self.shims[n] = self.servers.add(s)
            self.shim_px[n] = ReplyCountingProxy(s.port, port=free_port())
        return self.shim_px[n]

    def proxies(self):
        return list(self.px.values()) + list(self.shim_px.values())

    def restart(self, n, shim):
        """After a failed run: restart what it used (so the next run starts clean)."""
        for x in NAMES[:n]:
            log("  restarting ours%s" % x)
            self.srv[x].stop()
            self.srv[x].start()
        if shim and n in self.shims:
            log("  restarting shim%d" % n)
            self.shims[n].stop()
            self.shims[n].start()

    def complete(self, tag, model, proxies, extra=(), timeout=None):
        """llama-completion --rpc <proxies>; the proxies count it (reset per attempt). Returns
        (rc, stdout, stderr, secs, Counts)."""
        cmd = completion_cmd(self.args.stock_bin, model, self.args.n_predict, [p.endpoint for p in proxies])
        cmd += list(extra)
        base = os.path.join(self.workdir, re.sub(r"[^A-Za-z0-9_.-]+", "_", tag))
        for attempt in range(1, CLIENT_ATTEMPTS + 1):
            for p in self.proxies():
                p.reset()
            ReplyCountingProxy.computing.clear()
            for shim in self.shims.values():  # shim_copies reads what this attempt adds
                shim.log_seen = os.path.getsize(shim.log_path)
            rc, out, err, dt = run(cmd, timeout or self.args.timeout, base + ".out", base + ".err")
            if rc != 0 or EVAL_RE.search(err):
                break
            log("  %s: attempt %d lacks the perf summary (output truncated at exit); again" % (tag, attempt))
            time.sleep(0.5)
        time.sleep(0.2)  # the proxies' last answers
        return rc, out, err, dt, Counts(proxies, self.args.n_predict)

    def judge(self, group, model, mode, n, run_, ref, problems, note, shim=None):
        """Records one run: exit 0, the text of `ref` (stdout; None: this run is the reference) and
        `problems` found by the caller. Returns the run's stdout if it passed."""
        rc, out, err, dt, counts = run_
        problems = list(problems)
        if rc != 0:
            problems.insert(0, "exit %s" % rc)
        elif not EVAL_RE.search(err):
            problems.insert(0, "no perf summary in %d attempts (output truncated at exit)" % CLIENT_ATTEMPTS)
        if ref is not None and rc == 0 and out != ref:
            problems.append("output differs from %d endpoints" % n)
            print("\n===== %s %s vs %d endpoints\n%s" % (group, mode, n, show_diff(ref, out, "%d endpoints" % n,
                                                                                   mode)), flush=True)
        if problems:
            print("\n===== FAIL %s %s: %s\n--- client stderr tail:\n%s" % (group, mode, "; ".join(problems),
                                                                          tail_bytes(err, 25)), flush=True)
            if shim is not None:
                print("--- %s log tail:\n%s" % (shim.name, tail(shim.log_path, 30)), flush=True)
            for x in NAMES[:n]:
                print("--- ours%s log tail:\n%s" % (x, tail(self.srv[x].log_path, 10)), flush=True)
            self.restart(n, shim is not None)
        self.results.add(model.name, "%s: %s" % (group, mode), not problems, dt, "; ".join(problems) or note)
        self.summary.append((group, mode, n, dt, counts, not problems))
        return None if problems else out

    def start_shim(self, group, model, mode, n):
        """The proxy in front of the one-endpoint shim over n servers, or None after recording why
        there is none."""
        why = None
        if not self.has_flag:
            why = "%s has no %s" % (self.args.shim, FLAG)
        else:
            try:
                return self.shim(n)
            except RuntimeError as e:  # it did not come up
                why = "rpc-shim did not start"
                print("\n===== FAIL %s %s: %s" % (group, mode, e), flush=True)
        self.results.add(model.name, "%s: %s" % (group, mode), False, 0.0, why)
        self.summary.append((group, mode, n, 0.0, None, False))
        return None

    # --- layer split -------------------------------------------------------------------------------

    def layer(self, gemma):
        px1 = [self.px["A"]]
        run1 = self.complete("layer-1", gemma, px1)
        base = self.judge("layer", gemma, "1 endpoint (A)", 1, run1, None, self.devices(run1, px1, 1, True),
                          "reference for the reads: " + run1[4].brief())
        single = run1[4].reads if base is not None else None
        excess2 = None  # bytes per token the 2-endpoint reference reads more than 1 endpoint
        for n in LAYER_NS:
            mode = "%d endpoints" % n
            pxs = [self.px[x] for x in NAMES[:n]]
            sep = self.complete("layer-sep%d" % n, gemma, pxs)
            c = sep[4]
            problems = self.devices(sep, pxs, n, True)
            excess = c.per_token(c.reads - single) if single is not None and sep[0] == 0 else None
            if excess is not None and excess <= 0:
                problems.append("no hidden state visible in the reads: %.0f B/token, 1 endpoint %.0f"
                                % (c.per_token(c.reads), c.per_token(single)))
            ratio = ""
            if excess is not None and excess2:
                ratio = " = %.2f x the 2-endpoint excess" % (excess / excess2)
            ref = self.judge("layer", gemma, mode, n, sep, None, problems, "reference; %s; reads over 1 endpoint: "
                             "%s B/token%s" % (c.brief(), fmt(excess), ratio))
            if n == 2 and ref is not None:
                excess2 = excess
            mode = "one endpoint of %d" % n
            shim_px = self.start_shim("layer", gemma, mode, n)
            if shim_px is None:
                continue
            one = self.complete("layer-one%d" % n, gemma, [shim_px])
            c = one[4]
            problems = self.devices(one, [shim_px], n, True) + self.copies(one)
            if ref is None:
                problems.append("no reference (%d endpoints failed)" % n)
            # Half a hidden state per token (the 2-endpoint reference's excess is one per step).
            margin = excess2 / 2 if excess2 else None
            over = c.per_token(c.reads - single) if single is not None else None
            if over is None or margin is None:
                problems.append("no bound for the reads (the 1- or 2-endpoint reference failed)")
            elif one[0] == 0 and over > margin:
                problems.append("reads %.0f B/token more than 1 endpoint, over the margin of %.0f (half the "
                                "2-endpoint reference's excess): hidden states crossed the client" % (over, margin))
            self.judge("layer", gemma, mode, n, one, ref, problems, "= %d endpoints; %s; reads over 1 endpoint: "
                       "%s B/token (margin %s); %s" % (n, c.brief(), fmt(over), fmt(margin),
                                                      self.shim_copies(n, problems)),
                       shim=self.shims.get(n))
            if n == 2:
                self.no_links(gemma, ref)

    def no_links(self, gemma, ref):
        """rpc-shim --one-endpoint --no-worker-links over ours A and B: the reference's text, every copy
        through the shim (no LINK_* asked for)."""
        key = "no-links"
        shim = self.servers.add(OneEndpointShim("shim-no-links", self.args.shim, free_port(),
                                                [self.srv[x].endpoint for x in NAMES[:2]], self.workdir,
                                                extra=["--no-worker-links"]))
        self.shims[key] = shim
        self.shim_px[key] = ReplyCountingProxy(shim.port, port=free_port())
        mode = "one endpoint of 2, --no-worker-links"
        one = self.complete("layer-no-links", gemma, [self.shim_px[key]])
        problems = self.devices(one, [self.shim_px[key]], 2, True) + self.copies(one)
        if ref is None:
            problems.append("no reference (2 endpoints failed)")
        note = self.shim_copies(key, problems, linked_all=False)
        self.judge("layer", gemma, mode, 2, one, ref, problems, "= 2 endpoints; %s; %s" % (one[4].brief(), note),
                   shim=shim)

    def devices(self, run_, proxies, n, weights):
        """The client must have used n devices: device 0 of each proxy's endpoint, or with one proxy n
        devices of it; with `weights` (layer split) the weights must be on each of them."""
        rc, _, err, _, _ = run_
        if rc != 0:
            return []
        want = {p.endpoint for p in proxies}
        problems = []
        devs = [(m.group(1).decode(), m.group(2).decode()) for m in DEVICE_RE.finditer(err)]
        if len(devs) != n or {ep for _, ep in devs} != want:
            problems.append("the client's devices are %s, not %d of %s" % (devs, n, sorted(want)))
        if weights:
            bufs = {(m.group(1).decode(), m.group(2).decode()) for m in DEV_BUF_RE.finditer(err)}
            if len(bufs) != n or {ep for _, ep in bufs} != want:
                problems.append("weights on %s, not on %d devices of %s" % (sorted(bufs), n, sorted(want)))
        return problems

    def copies(self, run_):
        """The one-endpoint client's copies: at least one COPY_TENSOR, every one answered 1 (and no
        answer that no request asked for)."""
        c = run_[4]
        if run_[0] != 0:
            return []
        problems = []
        if c.requests["COPY_TENSOR"] == 0:
            problems.append("no COPY_TENSOR reached the shim")
        failed = sum(1 for b in c.kept.get("COPY_TENSOR", []) if b != 1)
        if failed:
            problems.append("%d COPY_TENSOR answered 0 (the client then copies through itself)" % failed)
        if c.answers["UNASKED"]:
            problems.append("%d bytes of answers to no request" % c.answers["UNASKED"])
        return problems

    def shim_copies(self, n, problems, linked_all=True):
        """What the shim's log says of the copies of the client connections of the last attempt;
        every copy between workers must have gone over the workers' own link (all ours), or, with
        `linked_all` false (a stock worker among them), none; else a problem is added."""
        shim = self.shims.get(n)
        deadline = time.monotonic() + 2.0
        while shim is not None:
            try:
                with open(shim.log_path, "rb") as f:
                    f.seek(shim.log_seen)
                    found = SHIM_COPIES_RE.findall(f.read().decode("utf-8", "replace"))
            except OSError:
                found = []
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if shim is None or not found:
            problems.append("the shim logged no copy count")
            return "shim log: no copy count"
        between, nbytes, linked, within = (sum(int(f[i]) for f in found) for i in range(4))
        if not linked_all:
            if between == 0 or linked != 0:
                problems.append("%d copies between workers, %d over a worker link: expected copies, all through "
                                "the shim (a stock worker has no LINK_*)" % (between, linked))
        elif linked != between:
            problems.append("%d of %d copies between workers passed through the shim, not over the workers' "
                            "own link (LINK_*)" % (between - linked, between))
        return "shim log: %d copies between workers (%d B), %d of them over the workers' own link, %d within one" % (
            between, nbytes, linked, within)

    # --- tensor split ------------------------------------------------------------------------------

    def tensor(self, synth):
        for n in TENSOR_NS:
            mode = "%d endpoints" % n
            pxs = [self.px[x] for x in NAMES[:n]]
            sep = self.complete("tensor-sep%d" % n, synth, pxs, extra=["-sm", "tensor"], timeout=TENSOR_TIMEOUT)
            err, c = sep[2], sep[4]
            comm = COMM_OK in err
            problems = self.devices(sep, pxs, n, False)
            if n == 2 and sep[0] == 0 and not comm:
                problems.append("stderr lacks %r (the servers' pairwise link was not used)" % COMM_OK.decode())
            ref = self.judge("tensor", synth, mode, n, sep, None, problems, "reference; communicator: %s; "
                             "COMM_INIT %d, COMM_ALLREDUCE %d; %s" % (
                                 "yes" if comm else "no (reduced through the client)", c.requests["COMM_INIT"],
                                 c.requests["COMM_ALLREDUCE"], c.brief()))
            mode = "one endpoint of %d" % n
            shim_px = self.start_shim("tensor", synth, mode, n)
            if shim_px is None:
                continue
            one = self.complete("tensor-one%d" % n, synth, [shim_px], extra=["-sm", "tensor"], timeout=TENSOR_TIMEOUT)
            c1 = one[4]
            problems = self.devices(one, [shim_px], n, False) + self.copies(one)
            if ref is None:
                problems.append("no reference (%d endpoints failed)" % n)
            joined = sum(1 for b in c1.kept.get("COMM_INIT", []) if b != 0)
            if joined:
                problems.append("%d COMM_INIT answered non-zero (a communicator over one endpoint)" % joined)
            if n > 2 and ref is not None and one[0] == 0 and c1.reads >= c.reads:
                problems.append("reads %d B, not fewer than the reference's %d B (whose partial sums crossed the "
                                "client)" % (c1.reads, c.reads))
            if c1.requests["COMM_INIT"]:
                comm_note = "COMM_INIT %d, answered %s" % (c1.requests["COMM_INIT"], c1.kept.get("COMM_INIT", []))
            else:
                comm_note = "no COMM_INIT%s" % (" (client: multiple ranks on one endpoint)" if NO_RANKS in one[2]
                                                else "")
            self.judge("tensor", synth, mode, n, one, ref, problems, "= %d endpoints; %s; communicator: %s; %s; "
                       "reference reads %.0f B/token; %s" % (
                           n, comm_note, "yes" if COMM_OK in one[2] else "no", c1.brief(), c.per_token(c.reads),
                           self.shim_copies(n, problems)), shim=self.shims.get(n))

    # --- ours and stock behind one endpoint ------------------------------------------------------------

    def mixed(self, gemma):
        """One endpoint over ours A and a stock 8.0 server (layer split): the stock server closes the
        connection on the shim's LINK_PROBE, the shim reopens it and copies between the two pass
        through the shim; the text equals the same two servers as two endpoints."""
        stock = self.servers.add(Server("stock8", os.path.join(self.args.stock_bin, "ggml-rpc-server"), free_port(),
                                        self.workdir, threads=1, proto=8))
        self.px["S"] = ReplyCountingProxy(stock.port, port=free_port())
        pxs = [self.px["A"], self.px["S"]]
        sep = self.complete("mixed-sep", gemma, pxs)
        ref = self.judge("mixed", gemma, "ours + stock: 2 endpoints", 2, sep, None, self.devices(sep, pxs, 2, True),
                         "reference; " + sep[4].brief())
        key = "mixed"
        shim = self.servers.add(OneEndpointShim("shim-mixed", self.args.shim, free_port(),
                                                [self.srv["A"].endpoint, stock.endpoint], self.workdir))
        self.shims[key] = shim
        self.shim_px[key] = ReplyCountingProxy(shim.port, port=free_port())
        one = self.complete("mixed-one", gemma, [self.shim_px[key]])
        problems = self.devices(one, [self.shim_px[key]], 2, True) + self.copies(one)
        note = self.shim_copies(key, problems, linked_all=False)
        self.judge("mixed", gemma, "ours + stock: one endpoint", 2, one, ref, problems,
                   "= 2 endpoints; %s; %s" % (one[4].brief(), note), shim=shim)

    # --- a worker that dies mid-generation --------------------------------------------------------

    def dies(self, gemma):
        for case in ("sessions of the source", "destination worker"):
            self.dies_once(gemma, case)

    def dies_once(self, gemma, case):
        tag = "dies-" + case.split()[0]
        p, q = (self.servers.add(Server("ours%s-%s" % (x, tag), self.args.ours, free_port(), self.workdir, threads=1,
                                        proto=8, extra=COMM_PEERS)) for x in "PQ")
        shim = self.servers.add(OneEndpointShim("shim-" + tag, self.args.shim, free_port(),
                                                [p.endpoint, q.endpoint], self.workdir))
        px = ReplyCountingProxy(shim.port, port=free_port())
        problems, notes = [], []
        cmd = completion_cmd(self.args.stock_bin, gemma, 400, [px.endpoint])
        base = os.path.join(self.workdir, tag)
        t0 = time.monotonic()
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            client = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                      env=clean_env())
            try:
                copies = lambda: px.commands.get("COPY_TENSOR", [0])[0]  # noqa: E731
                while copies() < DIES_COPIES and client.poll() is None and time.monotonic() - t0 < self.args.timeout:
                    time.sleep(0.05)
                if client.poll() is not None or copies() < DIES_COPIES:
                    problems.append("the client %s before %d copies (%d)" % (
                        "ended (exit %s)" % client.returncode if client.poll() is not None else "timed out",
                        DIES_COPIES, copies()))
                else:
                    victim = p if case.startswith("sessions") else q
                    killed = children(victim.proc.pid) if victim is p else [victim.proc.pid]
                    notes.append("killed %s after %d copies: %s" % (case, copies(), killed))
                    if not killed:
                        problems.append("%s has no session process to kill" % victim.name)
                    t_kill = time.monotonic()
                    if victim is p:
                        for pid in killed:
                            os.kill(pid, signal.SIGKILL)
                    else:
                        os.killpg(victim.proc.pid, signal.SIGKILL)
                    try:
                        rc = client.wait(timeout=DIES_BOUND)
                        notes.append("client exit %s %.1f s after the kill" % (rc, time.monotonic() - t_kill))
                        if rc == 0:
                            problems.append("the client exited 0 after a worker died mid-generation")
                    except subprocess.TimeoutExpired:
                        problems.append("the client still runs %.0f s after the kill (a hang)" % DIES_BOUND)
                    survivors = [s for s in (p, q) if s.alive()]
                    for s in survivors:  # each survivor's sessions of that client end: none waits on a dead link
                        while children(s.proc.pid) and time.monotonic() - t_kill < 2 * DIES_BOUND:
                            time.sleep(0.1)
                        left = children(s.proc.pid)
                        if left:
                            problems.append("%s still has session processes %s %.0f s after the kill" % (
                                s.name, left, time.monotonic() - t_kill))
                        else:
                            notes.append("%s's sessions ended %.1f s after the kill" % (s.name, time.monotonic() - t_kill))
                    if not shim.alive():
                        problems.append("the shim died")
                    if victim is p and not p.alive():
                        problems.append("%s's front died with its sessions" % p.name)
                    if not problems:  # a fresh client: the survivors and the shim serve on
                        eps = [px.endpoint] if victim is p else [s.endpoint for s in survivors]
                        fresh = run(completion_cmd(self.args.stock_bin, gemma, 4, eps), self.args.timeout,
                                    base + "-fresh.out", base + "-fresh.err")
                        if fresh[0] != 0:
                            problems.append("a fresh client over %s failed (exit %s)" % (",".join(eps), fresh[0]))
                        else:
                            notes.append("fresh client over %s: exit 0" % ("the shim" if victim is p else p.name))
            finally:
                if client.poll() is None:
                    os.killpg(client.pid, signal.SIGKILL)
                    client.wait()
        px.close()
        if problems:
            print("\n===== FAIL dies (%s): %s\n--- client stderr tail:\n%s\n--- shim log tail:\n%s"
                  % (case, "; ".join(problems), tail(base + ".err", 15), tail(shim.log_path, 20)), flush=True)
            for s in (p, q):
                print("--- %s log tail:\n%s" % (s.name, tail(s.log_path, 15)), flush=True)
        for s in (shim, p, q):
            s.stop()
        self.results.add(gemma.name, "dies: " + case, not problems, time.monotonic() - t0,
                         "; ".join(problems + notes))

    # --- summary -----------------------------------------------------------------------------------

    def table(self):
        out = ["| group | mode | N | result | secs | COPY_TENSOR | GET_TENSOR B/token | client B/token |",
               "|---|---|---|---|---|---|---|---|"]
        for group, mode, n, secs, c, ok in self.summary:
            if c is None:
                cells = ["", "", ""]
            else:
                cells = ["%d" % c.requests["COPY_TENSOR"], "%.0f" % c.per_token(c.reads), "%.0f" % c.per_token(c.after)]
            out.append("| %s | %s | %d | %s | %.1f | %s |" % (group, mode, n, "ok" if ok else "**FAIL**", secs,
                                                             " | ".join(cells)))
        return "\n".join(out)


def fmt(x):
    return "?" if x is None else "%.0f" % x


def children(pid):
    """The live child processes of `pid` (a server's session processes), from /proc."""
    kids = []
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return []
    for t in tasks:  # a child belongs to the thread that started it
        try:
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                kids += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return sorted(k for k in set(kids) if os.path.exists("/proc/%d" % k))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock-bin", help="stock 8.0 tools: ggml-rpc-server, llama-completion, llama-server "
                    "(default: $STOCK_BIN8, else STOCK_PROTO=8 scripts/stock-llama.sh)")
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--shim", help="rpc-shim binary (default: target/release/rpc-shim)")
    ap.add_argument("--model", help="gemma-3-270m GGUF (default: scripts/test-model.sh)")
    ap.add_argument("--tensor-model", help="GGUF for tensor split (default: %s written by synth_models.py into "
                    "$RPC_CACHE_DIR/models/synth)" % TENSOR_MODEL)
    ap.add_argument("--only", help="comma-separated groups: " + ",".join(GROUPS))
    ap.add_argument("-n", "--n-predict", type=int, default=8, help="tokens to generate (default 8)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per client run (s; tensor runs: %.0f)"
                    % TENSOR_TIMEOUT)
    ap.add_argument("--workdir", help="logs (default: a fresh temp dir, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    args = ap.parse_args()

    groups = [g.strip() for g in args.only.split(",")] if args.only else list(GROUPS)
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        ap.error("unknown group(s) %s (have: %s)" % (", ".join(bad), ", ".join(GROUPS)))
    args.stock_bin = resolve_stock8(args.stock_bin)
    args.ours = resolve_ours(args.ours)
    args.shim = resolve_shim(args.shim)
    # A client that aborts (a server or the shim that closed) would first attach gdb for a backtrace.
    os.environ["GGML_NO_BACKTRACE"] = "1"
    models = {}
    if "layer" in groups or "mixed" in groups or "dies" in groups:
        models["layer"] = Model("gemma-3-270m", args.model or script_output("test-model.sh", timeout=900),
                                GEMMA_PROMPT)
        models["mixed"] = models["dies"] = models["layer"]
    if "tensor" in groups:
        tpath = args.tensor_model
        if not tpath:
            d = os.path.join(CACHE, "models", "synth")
            os.makedirs(d, exist_ok=True)
            tpath = os.path.join(d, TENSOR_MODEL + ".gguf")
            synth_models.write_model(tpath, TENSOR_MODEL, synth_models.specs()[TENSOR_MODEL])
        models["tensor"] = Model(os.path.basename(tpath)[:-5], tpath, SYNTH_PROMPT)
    workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="rpc-endpoint-e2e-"))
    os.makedirs(workdir, exist_ok=True)
    n_max = max({"layer": LAYER_NS, "tensor": TENSOR_NS, "mixed": (1,), "dies": (0,)}[g][-1] for g in groups)
    log("workdir: %s\nstock 8.0: %s\nours: %s\nshim: %s (%s: %s)\ngroups: %s; -n %d"
        % (workdir, args.stock_bin, args.ours, args.shim, FLAG, help_mentions(args.shim, FLAG), ", ".join(groups),
           args.n_predict))

    t0 = time.monotonic()
    with Servers() as servers:
        suite = Suite(args, servers, workdir)
        suite.start_servers(n_max)
        for g in GROUPS:
            if g in groups:
                log("== %s" % g)
                getattr(suite, g)(models[g])
        dead = [s.name for s in list(suite.srv.values()) + list(suite.shims.values()) if not s.alive()]
        if dead:
            suite.results.add("-", "alive at the end", False, 0.0, "died: " + ", ".join(dead))
        for p in suite.proxies():
            p.close()

    print("\n" + suite.results.table())
    print("\n" + suite.table())
    log("%d checks, %d failed, %.0f s" % (len(suite.results.rows), suite.results.failures, time.monotonic() - t0))
    if suite.results.failures:
        log("logs kept in %s" % workdir)
        return 1
    if not (args.workdir or args.keep):
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); processes stopped" % e, file=sys.stderr)
        sys.exit(130)
