#!/usr/bin/env python3
"""Compromised-session harness (issue 23, item 8): what can code already running inside one
sandboxed session process reach?

The payload (tests/compromise/payload.c, built here with gcc) is given to our server as
LD_PRELOAD, so every session process loads it. It acts only in the attacker's session process:
one whose argv has `--session-child` and whose client (the peer of fd 0, else `--session-peer`)
connects from 127.0.0.2 (RPC_ATTACK_PEER); bystanders connect from 127.0.0.1. At the first
interposed libc call (write, writev, send*, recv*, read, poll, epoll_wait, nanosleep...) once the
session's system-call filter is up (prctl(PR_GET_SECCOMP) == 2) it runs the case named by
RPC_ATTACK once, then goes on into the real call. Each outcome is one stderr line,
`ATTACK <case> <step>: BLOCKED (<errno>)` or `ATTACK <case> <step>: SUCCEEDED`, found anywhere in
the server's combined output (also when the front re-logs a session's stderr with a tag).

Each case runs against a fresh server (`-c --cache-dir D`, `--max-alloc-per-connection`):
  1. (cache, symlink) a warm-up run of the bystander client fills the weight cache;
  2. an idle bystander session (raw protocol from 127.0.0.1: HELLO + ALLOC_BUFFER, then silent):
     its pid is written to D/attack-victim-pid for the signal case;
  3. the attacker's session (raw protocol from 127.0.0.2, 7.0 on --proto7-port, 8.0 on -p for the
     links case: HELLO, ALLOC_BUFFER, then GET_ALIGNMENT
     every 200 ms until the payload says ATTACK-END);
  4. the bystander: stock llama-completion (run_e2e.py's flags, -n 16) from 127.0.0.1, started when
     the attack ends (flood, memory: when it begins, so it runs during it); its stdout must be
     byte-identical to a clean run against a server without the payload;
  5. checks: the front still serves (a fresh HELLO + ALLOC_BUFFER + GET_ALIGNMENT answered, front
     alive), the idle bystander session is alive and answers, and per case the canary file outside
     the cache (content, mode, owner, times, xattrs), the front's peak RSS (VmHWM) and log growth
     (flood), a restart of the front with --gguf over the planted cache directory (symlink).

Cases: signal cache symlink terminal chmod flood thread memory devices net links staging (see
payload.c). links and staging speak the session's control line themselves (request lines on fd 1;
what the front passes down lands in the process's descriptor table whoever asked):
  links (issue 31: the front's link broker), two variants, each its own server (with --metrics on
    a port outside the link policy) and ending in a request the front must answer by killing the
    process: "main": (a) rank 1 to a loopback service the harness runs that greets first (an SSH
    banner) on a port inside the policy (the attacker's port + 1000 + k): BLOCKED if no socket
    came (or it reads no banner byte): the peer must prove to be a ggml RPC server; (b) --links (40)
    requests for device 0 to a fake ggml rank 0 the harness runs (reads 24 bytes, answers 24 zero
    bytes, keeps the connection): BLOCKED if at most one of the sockets it got still works (one link
    per device: the front shuts the old one down); (c) rank 0 on a port the session chose (not its
    port + 1000); "metrics": rank 1 to the server's own --metrics port (outside --comm-peer-ports).
    (c) and "metrics" are BLOCKED only if the process dies (ATTACK-TRY, no outcome line); the
    harness also checks the front's log line ("session process killed: a link it may not have")
    and rpc_sessions_killed_total on --metrics.
  staging (issue 31: staging memory): --staging-rounds (20) rounds of `W n` (n = a third of
    --per-connection), the memfd filled with pwrite, `D`, the descriptor kept: BLOCKED if the kept
    files' bytes (sum of sizes, and of what they pin: st_blocks) are at most 2x the budget (a front
    that never empties them leaves 20n); then F_SEAL_SHRINK on a fresh staging file before `D`,
    which the front must answer by killing the process (checked in its log if the seal was made;
    the session's filter refuses F_ADD_SEALS with EPERM first, so the front never sees one).
Bounds: flood: the front's VmHWM may grow by --rss-bound MiB (64), its log by --log-bound MiB (16),
it may accept --line-rate-bound control lines/s (10000); memory: the session may make resident at
most --mem-limit bytes (default: --per-connection + 2 GiB, the rlimit allowance of sandbox.rs) by
any one method (the payload tries 256 MiB more).

  python3 tests/compromise/compromise_e2e.py [--ours target/release/rpc-server] [--stock-bin DIR]
      [--model M] [--cases signal,cache,...] [--report-only | --expect-fail] [--markdown FILE]
      [--links N] [--staging-rounds N]

Exit status: 0 iff every step was BLOCKED and every bystander/front check held (--report-only:
0 whenever the harness itself ran; --expect-fail: 0 iff something failed). Linux only.
"""

import argparse
import datetime
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from e2e_common import REPO, clean_env, log, request, resolve_ours, resolve_stock_bin, run, script_output, tail  # noqa: E402

CASES = ["signal", "cache", "symlink", "terminal", "chmod", "flood", "thread", "memory", "devices", "net", "links",
         "staging"]
PROMPT = "The capital of France is"
ATTACKER_IP = "127.0.0.2"
MIB = 1 << 20
HELLO, ALLOC_BUFFER, GET_ALIGNMENT = 14, 0, 1

OUTCOME_RE = re.compile(r"ATTACK (\w+) (.+?): (BLOCKED|SUCCEEDED)(?: \(([^)]*)\))?")
MARK_RE = re.compile(r"ATTACK-(BEGIN|END) (\w+)")


def completion_cmd(stock, model, n_predict, endpoint):
    """run_e2e.py's client flags (greedy, seeded, one thread, --no-repack, -c 512)."""
    return [os.path.join(stock, "llama-completion"), "-m", model, "-p", PROMPT, "-n", str(n_predict),
            "--temp", "0", "-s", "1", "-t", "1", "-ngl", "99", "--no-repack", "-c", "512", "-no-cnv",
            "--simple-io", "--ignore-eos", "-lv", "4", "--rpc", endpoint]


EVAL_RE = re.compile(rb"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")


def complete(stock, model, n, endpoint, tag, workdir, timeout=300):
    """One bystander run: (rc, stdout). Repeated (up to 5 times) when stderr lacks the perf summary
    (llama-completion may lose the tail of its output at exit; see run_e2e.py)."""
    cmd = completion_cmd(stock, model, n, endpoint)
    for _ in range(5):
        rc, out, err, _dt = run(cmd, timeout, os.path.join(workdir, tag + ".out"),
                                os.path.join(workdir, tag + ".err"))
        if rc != 0 or EVAL_RE.search(err):
            break
    return rc, out


# --- raw protocol 7.0.0 clients ---

def open_session(port, src="127.0.0.1", timeout=30):
    """HELLO + ALLOC_BUFFER(1 MiB): the connection is then served by a session process."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    request(s, HELLO, bytes(24))
    handle, _size = struct.unpack("<QQ", request(s, ALLOC_BUFFER, struct.pack("<IQ", 0, MIB)))
    if handle == 0:
        raise RuntimeError("ALLOC_BUFFER answered a null handle")
    return s


def alignment(s):
    return struct.unpack("<Q", request(s, GET_ALIGNMENT, struct.pack("<I", 0)))[0]


def front_serves(port):
    """A fresh client is served: HELLO + ALLOC_BUFFER + GET_ALIGNMENT answered."""
    try:
        s = open_session(port, timeout=30)
        try:
            return alignment(s) > 0, ""
        finally:
            s.close()
    except (OSError, RuntimeError, struct.error) as e:
        return False, str(e)


# --- processes ---

def proc_children():
    """pid -> ppid for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
            out[int(d)] = int(st[st.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return out


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def descendants(root):
    parents = proc_children()
    out, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out += kids
        frontier += kids
    return out


def session_pid(front, local_port, timeout=10):
    """The deepest session process serving the client whose local port is `local_port`."""
    want = ("127.0.0.1:%d" % local_port).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in descendants(front)
                 if b"--session-child" in cmdline(p) and want in cmdline(p)]
        if found:
            return found[-1]
        time.sleep(0.05)
    return None


def status_kib(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
        return st[st.rindex(")") + 2] != "Z"
    except OSError:
        return False


def sysv_segment(key):
    """The size of the host's SysV shared memory segment with `key` (0: none), which is then
    removed."""
    size = 0
    try:
        with open("/proc/sysvipc/shm") as f:
            next(f)
            for line in f:
                w = line.split()
                if int(w[0]) == key:
                    size = int(w[3])
    except (OSError, ValueError, IndexError, StopIteration):
        return 0
    if size:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(0), ctypes.c_int(0))
        if shmid >= 0:
            libc.shmctl(shmid, 0, None)  # IPC_RMID
    return size


# --- the server under attack ---

class AttackServer:
    """Our server, started through `sh -c 'RPC_ATTACK_FRONT_PID=$$ exec ...'` (so the payload
    knows the front's pid) in its own process group, stdout and stderr to `log_path` (or, with
    `tty`, to a pseudo-terminal drained into it)."""

    def __init__(self, binary, port, extra, env, log_path, tty=False):
        self.binary, self.port, self.extra, self.env = binary, port, list(extra), dict(env)
        self.log_path, self.tty = log_path, tty
        self.proc = None
        self.drain = None

    def cmd(self):
        return [self.binary, "-H", "127.0.0.1", "-p", str(self.port + 1), "--proto7-port", str(self.port),
                "-t", "1"] + self.extra

    def start(self, timeout=60):
        logf = open(self.log_path, "ab")
        logf.write(("\n===== %s\n" % shlex.join(self.cmd())).encode())
        logf.flush()
        wrapper = ["sh", "-c", 'RPC_ATTACK_FRONT_PID=$$; export RPC_ATTACK_FRONT_PID; exec "$@"', "sh"] + self.cmd()
        env = dict(clean_env(), **self.env)
        if self.tty:
            master, slave = os.openpty()
            self.proc = subprocess.Popen(wrapper, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                         start_new_session=True, env=env)
            os.close(slave)

            def drain():
                while True:
                    try:
                        b = os.read(master, 65536)
                    except OSError:
                        break
                    if not b:
                        break
                    logf.write(b.replace(b"\r\n", b"\n"))
                    logf.flush()
                os.close(master)
                logf.close()
            self.drain = threading.Thread(target=drain, daemon=True)
            self.drain.start()
        else:
            self.proc = subprocess.Popen(wrapper, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)
            logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %s during startup:\n%s" % (self.proc.returncode,
                                                                                 tail(self.log_path)))
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("server did not listen on %d:\n%s" % (self.port, tail(self.log_path)))

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        p = self.proc
        if p is None:
            return
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                p.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # stragglers in its group
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.drain:
            self.drain.join(timeout=5)
        self.proc = None


def pick_port(base, used):
    """A port in [base, base + 1000) whose port and port + 1 are free and not used before."""
    for p in range(base, base + 1000, 2):
        if p in used or p + 1 in used:
            continue
        ok = True
        for q in (p, p + 1):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", q))
            except OSError:
                ok = False
            finally:
                s.close()
        if ok:
            used.update((p, p + 1))
            return p
    raise RuntimeError("no free port pair in %d..%d" % (base, base + 999))


def read_log(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "backslashreplace")
    except OSError:
        return ""


def wait_for(path, pattern, timeout, stop=None):
    deadline = time.monotonic() + timeout
    rx_ = re.compile(pattern)
    while time.monotonic() < deadline:
        if rx_.search(read_log(path)):
            return True
        if stop and stop():
            return bool(rx_.search(read_log(path)))
        time.sleep(0.1)
    return False


# --- canary ---

def make_canary(path):
    with open(path, "wb") as f:
        f.write(b"canary: must stay exactly this\n" + os.urandom(32).hex().encode() + b"\n")
    os.chmod(path, 0o600)
    try:
        os.chown(path, 0, 0)
    except PermissionError:
        pass
    return canary_state(path)


def canary_state(path):
    try:
        st = os.lstat(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            xattrs = sorted(os.listxattr(path))
        except OSError:
            xattrs = []
        return dict(mode=oct(stat.S_IMODE(st.st_mode)), uid=st.st_uid, gid=st.st_gid, size=st.st_size,
                    mtime=st.st_mtime_ns, ino=st.st_ino, data=data, xattrs=xattrs)
    except OSError as e:
        return dict(error=str(e))


def canary_diff(a, b):
    return ", ".join("%s %r -> %r" % (k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k) and k != "data") + (" content changed" if a.get("data") != b.get("data") else "")


# --- the links case's peers ---

class LinkPeers:
    """Loopback peers for the links case, on ports inside the attacker's link policy (the port its
    client reached + 1000 + k, k small: an allowed RPC port + 1000): a service that greets first (an
    SSH banner) and a fake ggml rank 0 (reads 24 bytes, answers 24 zero bytes, keeps the connection);
    and two ports outside it: a rank-0 port of the session's choosing (free: a front that obeys
    listens there) and the server's --metrics port."""

    BANNER = b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n"  # longer than a caps block (24 bytes)

    def __init__(self, port):
        self.base = port + 1000
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.conns = []
        self.greeted = self.accepted = self.exchanged = 0
        taken = set()
        self.banner_sock, self.banner_port = self._listen(taken)
        self.fake_sock, self.fake_port = self._listen(taken)
        s, self.chosen_port = self._listen(taken)
        s.close()
        for _ in range(50):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            s.close()
            if abs(p - self.base) > 200:
                self.metrics_port = p
                break
        else:
            raise RuntimeError("no free port for --metrics outside the link policy")
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._banner, self._fake)]
        for t in self.threads:
            t.start()

    def _listen(self, taken):
        for k in range(3, 90):
            p = self.base + k
            if p in taken:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
                s.listen(64)
            except OSError:
                s.close()
                continue
            s.settimeout(0.2)
            taken.add(p)
            return s, p
        raise RuntimeError("no free port in %d..%d" % (self.base + 3, self.base + 89))

    def _accept(self, sock):
        try:
            c, _ = sock.accept()
        except (socket.timeout, OSError):
            return None
        with self.lock:
            self.conns.append(c)
        return c

    def _banner(self):
        while not self.stop.is_set():
            c = self._accept(self.banner_sock)
            if c:
                try:
                    c.sendall(self.BANNER)
                    with self.lock:
                        self.greeted += 1
                except OSError:
                    pass

    def _fake(self):
        def serve(c):
            c.settimeout(5)
            got = b""
            try:
                while len(got) < 24:
                    b = c.recv(24 - len(got))
                    if not b:
                        return
                    got += b
                c.sendall(bytes(24))
                with self.lock:
                    self.exchanged += 1
            except OSError:
                pass
        while not self.stop.is_set():
            c = self._accept(self.fake_sock)
            if c:
                with self.lock:
                    self.accepted += 1
                threading.Thread(target=serve, args=(c,), daemon=True).start()

    def env(self):
        return {"RPC_ATTACK_BANNER_PORT": str(self.banner_port), "RPC_ATTACK_FAKE_RANK0_PORT": str(self.fake_port),
                "RPC_ATTACK_CHOSEN_PORT": str(self.chosen_port), "RPC_ATTACK_METRICS_PORT": str(self.metrics_port)}

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=2)
        with self.lock:
            for c in self.conns + [self.banner_sock, self.fake_sock]:
                c.close()


def metric(port, name):
    """A counter's value on --metrics (None: the page is not served or has no such counter)."""
    import urllib.request
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    m = re.search(r"^%s(?:\{[^}]*\})? (\d+)" % re.escape(name), text, re.M)
    return int(m.group(1)) if m else None


# --- one case ---

class Row:
    def __init__(self, case, step, outcome, detail=""):
        self.case, self.step, self.outcome, self.detail = case, step, outcome, detail


# Cases run as several variants, each against its own server (RPC_ATTACK_FLOOD_STEP, RPC_ATTACK_STEP): a
# front that ends the session at the first flood step would otherwise hide the others; each links
# variant ends with a request that must get the session process killed.
VARIANTS = {"flood": ["line", "rate", "junk"], "links": ["main", "metrics"]}
TAG_RE = re.compile(r"(\s+[\w.]+=\S+)+\s*$")  # key=value fields a front may append when re-logging


def run_case(case, a, ctx, variant=None):
    """Runs one case (variant) against a fresh server; returns (rows, bystander_ok, bystander_note,
    front_ok, front_note)."""
    workdir = os.path.join(ctx["workdir"], case + ("-" + variant if variant else ""))
    suffix = " (%s)" % variant if variant else ""
    os.makedirs(workdir, exist_ok=True)
    os.chmod(workdir, 0o755)  # reachable by path: what keeps a session out must be its containment
    cache_dir = os.path.join(workdir, "cache")  # the server creates it
    canary = os.path.join(workdir, "canary")
    canary0 = make_canary(canary)
    victim_file = os.path.join(cache_dir, "attack-victim-pid")
    shm_key = 0x52500000 | int.from_bytes(os.urandom(2), "little")
    port = pick_port(a.port_base, ctx["used_ports"])
    log_path = os.path.join(workdir, "server.log")
    env = {
        "LD_PRELOAD": ctx["payload"],
        "RPC_ATTACK": case,
        "RPC_ATTACK_PEER": ATTACKER_IP,
        "RPC_ATTACK_CACHE_DIR": cache_dir,
        "RPC_ATTACK_CANARY": canary,
        "RPC_ATTACK_VICTIM_FILE": victim_file,
        "RPC_ATTACK_PORT": str(port),
        "RPC_ATTACK_MEM_LIMIT": str(ctx["mem_limit"]),
        "RPC_ATTACK_RSS_BOUND": str(a.rss_bound * MIB),
        "RPC_ATTACK_LINE_RATE": str(a.line_rate_bound),
        "RPC_ATTACK_SHM_KEY": str(shm_key),
        "RPC_ATTACK_FLOOD_STEP": variant or "",
        "RPC_ATTACK_STEP": variant or "",
        "RPC_ATTACK_LINKS": str(a.links),
        "RPC_ATTACK_BUDGET": str(parse_size(a.per_connection)),
        "RPC_ATTACK_STAGING_ROUNDS": str(a.staging_rounds),
    }
    extra = ["--cache-dir", cache_dir, "--max-alloc-per-connection", a.per_connection]
    peers = None
    if case == "links":
        peers = LinkPeers(port)
        env.update(peers.env())
        extra += ["--metrics", "127.0.0.1:%d" % peers.metrics_port]
    srv = AttackServer(ctx["ours"], port, extra, env, log_path, tty=(case == "terminal"))
    rows = []
    notes = []
    endpoint = "127.0.0.1:%d" % port
    byst_ok, byst_note = False, "not run"
    victim = None
    attacker_done = threading.Event()
    attacker_err = []
    try:
        srv.start()
        front = srv.pid
        if case in ("cache", "symlink"):
            rc, out = complete(ctx["stock"], ctx["model"], a.tokens, endpoint, "warmup", workdir)
            if rc != 0 or out != ctx["reference"]:
                notes.append("warm-up run differed (rc %s)" % rc)
        victim = open_session(port)
        vpid = session_pid(front, victim.getsockname()[1])
        os.makedirs(cache_dir, exist_ok=True)
        with open(victim_file, "w") as f:
            f.write("%d\n" % (vpid or 0))
        rss0, hwm0 = status_kib(front, "VmRSS"), status_kib(front, "VmHWM")
        log0 = os.path.getsize(log_path)
        peak = [rss0 or 0]
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                r = status_kib(front, "VmRSS")
                if r:
                    peak[0] = max(peak[0], r)
                time.sleep(0.05)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def attacker():
            try:
                # The links case speaks 8.0 (-p, the port above --proto7-port): a 7.0 session has
                # no COMM_INIT, so any link request of one is killed before its checks are reached.
                attack_port = port + 1 if case == "links" else port
                s = open_session(attack_port, src=ATTACKER_IP, timeout=a.attack_timeout)
                try:
                    deadline = time.monotonic() + a.attack_timeout
                    while time.monotonic() < deadline and not attacker_done.is_set():
                        alignment(s)
                        time.sleep(0.2)
                finally:
                    s.close()
            except (OSError, RuntimeError, struct.error) as e:
                attacker_err.append(str(e))
            finally:
                attacker_done.set()
        att = threading.Thread(target=attacker, daemon=True)
        att.start()
        began = wait_for(log_path, r"ATTACK-BEGIN %s" % case, 60, stop=attacker_done.is_set)
        early = case in ("flood", "memory")
        if began and not early:
            wait_for(log_path, r"ATTACK-END %s" % case, a.attack_timeout, stop=attacker_done.is_set)
        rc, out = complete(ctx["stock"], ctx["model"], a.tokens, endpoint, "bystander", workdir)
        byst_ok = rc == 0 and out == ctx["reference"]
        byst_note = "" if byst_ok else ("rc %s" % rc if rc != 0 else "output differs: %r" % out[-80:])
        if began:
            wait_for(log_path, r"ATTACK-END %s" % case, a.attack_timeout, stop=attacker_done.is_set)
        attacker_done.set()
        att.join(timeout=30)
        sampling.set()
        sampler.join()
        time.sleep(0.5)
        text = read_log(log_path)
        seen = set()
        for m in OUTCOME_RE.finditer(text):
            if m.group(1) != case:
                continue
            step = m.group(2)
            if step in seen:
                continue
            seen.add(step)
            dev = re.match(r"open (/dev/\S+) read-write$", step)
            if case == "devices" and dev and not os.path.exists(dev.group(1)):
                continue  # not on this host either
            rows.append(Row(case, step, m.group(3), m.group(4) or ""))
        # a step that was started but never reported: the process died during it
        for m in re.finditer(r"ATTACK-TRY %s (.+)" % case, text):
            st = TAG_RE.sub("", m.group(1)).strip()
            if st not in seen:
                rows.append(Row(case, st, "BLOCKED", "the session process ended during the step"))
                seen.add(st)
        if not began:
            if case == "thread" and "payload armed" in text:
                rows.append(Row(case, "session with a thread started before the sandbox", "BLOCKED",
                                "refused: no ATTACK-BEGIN; attacker: %s" % ((attacker_err or ["-"])[0])))
            else:
                rows.append(Row(case, "payload ran" + suffix, "ERROR",
                                "no ATTACK-BEGIN (armed: %s)" % ("payload armed" in text)))
        elif not re.search(r"ATTACK-END %s" % case, text) and not any(
                r.detail == "the session process ended during the step" for r in rows):
            rows.append(Row(case, "payload finished" + suffix, "BLOCKED",
                            "no ATTACK-END: the session process ended mid-case"))
        # checks the harness makes itself
        front_ok, fnote = front_serves(port)
        front_ok = front_ok and srv.alive()
        if not srv.alive():
            fnote = "front exited (%s)" % srv.proc.returncode
        if case == "signal" and vpid:
            try:
                v_ok = alive(vpid)
                vdet = "" if v_ok else "process gone"
                v_ok = v_ok and alignment(victim) > 0
            except (OSError, struct.error, ConnectionError) as e:
                v_ok, vdet = False, str(e)
            rows.append(Row(case, "check: the idle bystander session (pid %d) still alive and answering" % vpid,
                            "BLOCKED" if v_ok else "SUCCEEDED", vdet))
        if case == "flood":
            hwm1 = status_kib(front, "VmHWM") or 0
            grown = max(peak[0] - (rss0 or 0), hwm1 - (hwm0 or 0)) // 1024
            rows.append(Row(case, "check: front peak RSS growth <= %d MiB%s" % (a.rss_bound, suffix),
                            "SUCCEEDED" if grown > a.rss_bound else "BLOCKED",
                            "VmRSS %d -> peak %d MiB, VmHWM %d -> %d MiB" % ((rss0 or 0) // 1024, peak[0] // 1024,
                                                                            (hwm0 or 0) // 1024, hwm1 // 1024)))
            lg = (os.path.getsize(log_path) - log0) / MIB
            rows.append(Row(case, "check: server log growth <= %d MiB%s" % (a.log_bound, suffix),
                            "SUCCEEDED" if lg > a.log_bound else "BLOCKED", "%.1f MiB" % lg))
        if case == "symlink":
            srv.stop()
            # the front follows what the session planted when it starts again (gguf-index)
            srv2 = AttackServer(ctx["ours"], port, extra + ["--gguf", ctx["model"]], env, log_path)
            try:
                srv2.start(timeout=120)
                wait_for(log_path, r"gguf|GGUF", 10)
                time.sleep(2)
            except RuntimeError as e:
                notes.append("restart with --gguf: %s" % e)
            finally:
                srv2.stop()
        if case == "memory":
            srv.stop()  # the session and its server are gone: is the segment?
            left = sysv_segment(shm_key)
            rows.append(Row(case, "check: no SysV segment of the session outlives the server",
                            "SUCCEEDED" if left else "BLOCKED",
                            "key 0x%x: %d bytes still there (removed now)" % (shm_key, left) if left else ""))
        if case == "links":
            # each variant ends with a request outside the policy: the front kills and says so
            killed = re.search(r"session process killed: a link it may not have", text)
            rows.append(Row(case, "check: the front killed the session: a link it may not have" + suffix,
                            "BLOCKED" if killed else "SUCCEEDED", "" if killed else "no such line in its log"))
            n = metric(peers.metrics_port, "rpc_sessions_killed_total")
            rows.append(Row(case, "check: rpc_sessions_killed_total counts it" + suffix,
                            "BLOCKED" if n else "SUCCEEDED", "no such counter" if n is None else "%d" % n))
            log("  peers: greeting service greeted %d; fake rank 0 accepted %d, answered %d caps blocks"
                % (peers.greeted, peers.accepted, peers.exchanged))
        if case == "staging" and "ATTACK-INFO staging sealed" in text:
            killed = re.search(r"session process killed: a staging file it may not keep", text)
            rows.append(Row(case, "check: the front killed the session: a staging file it may not keep",
                            "BLOCKED" if killed else "SUCCEEDED", "" if killed else "no such line in its log"))
        if case in ("symlink", "chmod", "thread", "cache"):
            c1 = canary_state(canary)
            rows.append(Row(case, "check: the canary outside the cache is unchanged",
                            "BLOCKED" if c1 == canary0 else "SUCCEEDED",
                            "" if c1 == canary0 else canary_diff(canary0, c1)))
        if notes:
            byst_note = "; ".join([byst_note] + notes) if byst_note else "; ".join(notes)
        return rows, byst_ok, byst_note, front_ok, fnote
    finally:
        attacker_done.set()
        if victim is not None:
            victim.close()
        srv.stop()
        if peers is not None:
            peers.close()


def build_payload(out_dir):
    src = os.path.join(HERE, "payload.c")
    so = os.path.join(out_dir, "rpc-attack-payload.so")
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SystemExit("gcc not found")
    subprocess.run([cc, "-O2", "-Wall", "-Wno-format-truncation", "-shared", "-fPIC", "-o", so, src,
                    "-ldl", "-lpthread", "-lrt"], check=True, timeout=120)
    return so


def reference_run(a, ctx):
    """The bystander's output against a server without the payload."""
    port = pick_port(a.port_base, ctx["used_ports"])
    d = os.path.join(ctx["workdir"], "clean")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    srv = AttackServer(ctx["ours"], port, ["--cache-dir", os.path.join(d, "cache"), "--max-alloc-per-connection",
                                           a.per_connection], {}, os.path.join(d, "server.log"))
    try:
        srv.start()
        rc, out = complete(ctx["stock"], ctx["model"], a.tokens, "127.0.0.1:%d" % port, "reference", d)
        if rc != 0 or not out.strip():
            raise SystemExit("the clean reference run failed (rc %s); see %s" % (rc, d))
        return out
    finally:
        srv.stop()


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)", s.strip().upper())
    if not m:
        raise SystemExit("bad size %r" % s)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="our server binary (default: target/release/rpc-server)")
    ap.add_argument("--stock-bin", help="stock llama.cpp 7.0 bin dir (default: $STOCK_BIN or scripts/stock-llama.sh)")
    ap.add_argument("--model", help="default: scripts/test-model.sh (gemma-3-270m)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated (default: all: %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--report-only", action="store_true", help="print the table; exit 0 whatever it says")
    mode.add_argument("--expect-fail", action="store_true", help="exit 0 iff some attack succeeded or a check failed")
    ap.add_argument("--markdown", help="also write the table (and how it was made) to this file")
    ap.add_argument("--tokens", type=int, default=16, help="bystander tokens (default 16)")
    ap.add_argument("--per-connection", default="1G",
                    help="--max-alloc-per-connection (default 1G: the bystander's gemma needs ~800 MiB)")
    ap.add_argument("--mem-limit", help="memory case bound, bytes or K/M/G (default: --per-connection + 2G)")
    ap.add_argument("--rss-bound", type=int, default=64, help="flood: front VmHWM growth bound, MiB (default 64)")
    ap.add_argument("--log-bound", type=int, default=16, help="flood: server log growth bound, MiB (default 16)")
    ap.add_argument("--line-rate-bound", type=int, default=10000, help="flood: control lines/s bound (default 10000)")
    ap.add_argument("--links", type=int, default=40, help="links: link requests for device 0 (default 40)")
    ap.add_argument("--staging-rounds", type=int, default=20, help="staging: W/fill/D rounds kept (default 20)")
    ap.add_argument("--attack-timeout", type=float, default=180, help="per case, seconds")
    ap.add_argument("--port-base", type=int, default=39000, help="ports are taken from [base, base+1000)")
    ap.add_argument("--workdir", help="default: a fresh temp dir (kept on failure or with --keep)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if sys.platform != "linux":
        print("skip: the compromised-session harness is Linux-only (LD_PRELOAD, seccomp, /proc)")
        return 0
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit("unknown case(s) %s; known: %s" % (", ".join(bad), ", ".join(CASES)))
    stock = resolve_stock_bin(a.stock_bin, needed=("llama-completion",))
    ours = resolve_ours(a.ours)
    model = a.model or script_output("test-model.sh", timeout=900)
    workdir = os.path.abspath(a.workdir or tempfile.mkdtemp(prefix="rpc-compromise-"))
    os.makedirs(workdir, exist_ok=True)
    os.chmod(workdir, 0o755)  # mkdtemp's 0700 would keep out a session of another uid by itself
    per_conn = parse_size(a.per_connection)
    mem_limit = parse_size(a.mem_limit) if a.mem_limit else per_conn + (2 << 30)
    ctx = dict(workdir=workdir, ours=ours, stock=stock, model=model, used_ports=set(), mem_limit=mem_limit)
    log("workdir: %s\nours: %s\nstock: %s\nmodel: %s" % (workdir, ours, stock, model))
    ctx["payload"] = build_payload(workdir)
    t0 = time.monotonic()
    ctx["reference"] = reference_run(a, ctx)
    log("reference (clean server): %r" % ctx["reference"])
    table = []
    failed = 0
    for case in cases:
        case_failed = False
        for variant in VARIANTS.get(case, [None]):
            log("=== case %s%s" % (case, " (%s)" % variant if variant else ""))
            try:
                rows, bok, bnote, fok, fnote = run_case(case, a, ctx, variant)
            except Exception as e:  # a harness failure in one case: record it, go on
                rows, bok, bnote, fok, fnote = [Row(case, "harness", "ERROR", repr(e))], False, "", False, ""
            for r in rows:
                log("  %-9s %-70s %s" % (r.outcome, r.step[:70], r.detail))
            log("  bystander identical: %s %s; front serving: %s %s" % (bok, bnote, fok, fnote))
            case_failed |= not bok or not fok or any(r.outcome in ("SUCCEEDED", "ERROR") for r in rows)
            for r in rows:
                table.append((r, bok, bnote, fok, fnote))
        failed += case_failed
    head = ["| case | step | outcome | detail | bystander identical | front serving |",
            "|---|---|---|---|---|---|"]
    lines = []
    for r, bok, bnote, fok, fnote in table:
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r.case, r.step.replace("|", "/"), "**SUCCEEDED**" if r.outcome == "SUCCEEDED" else r.outcome,
            r.detail.replace("|", "/"), ("yes" if bok else "**no**") + (" (%s)" % bnote if bnote else ""),
            ("yes" if fok else "**no**") + (" (%s)" % fnote if fnote else "")))
    md = "\n".join(head + lines)
    print(md)
    steps = len(table)
    succ = sum(1 for r, *_ in table if r.outcome == "SUCCEEDED")
    summary = "%d steps, %d SUCCEEDED; %d of %d cases failed (%.0f s)" % (steps, succ, failed, len(cases),
                                                                        time.monotonic() - t0)
    print("\n" + summary)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("<!-- %s, %s -->\n%s\n\n%s\n" % (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                                   shlex.join(sys.argv), md, summary))
    if not failed and not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        log("logs kept in %s" % workdir)
    if a.report_only:
        return 0
    if a.expect_fail:
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
