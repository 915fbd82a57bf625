"""Shared helpers for the end-to-end tests (tests/e2e/*.py) and benches/llama_bench_compare.py (stdlib only).

Server processes are started in their own session (process group) and always killed, also on
failure or Ctrl-C: use `with Servers() as s:`; every subprocess has a timeout.
"""

import atexit
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CACHE = os.environ.get("RPC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ggml-rpc-rs")


def recv_exact(s, n):
    """Exactly n bytes from socket s; ConnectionError if it closes first."""
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed after %d of %d bytes" % (len(b), n))
        b += c
    return b


def request(s, cmd, payload):
    """One raw ggml RPC request (command byte, u64 LE size, payload); returns the reply's payload."""
    s.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    n, = struct.unpack("<Q", recv_exact(s, 8))
    return recv_exact(s, n)


# Command bytes of the two raw requests the benches send (rpc-proto's `Command`: ALLOC_BUFFER 0,
# HELLO 14, the same in both majors).
ALLOC_BUFFER, HELLO = 0, 14


def first_command_ms(port):
    """ALLOC_BUFFER's round trip (1 MiB on device 0) on a fresh connection after its HELLO, in ms:
    what a client waits for its first stateful command (a contained server's session start)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request(s, HELLO, bytes(24))
        t = time.perf_counter()
        ptr, _ = struct.unpack("<QQ", request(s, ALLOC_BUFFER, struct.pack("<IQ", 0, 1 << 20)))
        dt = (time.perf_counter() - t) * 1e3
        assert ptr != 0, "ALLOC_BUFFER failed"
        return dt


def wait_port(port, proc, timeout=20):
    """Waits until 127.0.0.1:port listens; raises if `proc` exits or it does not within `timeout` s."""
    if not wait_listening("127.0.0.1", port, timeout, proc):
        raise RuntimeError("server did not listen on %d: %s" % (port, proc.args))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def clean_env():
    """Environment for llama.cpp tools: drop LLAMA_ARG_* (they silently change CLI defaults)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env.pop("GGML_RPC_DEBUG", None)
    return env


def script_output(script, timeout):
    """Run a repo script (scripts/*.sh) and return the last line of its stdout."""
    path = os.path.join(REPO, "scripts", script)
    r = subprocess.run([path], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=timeout,
                       check=True, text=True)
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    if not lines:
        raise RuntimeError("%s printed nothing" % script)
    return lines[-1].strip()


def resolve_stock_bin(arg, needed=("ggml-rpc-server", "llama-completion", "llama-bench")):
    d = arg or os.environ.get("STOCK_BIN")
    if not d:
        log("--stock-bin not given: running scripts/stock-llama.sh (builds on first use, ~12 min)")
        d = script_output("stock-llama.sh", timeout=3600)
    d = os.path.abspath(d)
    missing = [b for b in needed if not os.access(os.path.join(d, b), os.X_OK)]
    if missing:
        raise SystemExit("stock bin dir %s lacks %s" % (d, ", ".join(missing)))
    return d


def resolve_ours(arg):
    p = arg or os.path.join(REPO, "target", "release", "rpc-server")
    if not os.path.isabs(p) and not os.path.exists(p):
        p = os.path.join(REPO, p)
    p = os.path.abspath(p)
    if not os.access(p, os.X_OK):
        raise SystemExit("our server binary %s not found or not executable (cargo build --release, "
                         "or pass --ours PATH)" % p)
    return p


COMM_OFFSET = 1000  # an 8.0 client's tensor split makes rank 0's server listen on its port + 1000
_given_ports = set()


def free_port(exclude=()):
    """A free loopback port, never one this process was given before nor one COMM_OFFSET above or
    below such a port, and whose port + COMM_OFFSET is free too: any server may become rank 0 of a
    stock 8.0 client's tensor split (proto8_e2e.py), which listens there."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        near = {port, port - COMM_OFFSET, port + COMM_OFFSET}
        if port in exclude or near & _given_ports or not _bindable(port + COMM_OFFSET):
            continue
        _given_ports.add(port)
        return port
    raise RuntimeError("no free port")


def _bindable(port):
    if port > 65535:
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


_help_text = {}


def help_mentions(binary, flag):
    """Whether `binary --help` mentions `flag` (read once per binary)."""
    if binary not in _help_text:
        try:
            r = subprocess.run([binary, "--help"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=30)
            _help_text[binary] = r.stdout
        except (OSError, subprocess.TimeoutExpired):
            _help_text[binary] = b""
    return flag.encode() in _help_text[binary]


def has_proto7_port(binary):
    """Whether `binary` is a server that speaks 8.0.0 on -p and 7.0.0 on `--proto7-port` (ours;
    the stock servers speak one major, on -p)."""
    return help_mentions(binary, "--proto7-port")


def wait_listening(host, port, timeout, proc=None):
    """True once host:port accepts a connection (False after `timeout` s or if `proc` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def tail(path, n=25):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return "<cannot read %s: %s>" % (path, e)
    lines = data.decode("utf-8", "backslashreplace").splitlines()
    return "\n".join(lines[-n:])


class Server:
    """One RPC server process (stock ggml-rpc-server or ours; same CLI: -H -p -t).

    `port` is where its clients connect, and `proto` the protocol major those clients speak.
    proto=7 (every suite but proto8_e2e.py: the stock 7.0.0 tools): a server that speaks 8.0.0 on
    -p (ours: it has --proto7-port) is started as `-p <spare port> --proto7-port <port>`, so its
    7.0 clients reach the 7.0.0 listener at `port`; a stock server as `-p <port>`. proto=8: always
    `-p <port>`."""

    def __init__(self, name, binary, port, logdir, threads=None, extra=(), env=None, host="127.0.0.1", proto=7):
        self.name, self.binary, self.port, self.host, self.proto = name, binary, port, host, proto
        self.threads, self.extra, self.env = threads, list(extra), dict(env or {})
        self.log_path = os.path.join(logdir, "server-%s.log" % name)
        self.proc = None
        self.starts = 0
        self.spare_port = None  # ours with proto=7: its 8.0.0 listener (-p), which no test uses

    @property
    def endpoint(self):
        return "%s:%d" % (self.host, self.port)

    def cmd(self):
        c = [self.binary, "-H", self.host]
        if self.proto == 7 and has_proto7_port(self.binary):
            if self.spare_port is None:  # kept across restarts
                self.spare_port = free_port(exclude=(self.port, self.port - COMM_OFFSET))
            c += ["-p", str(self.spare_port), "--proto7-port", str(self.port)]
        else:
            c += ["-p", str(self.port)]
        if self.threads:
            c += ["-t", str(self.threads)]
        return c + self.extra

    def start(self, timeout=30.0):
        self.starts += 1
        logf = open(self.log_path, "ab")
        logf.write(("\n===== start #%d: %s\n" % (self.starts, shlex.join(self.cmd()))).encode())
        logf.flush()
        self.proc = subprocess.Popen(self.cmd(), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=dict(clean_env(), **self.env))
        logf.close()
        if wait_listening(self.host, self.port, timeout, self.proc):
            return self
        if self.proc.poll() is not None:
            raise RuntimeError("server %s exited with %s during startup:\n%s"
                               % (self.name, self.proc.returncode, tail(self.log_path)))
        self.stop()
        raise RuntimeError("server %s did not listen on %s within %.0fs:\n%s"
                           % (self.name, self.endpoint, timeout, tail(self.log_path)))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ensure(self):
        """Restart a dead server; returns a note if it had died."""
        if self.alive():
            return None
        rc = self.proc.returncode if self.proc else None
        note = "server %s had died (exit %s); restarted" % (self.name, rc)
        self.start()
        return note

    def stop(self):
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            try:  # reap stragglers left in its group
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.proc = None


class Servers:
    """Context manager that owns servers and kills them on exit, error, SIGINT or SIGTERM."""

    def __init__(self):
        self.items = []

    def add(self, server):
        self.items.append(server)
        server.start()
        return server

    def stop_all(self):
        for s in self.items:
            try:
                s.stop()
            except Exception as e:  # keep stopping the others
                log("stopping %s: %s" % (s.name, e))

    def __enter__(self):
        def on_signal(signum, frame):
            raise KeyboardInterrupt("signal %d" % signum)
        self._old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
        # also when started in the background with SIGINT ignored
        self._old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        atexit.register(self.stop_all)
        return self

    def __exit__(self, *exc):
        self.stop_all()
        atexit.unregister(self.stop_all)
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def run(cmd, timeout, out_path=None, err_path=None, env=None):
    """Run a client tool in its own process group with stdin=/dev/null (`env`: extra variables);
    returns (rc, stdout bytes, stderr bytes, seconds). rc is None on timeout (group killed)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, env=dict(clean_env(), **(env or {})))
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        rc = None
        err += ("\n<killed after %ss timeout>\n" % timeout).encode()
    dt = time.monotonic() - t0
    if out_path:
        with open(out_path, "wb") as f:
            f.write(out)
    if err_path:
        with open(err_path, "wb") as f:
            f.write(("$ %s\n" % shlex.join(cmd)).encode() + err)
    return rc, out, err, dt


# ggml RPC command ids (rpc-proto/src/command.rs) and their upstream names: 0-17 in both majors,
# 18-22 only in 8.0.0 (a 7.0.0 client never sends 18 or above).
COMMANDS = ["ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER", "BUFFER_CLEAR",
            "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
            "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR",
            "SET_TENSOR_2D", "GET_TENSOR_2D", "COMM_INIT", "COMM_ALLREDUCE", "COMM_FREE"]


class FrameCounter:
    """Splits one connection's client-to-server bytes into `| cmd u8 | size u64 | payload |` frames
    and counts commands and their wire bytes (header included) per command name. `rewrite`, if
    given, gets each COMM_INIT payload (80 bytes) and returns the one to forward."""

    def __init__(self, into, rewrite=None):
        self.into = into  # name -> [count, bytes], shared by the proxy's connections
        self.head = b""
        self.left = 0  # payload bytes of the current frame still to come
        self.rewrite = rewrite
        self.hold = None  # a COMM_INIT payload being gathered for `rewrite`

    def feed(self, data):
        """Counts `data`; returns the bytes to forward (the same, but for rewritten COMM_INITs)."""
        out = bytearray()
        i = 0
        while i < len(data):
            if self.left:
                n = min(self.left, len(data) - i)
                (out if self.hold is None else self.hold).extend(data[i:i + n])
                self.left -= n
                i += n
                if not self.left and self.hold is not None:
                    out += self.rewrite(bytes(self.hold))
                    self.hold = None
                continue
            need = 9 - len(self.head)
            piece = data[i:i + need]
            self.head += piece
            out += piece
            i += len(piece)
            if len(self.head) == 9:
                cmd, size = self.head[0], int.from_bytes(self.head[1:9], "little")
                name = COMMANDS[cmd] if cmd < len(COMMANDS) else "UNKNOWN_%d" % cmd
                c = self.into.setdefault(name, [0, 0])
                c[0] += 1
                c[1] += 9 + size
                if name == "COMM_INIT" and size == 80 and self.rewrite:
                    self.hold = bytearray()
                self.head, self.left = b"", size
        return bytes(out)


def comm_init_behind_proxy(payload):
    """A COMM_INIT as the client would have sent it had it named the server behind a proxy: the
    stock client asks for rank 0's endpoint port + 1000, which is the proxy's, but a server's rank
    0 listens only on its own port + 1000 (as rpc-shim rewrites it, rpc-shim/src/comm.rs)."""
    port = int.from_bytes(payload[12:16], "little")
    target = CountingProxy.behind.get(port - COMM_OFFSET)
    if target is None:
        return payload
    return payload[:12] + (target + COMM_OFFSET).to_bytes(4, "little") + payload[16:]


class CountingProxy:
    """Threaded TCP proxy 127.0.0.1:port -> 127.0.0.1:target that counts bytes and connections
    (used to see e.g. that a warm server cache saves the big SET_TENSORs) and, per command name,
    the client's requests and their bytes (`commands`: name -> [count, bytes])."""

    # proxy port -> the port of the server behind it, for every proxy of this process
    behind = {}

    def __init__(self, target_port, exclude=(), port=0):  # port 0: any free one
        import threading
        self._threading = threading
        self.target_port = target_port
        self.lock = threading.Lock()
        self.up = self.down = self.conns = 0
        self.commands = {}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        CountingProxy.behind[self.port] = target_port
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def reset(self):
        with self.lock:
            self.up = self.down = self.conns = 0
            self.commands.clear()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                s.settimeout(None)
            except OSError:
                c.close()
                continue
            for x in (c, s):
                x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.conns += 1
            state = {"open": 2, "frames": FrameCounter(self.commands, rewrite=comm_init_behind_proxy)}
            self._threading.Thread(target=self._pump, args=(c, s, "up", state), daemon=True).start()
            self._threading.Thread(target=self._pump, args=(s, c, "down", state), daemon=True).start()

    def _pump(self, src, dst, attr, state):
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                with self.lock:
                    setattr(self, attr, getattr(self, attr) + len(data))
                    if attr == "up":
                        data = state["frames"].feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            with self.lock:
                state["open"] -= 1
                last = state["open"] == 0
            if last:
                src.close()
                dst.close()

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


# --- stock llama-completion through a proxy to our server (metrics_e2e.py, gguf_e2e.py) ---

def add_completion_args(ap):
    """The arguments of a test that runs stock llama-completion against our server."""
    ap.add_argument("--stock-bin")
    ap.add_argument("--ours")
    ap.add_argument("--model")


def resolve_completion(a):
    """(stock bin dir with llama-completion, our server binary, model path) from
    add_completion_args' arguments (defaults: $STOCK_BIN or scripts/stock-llama.sh,
    target/release/rpc-server, scripts/test-model.sh)."""
    stock = resolve_stock_bin(a.stock_bin, needed=("llama-completion",))
    ours = resolve_ours(a.ours)
    model = a.model or script_output("test-model.sh", timeout=900)
    return stock, ours, model


def completion_cmd(stock, model, prompt, n_predict, endpoint):
    """Greedy, seeded, single-threaded `llama-completion --rpc endpoint` of `n_predict` tokens."""
    return [os.path.join(stock, "llama-completion"), "-m", model, "-p", prompt, "-n", str(n_predict),
            "--temp", "0", "-s", "1", "-t", "1", "-ngl", "99", "-c", "512", "-no-cnv", "--simple-io",
            "--ignore-eos", "--rpc", endpoint]


class Checks:
    """Named pass/fail checks, each logged as `ok   name` or `FAIL name detail`."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            log("ok   %s" % name)
        else:
            self.failed += 1
            log("FAIL %s %s" % (name, detail))

    def summary(self):
        """Logs 'N passed, N failed'; returns the exit code (1 if any failed)."""
        log("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0
