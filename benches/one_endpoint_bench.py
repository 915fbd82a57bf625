#!/usr/bin/env python3
"""Generation speed through ONE endpoint (`rpc-shim --one-endpoint`) vs N separate endpoints.

For N = 1..4 workers and both split modes, the stock 8.0 `llama-bench` (through `rpc-bench e2e`:
counting relays, targets alternated step by step, rounds) against three targets per N:

  stockN  N stock 8.0 ggml-rpc-servers as N endpoints   (llama-bench --rpc S1,..,SN)
  oursN   N of our rpc-servers as N endpoints           (llama-bench --rpc O1,..,ON)
  oneN    rpc-shim --one-endpoint over the same N of ours (llama-bench --rpc SHIM)

Layer split on gemma-3-270m Q4_K_M, tensor split (-sm tensor) on synth-llama-f16 (the stock
client's tensor split asserts on gemma). Every server runs with -t 1, ours with --comm-peer-ports
1-64535 as the end-to-end suites do; llama-bench with -t 1. In tensor mode with N = 2 the
separate-endpoint targets get the servers' own pairwise link (COMM_INIT): the stock pair as
through any relay, ours2 through `rpc-bench e2e --own-comm-port` (its rank 0 listens only on its
own port + 1000). One endpoint never gets a communicator (the stock client declines two ranks on
one endpoint), nor do N > 2 endpoints (the stock communicator is pairwise): the client reduces by
copies, which one endpoint turns into COPY_TENSORs carried worker to worker by the shim.

The order within each step is stock1, ours1, one1, stock2, ... so the three targets of one N run
back to back. Writes a markdown report (tables with ratios to stockN and oursN, client bytes and
round trips per generated token as the relay counted them, the command, the commit, the load
average before and after each split), a CSV of the table, rpc-bench's own reports and a PNG per
split (rpc-bench's chart of ms per token).

  python3 benches/one_endpoint_bench.py [--splits layer,tensor] [--ns 1,2,3,4] [-p 32 -n 32 -r 3]
      [--tensor-pnr 128,128,5] [--rounds 2] [--tensor-rounds 4] [--direct tensor]
      [--out docs/bench-one-endpoint.md] [--link tb5-tcp]

With --link PROFILE (an `rpc-bench relay` profile: tb5-tcp, 2.5gbe, 10gbe, custom:RTT_US:GBIT_S)
every worker is behind an emulated link, as on a cluster where the client (and with it the shim)
is one machine and every worker another: per server, one `rpc-bench relay --link PROFILE
--comm-link` process listens on a loopback address of its own (127.0.0.3, 127.0.0.4, ...) at the
server's port and forwards to the server on 127.0.0.1, and at that port + 1000 carries the
servers' own link (8.0's COMM_INIT, our LINK_OPEN) over the same emulated link to the server's
port + 1000 (for stock servers, which listen on every interface at the port they are told, the
relay moves rank 0's COMM_INIT to a spare port: --comm-rank0-port). stockN and oursN name the
relays (`--rpc 127.0.0.3:P1,127.0.0.4:P2,..`), the shims run on loopback for the client with
`-w` naming the same relays, so the client <-> shim hop stays loopback and every shim <-> worker
and worker <-> worker byte crosses one emulated link. In tensor mode with N = 2 both stock2 and
ours2 get --own-comm-port (their pairwise link then crosses the emulated link as well). The
generated tables replace the block between `<!-- emulated:PROFILE begin -->` and
`<!-- emulated:PROFILE end -->` in --out (appended at its end when missing); the rest of the file
is left alone. The relays' counters (bytes through each, its link's bytes) are in the block too.

Needs: cargo build --release -p rpc-server -p rpc-shim -p rpc-bench; the stock 8.0 tools with
llama-bench: STOCK_PROTO=8 STOCK_TARGETS="ggml-rpc-server llama-completion llama-bench"
scripts/stock-llama.sh (run when --stock-bin and $STOCK_BIN8 are not given; cached).
"""

import argparse
import csv
import datetime
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from e2e_common import (CACHE, REPO, Server, Servers, free_port, log, resolve_ours, script_output,  # noqa: E402
                        tail)

SPLITS = ("layer", "tensor")
COMM_PEERS = ["--comm-peer-ports", "1-64535"]  # as tests/e2e/proto8_e2e.py
PAIR_HOST = "127.0.0.2"  # rpc-bench e2e --own-comm-port: rank 0's relay and link forwarder
RELAY_HOST = "127.0.0.%d"  # --link: server k's emulating relay on 127.0.0.(3 + k)
KINDS = ["stock", "ours", "one"]  # with --no-links-too also "nolinks"
KIND_NAME = {"stock": "stock x%d", "ours": "ours x%d", "one": "one endpoint x%d",
             "nolinks": "one endpoint x%d, --no-worker-links"}


class OneEndpointShim(Server):
    """rpc-shim --one-endpoint over `workers` on 127.0.0.1:port (TCP to the workers)."""

    def __init__(self, name, binary, port, workers, logdir, extra=()):
        super().__init__(name, binary, port, logdir, env={"RPC_LOG": "info"}, proto=8)
        self.workers = list(workers)
        self.shim_extra = list(extra)

    def cmd(self):
        c = [self.binary, "--one-endpoint"]
        for w in self.workers:
            c += ["--worker", w]
        return c + ["--listen", self.endpoint, "--transport", "tcp"] + self.shim_extra


class EmulatedRelay(Server):
    """`rpc-bench relay` on `host`:`port` in front of `upstream` over `link`, carrying the servers'
    link at port + 1000 (--comm-link; with `comm_rank0_port` rank 0's COMM_INIT moved there)."""

    def __init__(self, name, binary, host, port, upstream, link, logdir, comm_rank0_port=None):
        super().__init__(name, binary, port, logdir, host=host, proto=8)
        self.upstream, self.link, self.comm_rank0_port = upstream, link, comm_rank0_port
        self.stats = os.path.join(logdir, "relay-%s.json" % name)

    def cmd(self):
        c = [self.binary, "relay", "--listen", self.endpoint, "--to", self.upstream, "--link", self.link,
             "--comm-link", "--stats", self.stats, "--stats-every", "200"]
        if self.comm_rank0_port:
            c += ["--comm-rank0-port", str(self.comm_rank0_port)]
        return c

    def counters(self):
        try:
            with open(self.stats) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


def bindable(host, port):
    if not 0 < port < 65536:
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def pair_port(hosts=(PAIR_HOST,)):
    """A free port P for one of our servers whose relay may take PAIR_HOST:P and whose link
    forwarder PAIR_HOST:P+1000 (free_port already checks 127.0.0.1:P+1000); with --link also
    its emulating relay's host (`hosts`)."""
    for _ in range(100):
        p = free_port()
        if all(bindable(h, p) and bindable(h, p + 1000) for h in hosts):
            return p
    raise RuntimeError("no port free on 127.0.0.1 and %s" % ", ".join(hosts))


def spare_port():
    """A port free on every interface (a stock rank 0 listens on 0.0.0.0 at it)."""
    for _ in range(100):
        p = free_port()
        if bindable("0.0.0.0", p):
            return p
    raise RuntimeError("no port free on 0.0.0.0")


def counter_delta(relays, before):
    """Per relay: bytes through it (both ways), its round trips, and its servers'-link bytes since
    `before` (relay name -> counters)."""
    out = []
    for r in relays:
        a, b = before.get(r.name, {}), r.counters()
        d = {k: b.get(k, 0) - a.get(k, 0) for k in ("c2s_bytes", "s2c_bytes", "round_trips", "connections",
                                                     "comm_c2s_bytes", "comm_s2c_bytes")}
        out.append((r, d))
    return out


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def wait_for_load(limit, max_wait):
    """Waits (up to max_wait s) until the 1-minute load average is below `limit`; returns the
    load average when it stopped waiting."""
    t0 = time.monotonic()
    while True:
        la = loadavg()
        if float(la.split()[0]) < limit or time.monotonic() - t0 >= max_wait:
            return la
        log("load average %s (>= %.1f): waiting (%.0f s of %.0f)" % (la, limit, time.monotonic() - t0, max_wait))
        time.sleep(15)


class ForeignCpu:
    """Samples /proc every `period` s and adds up the CPU time (user + system) of every process
    that is not this one or a descendant of it: how much of the machine other work took while the
    benchmark ran (kernel threads included, processes born and gone between two samples not)."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, period=1.0):
        self.period, self.seconds, self.busiest = period, 0.0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _procs():
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    st = f.read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            f = st[st.rindex(")") + 2:].split()
            out[int(d)] = (int(f[1]), name, int(f[11]) + int(f[12]), f[19])  # ppid, comm, utime+stime, start
        return out

    def _run(self):
        me, prev = os.getpid(), {}
        while not self._stop.wait(self.period):
            procs = self._procs()
            ours = {me}
            changed = True
            while changed:
                changed = False
                for pid, (ppid, _, _, _) in procs.items():
                    if pid not in ours and ppid in ours:
                        ours.add(pid)
                        changed = True
            cur = {}
            for pid, (_, name, ticks, start) in procs.items():
                if pid in ours:
                    continue
                cur[(pid, start)] = ticks
                # a process born since the last sample counts from its first sample on
                d = (ticks - prev.get((pid, start), ticks)) / self.TICK
                if d > 0:
                    self.seconds += d
                    self.busiest[name] = self.busiest.get(name, 0.0) + d
            prev = cur

    def __enter__(self):
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.wall = time.monotonic() - self._t0
        return False

    def summary(self):
        top = sorted(self.busiest.items(), key=lambda kv: -kv[1])[:4]
        share = self.seconds / (self.wall * (os.cpu_count() or 1)) if self.wall else 0.0
        return "%.0f CPU-s of other processes in %.0f s (%.0f%% of %d cores)%s" % (
            self.seconds, self.wall, 100 * share, os.cpu_count() or 1,
            ": " + ", ".join("%s %.0f s" % kv for kv in top) if top else "")


def resolve_stock8(arg):
    d = arg or os.environ.get("STOCK_BIN8")
    if not d:
        env = dict(os.environ, STOCK_PROTO="8", STOCK_TARGETS="ggml-rpc-server llama-completion llama-bench")
        r = subprocess.run([os.path.join(REPO, "scripts", "stock-llama.sh")], env=env, stdout=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, text=True, check=True, timeout=3600)
        d = r.stdout.strip().splitlines()[-1]
    d = os.path.abspath(d)
    for b in ("ggml-rpc-server", "llama-bench"):
        if not os.access(os.path.join(d, b), os.X_OK):
            raise SystemExit("%s lacks %s (STOCK_PROTO=8 STOCK_TARGETS=\"ggml-rpc-server llama-bench\" "
                             "scripts/stock-llama.sh)" % (d, b))
    return d


def tps(cell):
    """'12.34 ± 0.56' -> (12.34, 0.56)."""
    m = re.match(r"\s*([0-9.]+)\s*±\s*([0-9.]+)", cell or "")
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


def read_rows(path):
    """rpc-bench e2e's CSV -> {(server, link, "pp"|"tg"): row dict}."""
    out = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out[(r["server"], r["link"], r["test"][:2])] = r
    return out


def section(md, title):
    """The markdown table that follows the line starting with `title` in rpc-bench's report."""
    lines = md.splitlines()
    for i, l in enumerate(lines):
        if l.startswith(title):
            table = []
            for x in lines[i + 1:]:
                if x.startswith("|"):
                    table.append(x)
                elif table:
                    break
            return "\n".join(table)
    return ""


def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "-"


def splice(path, link, block):
    """`path`'s text with the block between `<!-- emulated:LINK begin -->` and its end marker
    replaced by `block` (appended at the end when there is none)."""
    begin, end = "<!-- emulated:%s begin -->" % link, "<!-- emulated:%s end -->" % link
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    new = "%s\n%s%s" % (begin, block, end)
    i, j = old.find(begin), old.find(end)
    if i >= 0 and j > i:
        return old[:i] + new + old[j + len(end):]
    return old.rstrip("\n") + "\n\n" + new + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock-bin", help="stock 8.0 tools with llama-bench (default: $STOCK_BIN8, else "
                    "scripts/stock-llama.sh as above)")
    ap.add_argument("--ours", help="our server (default: target/release/rpc-server)")
    ap.add_argument("--shim", default=os.path.join(REPO, "target", "release", "rpc-shim"))
    ap.add_argument("--rpc-bench", default=os.path.join(REPO, "target", "release", "rpc-bench"))
    ap.add_argument("--model", help="layer split's model (default: gemma-3-270m from scripts/test-model.sh)")
    ap.add_argument("--tensor-model", help="tensor split's model (default: synth-llama-f16, written by "
                    "tests/e2e/synth_models.py into $RPC_CACHE_DIR/models/synth when missing)")
    ap.add_argument("--splits", default="layer,tensor")
    ap.add_argument("--ns", default="1,2,3,4", help="worker counts (at most 4)")
    ap.add_argument("-p", type=int, default=32, help="layer split: llama-bench -p")
    ap.add_argument("-n", type=int, default=32, help="layer split: llama-bench -n")
    ap.add_argument("-r", type=int, default=3, help="layer split: llama-bench -r")
    ap.add_argument("--tensor-pnr", help="tensor split: -p,-n,-r (synth-llama-f16 makes a token in about a "
                    "millisecond: more tokens, less noise; default 128,128,5, with --link 64,64,3)")
    ap.add_argument("--rounds", type=int, default=2, help="layer split: rpc-bench e2e --rounds")
    ap.add_argument("--tensor-rounds", type=int, help="tensor split: rpc-bench e2e --rounds (default 4, with "
                    "--link 3)")
    ap.add_argument("--link", default="none", help="emulate this link between the client machine (client and "
                    "shim) and every worker, and between the workers (rpc-bench relay; see above): tb5-tcp, "
                    "2.5gbe, 10gbe, custom:RTT_US:GBIT_S; none (default): everything on plain loopback")
    ap.add_argument("--direct", help="splits that also run straight to the servers or the shim "
                    "each round (no relay; rpc-bench e2e --direct): comma-separated, or 'none' (default: tensor, "
                    "whose tokens take about a millisecond, so that the relays' own hops weigh; with --link: none)")
    ap.add_argument("--no-links-too", action="store_true", help="one more target per N: the one endpoint "
                    "with --no-worker-links (every copy through the shim), to tell what the workers' own link "
                    "saves from what keeping the client's round trips local saves")
    ap.add_argument("--note", default="", help="text for the report's header (e.g. how the binaries were built)")
    ap.add_argument("--max-load", type=float, default=1.5, help="wait before each split until the 1-minute "
                    "load average is below this")
    ap.add_argument("--max-wait", type=float, default=300, help="... for at most this many seconds")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "bench-one-endpoint.md"))
    ap.add_argument("--workdir", help="logs, rpc-bench's reports and charts (default: target/one-endpoint-bench, "
                    "with --link target/one-endpoint-bench-LINK)")
    args = ap.parse_args()
    emulated = args.link not in ("none", "native", "loopback")
    if args.tensor_pnr is None:
        args.tensor_pnr = "64,64,3" if emulated else "128,128,5"
    if args.tensor_rounds is None:
        args.tensor_rounds = 3 if emulated else 4
    if args.direct is None:
        args.direct = "none" if emulated else "tensor"
    if args.workdir is None:
        args.workdir = os.path.join(REPO, "target", "one-endpoint-bench" + ("-" + args.link.replace(":", "_")
                                                                            if emulated else ""))

    splits = [s for s in args.splits.split(",") if s]
    if any(s not in SPLITS for s in splits):
        ap.error("--splits: layer, tensor")
    ns = [int(x) for x in args.ns.split(",")]
    if not ns or min(ns) < 1 or max(ns) > 4:
        ap.error("--ns: 1..4")
    tp, tn, tr = (int(x) for x in args.tensor_pnr.split(","))
    pnr = {"layer": (args.p, args.n, args.r), "tensor": (tp, tn, tr)}
    rounds = {"layer": args.rounds, "tensor": args.tensor_rounds}
    direct = {s for s in args.direct.split(",") if s and s != "none"}
    if direct - set(SPLITS):
        ap.error("--direct: layer, tensor or none")
    stock = resolve_stock8(args.stock_bin)
    ours = resolve_ours(args.ours)
    for b in (args.shim, args.rpc_bench):
        if not os.access(b, os.X_OK):
            raise SystemExit("%s missing: cargo build --release -p rpc-server -p rpc-shim -p rpc-bench" % b)
    models = {}
    if "layer" in splits:
        models["layer"] = args.model or script_output("test-model.sh", timeout=900)
    if "tensor" in splits:
        models["tensor"] = args.tensor_model
        if not models["tensor"]:
            d = os.path.join(CACHE, "models", "synth")
            models["tensor"] = os.path.join(d, "synth-llama-f16.gguf")
            if not os.path.isfile(models["tensor"]):
                import synth_models
                os.makedirs(d, exist_ok=True)
                synth_models.write_model(models["tensor"], "synth-llama-f16", synth_models.specs()["synth-llama-f16"])
    os.makedirs(args.workdir, exist_ok=True)
    stem = os.path.splitext(os.path.abspath(args.out))[0]
    if emulated:  # the report is one block of --out; its files stay in the workdir
        stem = os.path.join(os.path.abspath(args.workdir), "bench-one-endpoint-" + args.link.replace(":", "_"))

    def png_path(split):
        return "%s-%s.png" % (stem, split)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    t_start = time.monotonic()
    results = {}  # split -> (rows, md, load before, load after, command, seconds)
    nmax = max(ns)
    with Servers() as servers:
        srv = {"stock": [], "ours": []}
        # where the client (and the shim) reach each server: the server, or its emulating relay
        ep = {"stock": [], "ours": []}
        relays = []
        for i in range(nmax):
            hosts = {kind: RELAY_HOST % (3 + 2 * i + j) for j, kind in enumerate(("stock", "ours"))}

            def near(kind):
                return (PAIR_HOST, hosts[kind]) if emulated else (PAIR_HOST,)
            srv["stock"].append(servers.add(Server("stock%d" % (i + 1), os.path.join(stock, "ggml-rpc-server"),
                                                   pair_port(near("stock")) if emulated else free_port(),
                                                   args.workdir, threads=1, proto=8)))
            srv["ours"].append(servers.add(Server("ours%d" % (i + 1), ours, pair_port(near("ours")), args.workdir,
                                                  threads=1, proto=8, extra=COMM_PEERS)))
            for kind in ("stock", "ours"):
                s = srv[kind][-1]
                if not emulated:
                    ep[kind].append(s.endpoint)
                    continue
                r = servers.add(EmulatedRelay("link-" + s.name, args.rpc_bench, hosts[kind], s.port, s.endpoint,
                                              args.link, args.workdir,
                                              comm_rank0_port=spare_port() if kind == "stock" else None))
                relays.append(r)
                ep[kind].append(r.endpoint)
        shims = {n: servers.add(OneEndpointShim("one%d" % n, args.shim, free_port(), ep["ours"][:n], args.workdir))
                 for n in ns}
        if args.no_links_too:
            KINDS.append("nolinks")
            nolinks = {n: servers.add(OneEndpointShim("nolinks%d" % n, args.shim, free_port(), ep["ours"][:n],
                                                      args.workdir, extra=["--no-worker-links"])) for n in ns}
        log("servers: " + ", ".join("%s %s" % (s.name, s.endpoint) for s in servers.items))
        for split in splits:
            p, n, r = pnr[split]
            cmd = [args.rpc_bench, "e2e", "--proto", "8", "--bin", stock, "--model", models[split],
                   "--split-mode", split, "-p", str(p), "-n", str(n), "-r", str(r), "-t", "1",
                   "--rounds", str(rounds[split]), "--links", "none", "--no-progress",
                   "--logdir", os.path.join(args.workdir, "logs-" + split),
                   "--csv", os.path.join(args.workdir, split + ".csv"),
                   "--md", os.path.join(args.workdir, split + ".md"),
                   "--png", png_path(split)]
            if split in direct:
                cmd.append("--direct")
            for k in ns:
                cmd += ["--server", "stock%d=%s" % (k, ",".join(ep["stock"][:k]))]
                cmd += ["--server", "ours%d=%s" % (k, ",".join(ep["ours"][:k]))]
                cmd += ["--server", "one%d=%s" % (k, shims[k].endpoint)]
                if args.no_links_too:
                    cmd += ["--server", "nolinks%d=%s" % (k, nolinks[k].endpoint)]
            if split == "tensor" and 2 in ns:
                cmd += ["--own-comm-port", "ours2"]
                if emulated:  # the stock rank 0's COMM_INIT is moved off the forwarder's port by its relay
                    cmd += ["--own-comm-port", "stock2"]
            before = wait_for_load(args.max_load, args.max_wait)
            counted = {r.name: r.counters() for r in relays}
            log("== %s (load %s): %s" % (split, before, shlex.join(cmd)))
            t0 = time.monotonic()
            with ForeignCpu() as foreign:
                rc = subprocess.run(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                    stdout=open(os.path.join(args.workdir, split + ".stdout"), "w")).returncode
            dt = time.monotonic() - t0
            after = loadavg()
            log("   other work during %s: %s" % (split, foreign.summary()))
            if rc != 0:
                for s in servers.items:
                    log("--- %s (%s):\n%s" % (s.name, "alive" if s.alive() else "dead", tail(s.log_path, 8)))
                raise SystemExit("rpc-bench e2e (%s) failed with %s after %.0f s" % (split, rc, dt))
            with open(os.path.join(args.workdir, split + ".md")) as f:
                md = f.read()
            time.sleep(0.5)  # the relays' last --stats
            results[split] = (read_rows(os.path.join(args.workdir, split + ".csv")), md, before, after, cmd, dt,
                              foreign.summary(), counter_delta(relays, counted))
            log("   %s done in %.0f s (load %s)" % (split, dt, after))
        dead = [s.name for s in servers.items if not s.alive()]
        if dead:
            raise SystemExit("died during the run: " + ", ".join(dead))
    total = time.monotonic() - t_start

    # --- the report --------------------------------------------------------------------------------
    csv_rows = []
    doc = []
    h2 = "####" if emulated else "##"  # the emulated block sits in --out's "## Emulated links" section
    if emulated:
        doc.append("### Link `%s`: the tables as the driver wrote them\n" % args.link)
    else:
        doc.append("# One endpoint (`rpc-shim --one-endpoint`) vs separate endpoints: generation speed\n")
    doc.append("Generated by `benches/one_endpoint_bench.py` (command below), run from the working tree at commit "
               "`%s`%s, %s, in %.1f min. Binaries: `%s`, `%s`, `%s`."
               % (commit, " (with uncommitted changes)" if dirty else "", started, total / 60, ours, args.shim,
                  args.rpc_bench))
    doc.append("Client: stock llama.cpp 8.0 `llama-bench` (`%s`), `-t 1`, `-ngl 99`, driven by `rpc-bench e2e`; "
               "servers `-t 1` (ours also `%s`), shim `--transport tcp`. All on one machine with %d cores "
               "(`nproc`), on loopback: client, shim and up to 8 servers share them."
               % (stock, " ".join(COMM_PEERS), os.cpu_count()))
    if emulated:
        doc.append("Link `%s` emulated between the client machine and every worker and between the workers: every "
                   "server behind its own `rpc-bench relay --link %s --comm-link` on 127.0.0.(3 + k) (stock ones also "
                   "`--comm-rank0-port`), which stockN, oursN and the shims' `-w` name; client <-> endpoint (relay or "
                   "shim) through `rpc-bench e2e`'s counting relay on loopback; tensor x2 with `--own-comm-port "
                   "ours2 --own-comm-port stock2`." % (args.link, args.link))
    doc.append("Targets per N: **stock xN** = N stock `ggml-rpc-server`s as N endpoints, **ours xN** = N of our "
               "`rpc-server`s as N endpoints, **one endpoint xN** = `rpc-shim --one-endpoint` over the same N of "
               "ours, one endpoint. Every endpoint the client names is a counting relay of `rpc-bench` (no delay): "
               "the `none` lane; with `--direct`, the `direct` lane is one more run per round straight to the servers "
               "or the shim. t/s = mean over the rounds' runs (± pooled sd); ratios are of those means. Client B/token = "
               "bytes both ways between the client and its endpoints per generated token (tg) or per prompt token "
               "(pp), exact (the relay's difference between a -r 1 and a -r R run).\n")
    if args.note:
        doc.append(args.note + "\n")
    doc.append("```sh\npython3 benches/one_endpoint_bench.py %s\n```\n" % " ".join(shlex.quote(a) for a in sys.argv[1:]))
    for split in splits:
        rows, md, before, after, cmd, dt, foreign, relay_counts = results[split]
        p, n, r = pnr[split]
        lanes = ["none"] + (["direct"] if split in direct else [])
        doc.append("%s %s split (%s), -p %d -n %d -r %d, %d rounds\n" % (
            h2, split, os.path.basename(models[split]), p, n, r, rounds[split]))
        doc.append("Load average (1, 5, 15 min) before: %s; after: %s (the benchmark's own processes count in "
                   "it); %.0f s. Other work on the machine meanwhile (sampled from /proc every second): %s.\n"
                   % (before, after, dt, foreign))
        for lane in lanes:
            doc.append("Lane `%s`%s:\n" % (lane, " (through the counting relays)" if lane == "none"
                                            else " (no relay: llama-bench straight to the servers or the shim, "
                                            "one run per target and round; traffic columns from the relayed lane)"))
            doc.append("| N | target | tg t/s | tg vs stock xN | tg vs ours xN | pp t/s | pp vs stock xN | "
                       "pp vs ours xN | client B/token tg | round trips/token tg | client B/token pp |")
            doc.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for k in ns:
                got = {}
                for kind in KINDS:
                    label = "%s%d" % (kind, k)
                    got[kind] = {ph: rows.get((label, lane, ph)) for ph in ("tg", "pp")}
                for kind in KINDS:
                    cells = [str(k), KIND_NAME[kind] % k]
                    rec = {"split": split, "lane": lane, "n": k, "target": KIND_NAME[kind] % k}
                    for ph in ("tg", "pp"):
                        row = got[kind][ph]
                        m, sd = tps(row["t/s"]) if row else (None, None)
                        ms = tps(got["stock"][ph]["t/s"])[0] if got["stock"][ph] else None
                        mo = tps(got["ours"][ph]["t/s"])[0] if got["ours"][ph] else None
                        cells += ["%.2f ± %.2f" % (m, sd) if m is not None else "-", ratio(m, ms), ratio(m, mo)]
                        rec.update({ph + "_tps": m, ph + "_sd": sd, ph + "_vs_stock": ratio(m, ms),
                                    ph + "_vs_ours": ratio(m, mo)})
                        # traffic is counted in the relay lanes only; every lane shows the relay's count
                        t = rows.get(("%s%d" % (kind, k), "none", ph))
                        if t:
                            b = int(t["bytes/token up"]) + int(t["bytes/token down"])
                            rec[ph + "_client_bytes_per_token"] = b
                            rec[ph + "_round_trips_per_token"] = t["round trips/token"]
                    cells += [str(rec.get("tg_client_bytes_per_token", "-")),
                              str(rec.get("tg_round_trips_per_token", "-")),
                              str(rec.get("pp_client_bytes_per_token", "-"))]
                    doc.append("| " + " | ".join(cells) + " |")
                    csv_rows.append(rec)
            doc.append("")
        doc.append("Commands on the wire between the client and its endpoints (`rpc-bench e2e`, counted through the "
                   "relays; per prompt batch and per generated token):\n")
        doc.append(section(md, "Commands on the wire"))
        if relay_counts:
            doc.append("\nThrough the emulating relays during this split (all targets, counting runs included; "
                       "`rpc-bench relay --stats`): the link's bytes are the servers' own link (COMM_INIT's pairwise "
                       "link, the shim's LINK_OPEN pushes):\n")
            doc.append("| relay | listens | forwards to | connections | round trips | MB through | link MB |")
            doc.append("|---|---|---|---|---|---|---|")
            for r, d in relay_counts:
                doc.append("| %s | %s | %s | %d | %d | %.1f | %.2f |" % (
                    r.name, r.endpoint, r.upstream, d["connections"], d["round_trips"],
                    (d["c2s_bytes"] + d["s2c_bytes"]) / 1e6, (d["comm_c2s_bytes"] + d["comm_s2c_bytes"]) / 1e6))
        if emulated:
            doc.append("\nrpc-bench's chart: `%s`. Its command:\n" % os.path.relpath(png_path(split), REPO))
        else:
            doc.append("\nrpc-bench's chart: [%s](%s). Its command:\n" % (
                os.path.basename(png_path(split)), os.path.basename(png_path(split))))
        doc.append("```sh\n%s\n```\n" % shlex.join(os.path.relpath(c, REPO) if c.startswith(REPO) else c
                                                    for c in cmd))
    text = "\n".join(doc) + "\n"
    if emulated:
        text = splice(args.out, args.link, text)
        with open(stem + ".md", "w") as f:
            f.write("\n".join(doc) + "\n")
    with open(args.out, "w") as f:
        f.write(text)
    fields = ["split", "lane", "n", "target"]
    for ph in ("tg", "pp"):
        fields += [ph + "_tps", ph + "_sd", ph + "_vs_stock", ph + "_vs_ours", ph + "_client_bytes_per_token",
                   ph + "_round_trips_per_token"]
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for rec in csv_rows:
            w.writerow(rec)
    log("report: %s, %s.csv, %s-*.png (%.1f min)" % (args.out, stem, stem, total / 60))
    print("\n".join(doc))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print("interrupted (%s); processes stopped" % e, file=sys.stderr)
        sys.exit(130)
