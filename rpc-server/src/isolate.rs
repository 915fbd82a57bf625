//! Containment (the default; `--no-isolate` turns it off): each client session computes in a process of its own, so that a
//! request that gets past validation and trips a ggml kernel can read or write only its own
//! session's memory and end only its own process.
//!
//! The front process (the one listening) keeps the listener, admission, the HELLO deadline, the
//! server-wide memory account, the RDMA queue-pair budget and the counters. It answers a TCP
//! client's HELLO and the device queries after it itself (`connection::serve_queries`, reading no
//! further than each request); at the first other command it starts a fresh session process (the
//! same executable with `--session-child`; never `fork()`, which is unsafe after a GPU backend
//! started) and hands it the socket as its stdin and the command's header as
//! `--session-pending`. A client that offers RDMA is handed over as soon as its HELLO is in (and
//! it has a slot): the session process answers the HELLO, since the queue pair is its own. Either
//! way the session process serves the client directly, so the per-token path crosses no extra
//! hop. Its stdout is a Unix socket back to the
//! front, carrying a small line protocol:
//!
//! | from | line | meaning |
//! |---|---|---|
//! | session | `R <bytes>` | may I hold `bytes` more? answered `Y` or `N` |
//! | session | `F <bytes>` | I freed `bytes` |
//! | session | `S <n> <n> ...` | counters since the last `S` (the order of [`counters`]) |
//! | session | `C <hex>` | COMM_INIT (its 80 bytes): set up the link to the peer server for me |
//! | front | `K` + a socket (`SCM_RIGHTS`) / `E` | the link's connected socket / no link |
//! | front | `Q` | the server is shutting down: finish the running command and exit |
//!
//! A session process may not open sockets (its sandbox), so the front sets up 8.0's
//! server-to-server link (`comm.rs`, with the connection's address and `--allow`) and passes the
//! connected socket down; the session process does the exchange on it directly.
//!
//! When the session process ends, however it ends, the front gives back whatever it held in the
//! memory account and its RDMA place; a process killed by a signal is logged and counted as a
//! connection closed with an error. The front then serves on.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rpc_proto::Limits;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::connection::{ConnectionContext, ConnectionError, ConnectionOptions};
use crate::rdma::{Fallback, RdmaConfig, TransportMode};
use crate::session::{MemoryBudget, SessionConfig, Upstream};
use crate::stats::Stats;

/// How a front process starts session processes.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The server executable (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    /// The arguments the server was started with (devices, threads, limits, cache, RDMA
    /// options): a session process configures itself from the same flags.
    pub args: Vec<OsString>,
}

/// How long a session process whose front is gone may take to finish its running command.
const FRONT_GONE_GRACE: Duration = Duration::from_secs(1);

/// Every counter a session process reports, in one order for both processes (`budget`: the
/// front's server-wide account, or the session's own, whose refusals are the ones the front did
/// not see).
pub fn counters<'a>(
    stats: &'a Stats,
    rdma: &'a RdmaConfig,
    config: &'a SessionConfig,
    budget: &'a MemoryBudget,
) -> Vec<&'a AtomicU64> {
    let mut v: Vec<&AtomicU64> = stats.counters().chain(rdma.counters()).collect();
    v.push(budget.refused_counter());
    if let Some(c) = &config.cache {
        v.extend(c.counters().counters());
    }
    if let Some(l) = &config.local {
        v.extend(l.counters().counters());
    }
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `N` bytes from a hex argument (`--session-child`'s HELLO caps, `--session-pending`'s header).
pub fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    for (i, c) in out.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Whether a client's HELLO offers RDMA this server may engage: its session process must then
/// answer the HELLO (the queue pair is that process's); a TCP client's HELLO the front answers.
pub fn offers_rdma(rdma: &RdmaConfig, caps: &[u8; rpc_proto::CONN_CAPS_SIZE]) -> bool {
    caps.iter().any(|&b| b != 0) && rdma.mode != TransportMode::Tcp
}

fn child_error(what: String) -> ConnectionError {
    ConnectionError::Io(std::io::Error::other(what))
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 | 10 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        31 | 12 => "SIGSYS",
        _ => "signal",
    }
}

/// Front side: starts a session process for a connection which holds a slot, then serves its
/// control line until it ends. Either the client's HELLO (`caps`) has been read and the session
/// process answers it, or (`pending`) the front answered it and the queries after it, and read
/// the header of the first other command, which the session process then serves first.
pub async fn hand_off(
    iso: &Isolation,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    caps: &[u8; rpc_proto::CONN_CAPS_SIZE],
    pending: Option<&[u8; rpc_proto::FRAME_HEADER_SIZE]>,
    ctx: &ConnectionContext,
) -> Result<(), ConnectionError> {
    let (budget, rdma, stats, config) = (&ctx.conn.budget, &*ctx.rdma, &*ctx.stats, &*ctx.config);
    let mut shutdown = ctx.shutdown.clone();
    // The queue-pair budget is the front's: a session process may engage RDMA only with one of
    // its places, held until the process ends.
    let offers_rdma = pending.is_none() && offers_rdma(rdma, caps);
    let rdma_place = if offers_rdma {
        let p = rdma.try_permit();
        if p.is_none() {
            tracing::info!(
                max = rdma.max_connections,
                "RDMA connection budget used up; this client stays on TCP"
            );
            rdma.fallback(Fallback::Budget);
        }
        p
    } else {
        None
    };
    let (front_end, child_end) = UnixStream::pair()?;
    let comm = crate::comm::TcpConnector {
        bind_ip: stream.local_addr()?.ip(),
        allow: ctx.conn.allow.clone(),
        setup_timeout: crate::comm::SETUP_TIMEOUT,
        io_timeout: ctx.conn.request_timeout,
    };
    let mut cmd = Command::new(&iso.exe);
    cmd.args(&iso.args)
        .arg("--session-child")
        .arg(hex(caps))
        .arg("--session-peer")
        .arg(peer.to_string())
        .arg("--session-major")
        .arg(ctx.major.number().to_string());
    if rdma_place.is_none() {
        cmd.arg("--session-tcp-only");
    }
    if let Some(h) = pending {
        cmd.arg("--session-pending").arg(hex(h));
    }
    cmd.stdin(Stdio::from(OwnedFd::from(stream)))
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C at the terminal reaches the front, which shuts the
        // sessions down in order (`Q`), not every session process at once.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| child_error(format!("cannot start a session process: {e}")))?;
    drop(cmd); // the parent's copies of the socket and of the session's end of the control line
    let pid = child.id();
    tracing::debug!(%peer, pid, "session process started");

    let held = serve_control(front_end, budget, stats, rdma, config, &comm, &mut shutdown).await;
    budget.release(held);
    drop(rdma_place);
    // The control line closed: the process has ended or is about to.
    let status = child.wait()?;
    match (status.code(), status.signal()) {
        (Some(0), _) => Ok(()),
        (Some(code), _) => Err(child_error(format!(
            "session process {pid} exited with status {code}"
        ))),
        (None, Some(sig)) => {
            tracing::warn!(
                %peer,
                pid,
                signal = sig,
                "session process killed by {} ({sig}); its memory is freed, other sessions are untouched",
                signal_name(sig)
            );
            Err(child_error(format!(
                "session process {pid} killed by {} ({sig})",
                signal_name(sig)
            )))
        }
        (None, None) => Err(child_error(format!(
            "session process {pid} ended: {status}"
        ))),
    }
}

/// Serves a session process's control line until it closes; returns the bytes it still held.
async fn serve_control(
    front_end: UnixStream,
    budget: &Arc<MemoryBudget>,
    stats: &Stats,
    rdma: &RdmaConfig,
    config: &SessionConfig,
    comm: &crate::comm::TcpConnector,
    shutdown: &mut watch::Receiver<bool>,
) -> u64 {
    let mut held = 0u64;
    let line = match front_end
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(front_end))
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch a session process");
            return held;
        }
    };
    let (rd, mut wr) = line.into_split();
    let mut lines = tokio::io::BufReader::new(rd).lines();
    let counters = counters(stats, rdma, config, budget);
    let mut stopping = false;
    loop {
        let l = tokio::select! {
            l = lines.next_line() => l,
            _ = shutdown.wait_for(|s| *s), if !stopping => {
                stopping = true;
                let _ = wr.write_all(b"Q\n").await;
                continue;
            }
        };
        let Ok(Some(l)) = l else { break };
        let mut words = l.split_ascii_whitespace();
        let reply: Option<&[u8]> = match (words.next(), words.next().map(str::parse::<u64>)) {
            (Some("R"), Some(Ok(n))) => {
                let ok = budget.try_reserve(held, n);
                if ok {
                    held += n;
                }
                Some(if ok { b"Y\n" } else { b"N\n" })
            }
            (Some("F"), Some(Ok(n))) => {
                let n = n.min(held);
                budget.release(n);
                held -= n;
                None
            }
            (Some("C"), _) => {
                let ok = match broker_link(&l, comm).await {
                    Ok(stream) => send_fd(&wr, b"K\n", &stream).await.is_ok(),
                    Err(e) => {
                        tracing::warn!("COMM_INIT of a session process: no link ({e})");
                        wr.write_all(b"E\n").await.is_ok()
                    }
                };
                if !ok {
                    break;
                }
                None
            }
            (Some("S"), Some(Ok(first))) => {
                let rest = words.map(|w| w.parse::<u64>().unwrap_or(0));
                for (c, v) in counters.iter().zip(std::iter::once(first).chain(rest)) {
                    c.fetch_add(v, Relaxed);
                }
                None
            }
            _ => {
                tracing::warn!("unexpected line from a session process: {l:?}");
                None
            }
        };
        if let Some(r) = reply {
            if wr.write_all(r).await.is_err() {
                break;
            }
        }
    }
    held
}

/// Front side of a session's `C` line: the COMM_INIT it carries, set up with the front's
/// connector (the connection's address, `--allow`, deadlines) off the runtime's thread.
async fn broker_link(
    line: &str,
    comm: &crate::comm::TcpConnector,
) -> std::io::Result<std::net::TcpStream> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let hex = line
        .strip_prefix("C ")
        .ok_or_else(|| bad("malformed C line"))?;
    let bytes: [u8; rpc_proto::COMM_INIT_SIZE] =
        parse_hex(hex.trim()).ok_or_else(|| bad("malformed COMM_INIT"))?;
    let req = rpc_proto::Request::decode(
        rpc_proto::Major::V8,
        rpc_proto::Command::CommInit,
        &bytes,
        &Limits::default(),
    )
    .map_err(|e| bad(&e.to_string()))?;
    let rpc_proto::Request::CommInit(init) = req else {
        return Err(bad("not a COMM_INIT"));
    };
    let comm = comm.clone();
    tokio::task::spawn_blocking(move || comm.establish(&init))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

/// Sends `msg` with `stream`'s descriptor attached (`SCM_RIGHTS`).
async fn send_fd(
    wr: &tokio::net::unix::OwnedWriteHalf,
    msg: &[u8],
    stream: &std::net::TcpStream,
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let sock: &tokio::net::UnixStream = wr.as_ref();
    loop {
        sock.writable().await?;
        let fds = [stream.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg(
                sock,
                &[std::io::IoSlice::new(msg)],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(std::io::Error::from)
        });
        match r {
            Ok(n) if n == msg.len() => return Ok(()),
            Ok(_) => return Err(std::io::Error::other("short control write")),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Session side of the control line: memory reservations asked of the front, and links.
struct Front {
    wr: Mutex<UnixStream>,
    replies: Mutex<mpsc::Receiver<bool>>,
    /// Answers to `C` lines: the link's socket, or `None` (`E`).
    links: Mutex<mpsc::Receiver<Option<OwnedFd>>>,
}

/// COMM_INIT in a session process: the front sets the link up (a sandboxed process opens no
/// socket) and passes its socket down; the exchange then runs here.
#[derive(Debug)]
struct FrontConnector {
    front: Arc<Front>,
    io_timeout: Duration,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Front")
    }
}

impl crate::comm::Connector for FrontConnector {
    fn connect(
        &self,
        init: &rpc_proto::CommInit,
    ) -> std::io::Result<Box<dyn crate::comm::PeerLink>> {
        let links = self
            .front
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut bytes = Vec::new();
        rpc_proto::Request::CommInit(*init).encode_payload(&mut bytes);
        if !self.front.send(&format!("C {}\n", hex(&bytes))) {
            return Err(std::io::Error::other("the front is gone"));
        }
        // The front waits up to SETUP_TIMEOUT for the peer; a little more here.
        let wait = crate::comm::SETUP_TIMEOUT + Duration::from_secs(5);
        match links.recv_timeout(wait) {
            Ok(Some(fd)) => {
                crate::comm::link(std::net::TcpStream::from(fd), init.rank, self.io_timeout)
            }
            Ok(None) => Err(std::io::Error::other("the front could not set up the link")),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the front",
            )),
        }
    }
}

/// Reads the front's lines, with the descriptors sent along (`SCM_RIGHTS`), until the line
/// closes: `on_line` gets each line and, for a `K`, the descriptor that came with it.
fn read_front_lines(sock: UnixStream, mut on_line: impl FnMut(&str, Option<OwnedFd>)) {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut fds: std::collections::VecDeque<OwnedFd> = Default::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = match recvmsg(
            &sock,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) if r.bytes == 0 => return,
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        pending.extend_from_slice(buf.get(..n).unwrap_or(&[]));
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(line.get(..end).unwrap_or(&[]));
            let fd = if text == "K" { fds.pop_front() } else { None };
            on_line(&text, fd);
        }
    }
}

impl Front {
    fn send(&self, line: &str) -> bool {
        let mut w = self.wr.lock().unwrap_or_else(PoisonError::into_inner);
        w.write_all(line.as_bytes()).is_ok()
    }
}

impl Upstream for Front {
    fn reserve(&self, n: u64) -> bool {
        // One question at a time: the lock is held until its answer.
        let replies = self.replies.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.send(&format!("R {n}\n")) {
            return false;
        }
        replies
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or(false)
    }

    fn release(&self, n: u64) {
        self.send(&format!("F {n}\n"));
    }
}

/// Sends the counters that changed since the last report as one `S` line.
struct Reporter {
    last: Vec<u64>,
}

impl Reporter {
    fn report(&mut self, counters: &[&AtomicU64], front: &Front) {
        let now: Vec<u64> = counters.iter().map(|c| c.load(Relaxed)).collect();
        if now == self.last {
            return;
        }
        let mut line = String::from("S");
        for (n, l) in now.iter().zip(&self.last) {
            line.push_str(&format!(" {}", n.wrapping_sub(*l)));
        }
        line.push('\n');
        if front.send(&line) {
            self.last = now;
        }
    }
}

/// Everything a session process needs, from the flags it was started with.
pub struct Child {
    pub caps: [u8; rpc_proto::CONN_CAPS_SIZE],
    /// The header of the first command, when the front answered the HELLO (`--session-pending`).
    pub pending: Option<[u8; rpc_proto::FRAME_HEADER_SIZE]>,
    pub peer: String,
    pub config: Arc<SessionConfig>,
    /// The protocol major of the listener the client came in on (`--session-major`).
    pub major: rpc_proto::Major,
    pub limits: Limits,
    pub rdma: Arc<RdmaConfig>,
    pub conn: ConnectionOptions,
    /// Apply the sandbox (`sandbox.rs`) before the first command (unless
    /// `--no-sandbox`).
    pub sandbox: bool,
}

/// Sandbox step 1 (`sandbox.rs`) where there is one: file rules and rlimits. A failure is logged
/// and the session goes on in its own process.
fn restrict_files(budget: u64, cache_dir: Option<&std::path::Path>) {
    #[cfg(target_os = "linux")]
    match crate::sandbox::restrict_files(budget, cache_dir) {
        Ok(landlock) => tracing::debug!(landlock, "file rules and rlimits applied"),
        Err(e) => tracing::warn!("session files not sandboxed: {e}"),
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (budget, cache_dir);
        tracing::debug!("no file rules before the transport is up on this OS (macOS: the profile comes with step 2)");
    }
}

/// Sandbox step 2 (if `on`), once the transport is up: the system-call filter on Linux, the
/// Seatbelt profile on macOS (`sandbox_mac.rs`); then the self-test when
/// `RPC_SANDBOX_SELFTEST=1`.
fn restrict_syscalls(on: bool, cache_dir: Option<&std::path::Path>) {
    if on {
        #[cfg(target_os = "linux")]
        match crate::sandbox::restrict_syscalls() {
            Ok(()) => tracing::debug!("system-call filter applied"),
            Err(e) => tracing::warn!("session system calls not filtered: {e}"),
        }
        #[cfg(target_os = "macos")]
        {
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            match crate::sandbox_mac::apply(home.as_deref(), cache_dir) {
                Ok(()) => tracing::debug!("sandbox profile applied"),
                Err(e) => tracing::warn!("session not sandboxed: {e}"),
            }
        }
    }
    if std::env::var_os("RPC_SANDBOX_SELFTEST").is_some_and(|v| v == "1") {
        self_test(cache_dir);
    }
}

/// `RPC_SANDBOX_SELFTEST=1`: tries what the sandbox forbids and logs each outcome as
/// `sandbox self-test: <action>: denied (<error>)` or `...: ALLOWED` (`tests/tests/isolate.rs`
/// asserts on those lines).
fn self_test(cache_dir: Option<&std::path::Path>) {
    fn report<T>(what: &str, r: std::io::Result<T>) {
        match r {
            Ok(_) => tracing::warn!("sandbox self-test: {what}: ALLOWED"),
            Err(e) => tracing::info!("sandbox self-test: {what}: denied ({e})"),
        }
    }
    #[cfg(target_os = "linux")]
    report(
        "open /etc/hostname",
        std::fs::read("/etc/hostname").or_else(|_| std::fs::read("/etc/passwd")),
    );
    if let Some(home) = std::env::var_os("HOME") {
        report(
            "read a file in the home directory",
            std::fs::read(std::path::Path::new(&home).join(".rpc-sandbox-probe")),
        );
    }
    report(
        "create a file in /tmp",
        std::fs::write(format!("/tmp/rpc-sandbox-{}", std::process::id()), b"x"),
    );
    report(
        "open a TCP connection",
        std::net::TcpStream::connect("127.0.0.1:9"),
    );
    report(
        "listen on a port",
        std::net::TcpListener::bind("127.0.0.1:0"),
    );
    report(
        "start /bin/true",
        std::process::Command::new("/bin/true").status(),
    );
    if let Some(d) = cache_dir {
        let p = d.join(format!(".sandbox-selftest-{}", std::process::id()));
        let r = std::fs::write(&p, b"ok").and_then(|()| std::fs::read(&p));
        let _ = std::fs::remove_file(&p);
        match r {
            Ok(_) => tracing::info!("sandbox self-test: write and read the cache: allowed"),
            Err(e) => {
                tracing::warn!("sandbox self-test: write and read the cache: DENIED ({e})")
            }
        }
    }
}

/// Session side: serves the client on stdin (a socket) after its HELLO, reporting to the front
/// on stdout (a Unix socket). Returns the process's exit status.
pub fn child_main(c: Child) -> i32 {
    let span = tracing::info_span!("session", peer = %c.peer, pid = std::process::id());
    let _enter = span.enter();
    crate::ggml::abort::abort_on_assertions();
    let cache_dir = c.config.cache.as_ref().map(|w| w.dir().to_path_buf());
    let per_connection = c.conn.budget.limits().per_connection;
    if c.sandbox {
        // The verbs library and its device providers are loaded now, under the credentials the
        // queue pair will be used with (see `sandbox.rs`).
        if c.rdma.mode != TransportMode::Tcp && rdma_verbs::load().is_ok() {
            let _ = rdma_verbs::devices();
        }
        restrict_files(per_connection, cache_dir.as_deref());
    }
    let taken = (|| -> std::io::Result<(std::net::TcpStream, UnixStream)> {
        let sock = std::io::stdin().as_fd().try_clone_to_owned()?;
        let ctl = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok((std::net::TcpStream::from(sock), UnixStream::from(ctl)))
    })();
    let (stream, ctl) = match taken {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "session process started without its socket and control line");
            return 2;
        }
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let (reply_tx, reply_rx) = mpsc::channel();
    let reader = match ctl.try_clone() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the control line");
            return 2;
        }
    };
    // Replies and the front's stop. The end of the line means the front is gone (a front that
    // shuts down sends `Q` and keeps the line open until the session ends): the session stops,
    // and if its command does not finish within FRONT_GONE_GRACE (a long compute), the process
    // ends without it; no session outlives its server.
    // Set when the session ends: read by the front-gone watcher below and by the reporter.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished_seen = done.clone();
    let (link_tx, link_rx) = mpsc::channel();
    std::thread::spawn(move || {
        read_front_lines(reader, |line, fd| match line {
            "Y" => {
                let _ = reply_tx.send(true);
            }
            "N" => {
                let _ = reply_tx.send(false);
            }
            "K" => {
                let _ = link_tx.send(fd);
            }
            "E" => {
                let _ = link_tx.send(None);
            }
            "Q" => {
                let _ = stop_tx.send(true);
            }
            _ => {}
        });
        let _ = stop_tx.send(true);
        let t = std::time::Instant::now();
        while !finished_seen.load(Relaxed) {
            if t.elapsed() >= FRONT_GONE_GRACE {
                tracing::warn!("the server's front process is gone; ending this session now");
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let front = Arc::new(Front {
        wr: Mutex::new(ctl),
        replies: Mutex::new(reply_rx),
        links: Mutex::new(link_rx),
    });
    let limits = c.conn.budget.limits();
    let budget = Arc::new(MemoryBudget::with_upstream(
        crate::session::MemoryLimits {
            per_connection: limits.per_connection,
            // The server-wide limit is the front's to enforce.
            total: u64::MAX,
        },
        Box::new(ArcFront(front.clone())),
    ));
    let comm = Arc::new(FrontConnector {
        front: front.clone(),
        io_timeout: c.conn.request_timeout,
    });
    let conn = ConnectionOptions {
        budget,
        comm: Some(comm),
        ..c.conn
    };
    let stats = Arc::new(Stats::default());
    let reporter = {
        let (stats, rdma, config, front, done, budget) = (
            stats.clone(),
            c.rdma.clone(),
            c.config.clone(),
            front.clone(),
            done.clone(),
            conn.budget.clone(),
        );
        std::thread::spawn(move || {
            let counters = counters(&stats, &rdma, &config, &budget);
            let mut r = Reporter {
                last: vec![0; counters.len()],
            };
            while !done.load(Relaxed) {
                std::thread::park_timeout(Duration::from_millis(250));
                r.report(&counters, &front);
            }
            r.report(&counters, &front);
        })
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the session's runtime");
            return 2;
        }
    };
    let local_ip = match stream.local_addr() {
        Ok(a) => a.ip(),
        Err(e) => {
            tracing::error!(error = %e, "cannot use the client's socket");
            return 2;
        }
    };
    let tcp =
        rpc_transport::BlockingTcpTransport::new(stream, Some(stop_rx.clone()), conn.poll_window)
            .and_then(|mut t| match &c.pending {
                Some(h) => t.preload(h).map(|()| t),
                None => Ok(t),
            });
    let tcp = match tcp {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the client's socket");
            return 2;
        }
    };
    let sandbox = c.sandbox;
    let ctx = ConnectionContext {
        config: c.config.clone(),
        major: c.major,
        limits: c.limits,
        stats: stats.clone(),
        rdma: c.rdma.clone(),
        conn,
        shutdown: stop_rx,
    };
    let ready = move || restrict_syscalls(sandbox, cache_dir.as_deref());
    let r = match c.pending {
        // The front answered the HELLO: the session starts at the command it read.
        Some(_) => rt.block_on(crate::connection::serve_commands(tcp, ctx, ready)),
        None => rt.block_on(crate::connection::serve_hello(
            tcp, local_ip, c.caps, ctx, ready,
        )),
    };
    done.store(true, Relaxed);
    reporter.thread().unpark();
    let _ = reporter.join();
    match r {
        Ok(()) => {
            tracing::info!("client connection closed");
            0
        }
        Err(e) => {
            tracing::error!("closing connection: {e}");
            1
        }
    }
}

/// [`Upstream`] over a shared [`Front`] (the reporter thread shares the line).
struct ArcFront(Arc<Front>);

impl Upstream for ArcFront {
    fn reserve(&self, n: u64) -> bool {
        self.0.reserve(n)
    }

    fn release(&self, n: u64) {
        self.0.release(n)
    }
}

/// One line for the banner.
pub fn describe_mode(iso: Option<&Isolation>) -> &'static str {
    match iso {
        Some(_) => "a process of its own per session (--no-isolate: all in this one)",
        None => "all in this process (--no-isolate): no containment",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_round_trip_through_hex() {
        let mut caps = [0u8; rpc_proto::CONN_CAPS_SIZE];
        for (i, b) in caps.iter_mut().enumerate() {
            *b = (i * 37) as u8;
        }
        assert_eq!(parse_hex(&hex(&caps)), Some(caps));
        assert_eq!(parse_hex::<24>("00"), None);
        assert_eq!(parse_hex::<24>(&"zz".repeat(24)), None);
        assert_eq!(parse_hex::<24>(&"é".repeat(24)), None);
    }
}
