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
//! hop. Its stdout is a Unix socket back to the front, carrying the control line of
//! `control.rs` (typed messages, bounded lines, a rate bound; anything malformed ends the
//! session: the front kills its process and logs why):
//!
//! | from | line | meaning |
//! |---|---|---|
//! | session | `R <bytes>` | may I hold `bytes` more? answered `Y` or `N` |
//! | session | `F <bytes>` | I freed `bytes` |
//! | session | `S <n> <n> ...` | counters since the last `S` (the order of [`counters`]; clamped, `control::StatsGate`) |
//! | session | `C <hex>` | COMM_INIT (its 80 bytes): set up the link to the peer server for me |
//! | session | `W <bytes>` | an upload for the weight cache: a staging file of `bytes`, please |
//! | session | `D` | the staging file holds the upload |
//! | session | `V <hash>` | I hashed the cache entry `hash`: check it (record it as verified, or delete it) |
//! | front | `K` + a socket (`SCM_RIGHTS`) / `E` | the link's connected socket / no link |
//! | front | `M` + a memfd (`SCM_RIGHTS`) / `X` | the staging file / no store |
//! | front | `Q` | the server is shutting down: finish the running command and exit |
//!
//! Only the front writes the weight cache. A session's upload with the cache flag goes into a
//! memfd the front created, sized and sealed against growing and shrinking, charged to the
//! session's memory account while it lives; the session writes it with `pwrite` and says `D`;
//! the front seals it against writes (a store whose seal fails is refused), hashes the sealed
//! bytes itself off the runtime's thread and stores them under the hash it computed
//! (`WeightCache::store_file`). One store or check is in flight per session. A session's
//! verified or corrupt entry is a `V`: the front hashes the file again before it records or
//! deletes anything (`WeightCache::check_entry`). The session's stderr is a pipe the front reads
//! (bounded lines and bytes per second) and logs through `tracing`, tagged with the session.
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
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rpc_proto::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::connection::{ConnectionContext, ConnectionError, ConnectionOptions};
use crate::control::{ControlError, Inbound, LineSplitter, StatsGate, ToFront, ToSession};
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

/// The exit status of a session process refused because its containment could not be set up.
pub const SANDBOX_REFUSED: i32 = 70;

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
    let (budget, rdma) = (&ctx.conn.budget, &*ctx.rdma);
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
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal reaches the front, which shuts the
        // sessions down in order (`Q`), not every session process at once.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| child_error(format!("cannot start a session process: {e}")))?;
    drop(cmd); // the parent's copies of the socket and of the session's end of the control line
    let pid = child.id();
    tracing::debug!(%peer, pid, "session process started");
    if let Some(err) = child.stderr.take() {
        relay_stderr(err, peer, pid);
    }

    let held = serve_control(front_end, ctx, peer, pid, &comm, &mut shutdown).await;
    budget.release(held);
    drop(rdma_place);
    // The control line closed: the process has ended or is about to.
    let status = child.wait()?;
    // A contained session's inner process is mirrored by its outer one: a signal `n` as the
    // exit status 128 + n (`namespaces::run_outer`).
    let signal = status.signal().or(status
        .code()
        .filter(|c| (129..160).contains(c))
        .map(|c| c - 128));
    match (status.code(), signal) {
        (Some(0), _) => Ok(()),
        (Some(SANDBOX_REFUSED), _) => Err(child_error(format!(
            "session process {pid} refused: its containment could not be set up (see its log)"
        ))),
        (Some(code), None) => Err(child_error(format!(
            "session process {pid} exited with status {code}"
        ))),
        (_, Some(sig)) => {
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
/// A message the front cannot accept (`control.rs`: malformed, unknown, over-long, out of
/// order, too many) ends the session: its process is killed and the reason logged.
async fn serve_control(
    front_end: UnixStream,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    pid: u32,
    comm: &crate::comm::TcpConnector,
    shutdown: &mut watch::Receiver<bool>,
) -> u64 {
    let (budget, stats, rdma, config) = (&ctx.conn.budget, &*ctx.stats, &*ctx.rdma, &ctx.config);
    let line = match front_end
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixStream::from_std(front_end))
    {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch a session process");
            return 0;
        }
    };
    let (mut rd, mut wr) = line.into_split();
    let counters = counters(stats, rdma, config, budget);
    let start = Instant::now();
    let mut inbound = Inbound::new(start);
    let mut gate = StatsGate::new(counters.len(), start);
    let mut lines = LineSplitter::default();
    let mut chunk = [0u8; 4096];
    // Reservations the session holds; bytes charged for its store (staging file) in progress.
    let (mut held, mut store_charge) = (0u64, 0u64);
    let mut staging: Option<std::fs::File> = None;
    // The store or check running off the runtime's thread (one per session): it sends its
    // charge back when done.
    let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let mut job_running = false;
    let mut clamp_noted = false;
    let mut stopping = false;
    // The cache this process writes (checks: always; stores: not with --trusted-weights-only).
    let cache = config.cache.as_ref().filter(|c| c.writes());
    let stores = cache.filter(|c| c.seeded_before().is_none());
    let violation: Option<ControlError> = 'serve: loop {
        while let Some(l) = lines.next_line() {
            let msg = match l.and_then(|l| inbound.message(&l, Instant::now())) {
                Ok(m) => m,
                Err(e) => break 'serve Some(e),
            };
            // W and V wait for the job in flight: one per session.
            if matches!(msg, ToFront::Store(_) | ToFront::Check(_)) && job_running {
                if let Some(n) = job_rx.recv().await {
                    budget.release(n);
                    store_charge -= n;
                }
                job_running = false;
            }
            let reply = match msg {
                ToFront::Reserve(n) => {
                    let ok = budget.try_reserve(held + store_charge, n);
                    if ok {
                        held += n;
                    }
                    Some(if ok { ToSession::Yes } else { ToSession::No })
                }
                ToFront::Free(n) => {
                    let n = n.min(held);
                    budget.release(n);
                    held -= n;
                    None
                }
                ToFront::Stats(v) => match gate.admit(&v, Instant::now()) {
                    Ok((v, clamped)) => {
                        for (c, d) in counters.iter().zip(v) {
                            c.fetch_add(d, Relaxed);
                        }
                        if clamped && !clamp_noted {
                            clamp_noted = true;
                            tracing::warn!(%peer, pid, "a session process reported counters faster than possible; clamped");
                        }
                        None
                    }
                    Err(e) => break 'serve Some(e),
                },
                ToFront::CommInit(bytes) => match broker_link(&bytes, comm).await {
                    Ok(stream) => {
                        if send_fd(&wr, ToSession::Link.encode(), &stream)
                            .await
                            .is_err()
                        {
                            break 'serve None;
                        }
                        None
                    }
                    Err(e) => {
                        tracing::warn!("COMM_INIT of a session process: no link ({e})");
                        Some(ToSession::NoLink)
                    }
                },
                ToFront::Store(n) => {
                    if staging.is_some() {
                        break 'serve Some(ControlError::OutOfOrder("W before the last D"));
                    }
                    let file = stores
                        .filter(|_| n > 0)
                        .filter(|_| budget.try_reserve(held + store_charge, n))
                        .map(|c| {
                            c.staging_file(n).inspect_err(|e| {
                                budget.release(n);
                                tracing::warn!(error = %e, "cannot make a staging file for a cache store");
                            })
                        });
                    match file {
                        Some(Ok(f)) => {
                            if send_fd(&wr, ToSession::Staging.encode(), &f).await.is_err() {
                                budget.release(n);
                                break 'serve None;
                            }
                            store_charge += n;
                            staging = Some(f);
                            None
                        }
                        _ => Some(ToSession::NoStaging),
                    }
                }
                ToFront::Stored => {
                    let Some(file) = staging.take() else {
                        break 'serve Some(ControlError::OutOfOrder("D without W"));
                    };
                    let n = file.metadata().map_or(0, |m| m.len()).min(store_charge);
                    match crate::cache::WeightCache::seal_staging(&file) {
                        Err(e) => {
                            tracing::warn!(%peer, pid, error = %e, "a session's cache store refused: its staging file cannot be sealed");
                            budget.release(store_charge);
                            store_charge = 0;
                        }
                        Ok(()) => {
                            let (config, tx) = (config.clone(), job_tx.clone());
                            let charge = store_charge;
                            job_running = true;
                            tokio::task::spawn_blocking(move || {
                                if let Some(c) = &config.cache {
                                    c.store_file(&file, n);
                                }
                                drop(file);
                                let _ = tx.send(charge);
                            });
                        }
                    }
                    None
                }
                ToFront::Check(hash) => {
                    if cache.is_some() {
                        let (config, tx) = (config.clone(), job_tx.clone());
                        job_running = true;
                        tokio::task::spawn_blocking(move || {
                            if let Some(c) = &config.cache {
                                let r = c.check_entry(hash);
                                tracing::debug!(
                                    hash = format!("{hash:016x}"),
                                    ?r,
                                    "cache entry checked for a session"
                                );
                            }
                            let _ = tx.send(0);
                        });
                    }
                    None
                }
            };
            if let Some(r) = reply {
                if wr.write_all(r.encode()).await.is_err() {
                    break 'serve None;
                }
            }
        }
        tokio::select! {
            n = rd.read(&mut chunk) => match n {
                Ok(0) | Err(_) => break None,
                Ok(n) => lines.push(chunk.get(..n).unwrap_or(&[])),
            },
            _ = shutdown.wait_for(|s| *s), if !stopping => {
                stopping = true;
                let _ = wr.write_all(ToSession::Quit.encode()).await;
            }
            Some(n) = job_rx.recv(), if job_running => {
                budget.release(n);
                store_charge -= n;
                job_running = false;
            }
        }
    };
    if let Some(why) = violation {
        tracing::warn!(%peer, pid, "session process killed: {why} on its control line");
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    drop(staging);
    if job_running {
        if let Some(n) = job_rx.recv().await {
            budget.release(n);
            store_charge -= n;
        }
    }
    held + store_charge
}

/// Longest line of a session's stderr the front logs (the rest of it is dropped).
const STDERR_LINE: usize = 2048;
/// Bytes per second of a session's stderr the front logs, and its burst; the excess is dropped
/// and counted.
const STDERR_RATE: f64 = 16.0 * 1024.0;
const STDERR_BURST: f64 = 64.0 * 1024.0;

/// The session's stderr, read by the front on a thread of its own and logged through
/// `tracing`, tagged with the session: bounded lines, bounded bytes per second (a count of what
/// was dropped is logged), control characters (terminal escapes) replaced.
fn relay_stderr(err: std::process::ChildStderr, peer: SocketAddr, pid: u32) {
    use std::io::Read;
    let spawned = std::thread::Builder::new()
        .name(format!("session-{pid}-stderr"))
        .spawn(move || {
            let mut err = err;
            let mut bucket =
                crate::control::TokenBucket::new(STDERR_RATE, STDERR_BURST, Instant::now());
            let mut line: Vec<u8> = Vec::with_capacity(STDERR_LINE);
            let mut truncated = false;
            let (mut dropped_lines, mut dropped_bytes) = (0u64, 0u64);
            let mut buf = [0u8; 4096];
            let mut emit = |line: &[u8], truncated: bool, dl: &mut u64, db: &mut u64| {
                if !bucket.take(line.len() as f64 + 1.0, Instant::now()) {
                    *dl += 1;
                    *db += line.len() as u64;
                    return;
                }
                if *dl > 0 {
                    tracing::warn!(session.peer = %peer, session.pid = pid, "{} lines ({} bytes) of this session's log dropped (over {} bytes/s)", *dl, *db, STDERR_RATE);
                    (*dl, *db) = (0, 0);
                }
                log_session_line(line, truncated, peer, pid);
            };
            loop {
                let n = match err.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                for &b in buf.get(..n).unwrap_or(&[]) {
                    if b == b'\n' {
                        emit(&line, truncated, &mut dropped_lines, &mut dropped_bytes);
                        line.clear();
                        truncated = false;
                    } else if line.len() < STDERR_LINE {
                        line.push(b);
                    } else {
                        truncated = true;
                    }
                }
            }
            if !line.is_empty() {
                emit(&line, truncated, &mut dropped_lines, &mut dropped_bytes);
            }
            if dropped_lines > 0 {
                tracing::warn!(session.peer = %peer, session.pid = pid, "{dropped_lines} lines ({dropped_bytes} bytes) of this session's log dropped (over {STDERR_RATE} bytes/s)");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot read a session's log");
    }
}

/// One line of a session's log, as the front logs it, at the level the session's line names.
fn log_session_line(raw: &[u8], truncated: bool, peer: SocketAddr, pid: u32) {
    let (level, clean) = tidy_session_line(raw, truncated);
    let has = |l: &str| level == Some(l);
    if has("ERROR") {
        tracing::error!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else if has("WARN") {
        tracing::warn!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else if has("DEBUG") || has("TRACE") {
        tracing::debug!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else {
        tracing::info!(session.peer = %peer, session.pid = pid, "session: {clean}");
    }
}

/// A line of a session's log made fit for the front's: escape sequences removed, other control
/// characters replaced, the session's own timestamp and level taken off (the level returned).
fn tidy_session_line(raw: &[u8], truncated: bool) -> (Option<&'static str>, String) {
    let text = String::from_utf8_lossy(raw);
    let mut clean = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; any other escape: the next character.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c.is_control() && c != '\t' {
            clean.push('?');
        } else {
            clean.push(c);
        }
    }
    if truncated {
        clean.push_str(" [...]");
    }
    // The session's own timestamp and level go (the front's line has both).
    let mut rest = clean.trim_start();
    let is_time =
        |w: &str| w.len() >= 20 && w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('T');
    if let Some((_, r)) = rest.split_once(' ').filter(|(w, _)| is_time(w)) {
        rest = r.trim_start();
    }
    let level = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
        .into_iter()
        .find(|l| rest.split_once(' ').is_some_and(|(w, _)| w == *l));
    if let Some(l) = level {
        rest = rest[l.len()..].trim_start();
    }
    (level, rest.to_string())
}

/// Front side of a session's `C` line: the COMM_INIT it carries, set up with the front's
/// connector (the connection's address, `--allow`, deadlines) off the runtime's thread.
async fn broker_link(
    bytes: &[u8; rpc_proto::COMM_INIT_SIZE],
    comm: &crate::comm::TcpConnector,
) -> std::io::Result<std::net::TcpStream> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let req = rpc_proto::Request::decode(
        rpc_proto::Major::V8,
        rpc_proto::Command::CommInit,
        bytes,
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

/// Sends `msg` with `fd` attached (`SCM_RIGHTS`).
async fn send_fd(
    wr: &tokio::net::unix::OwnedWriteHalf,
    msg: &[u8],
    fd: &impl AsFd,
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let sock: &tokio::net::UnixStream = wr.as_ref();
    loop {
        sock.writable().await?;
        let fds = [fd.as_fd()];
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

/// Session side of the control line: memory reservations asked of the front, links, and the
/// weight cache's writes.
struct Front {
    wr: Mutex<UnixStream>,
    replies: Mutex<mpsc::Receiver<bool>>,
    /// Answers to `C` lines: the link's socket, or `None` (`E`).
    links: Mutex<mpsc::Receiver<Option<OwnedFd>>>,
    /// Answers to `W` lines: the staging file, or `None` (`X`). Held for a whole store.
    staging: Mutex<mpsc::Receiver<Option<OwnedFd>>>,
}

/// Where the front's answers go, in a session process (`read_front_lines`' side of [`Front`]).
struct Answers {
    replies: mpsc::Sender<bool>,
    links: mpsc::Sender<Option<OwnedFd>>,
    staging: mpsc::Sender<Option<OwnedFd>>,
    stop: watch::Sender<bool>,
}

impl Front {
    fn new(ctl: UnixStream, stop: watch::Sender<bool>) -> (Front, Answers) {
        let (reply_tx, reply_rx) = mpsc::channel();
        let (link_tx, link_rx) = mpsc::channel();
        let (staging_tx, staging_rx) = mpsc::channel();
        (
            Front {
                wr: Mutex::new(ctl),
                replies: Mutex::new(reply_rx),
                links: Mutex::new(link_rx),
                staging: Mutex::new(staging_rx),
            },
            Answers {
                replies: reply_tx,
                links: link_tx,
                staging: staging_tx,
                stop,
            },
        )
    }

    /// A client's upload for the weight cache: written into a staging file the front created,
    /// which the front then hashes and stores.
    fn store(&self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let staging = self.staging.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.send(&ToFront::Store(data.len() as u64)) {
            return;
        }
        // The front answers once the store before this one is written (one per session).
        match staging.recv_timeout(Duration::from_secs(600)) {
            Ok(Some(fd)) => {
                let file = std::fs::File::from(fd);
                if let Err(e) = file.write_all_at(data, 0) {
                    tracing::warn!(error = %e, "cannot write an upload for the cache");
                }
                drop(file);
                self.send(&ToFront::Stored);
            }
            Ok(None) => tracing::debug!("the front stores no upload now"),
            Err(_) => tracing::warn!("no answer from the front to a cache store"),
        }
    }
}

impl Answers {
    fn deliver(&self, msg: ToSession, fd: Option<OwnedFd>) {
        match msg {
            ToSession::Yes => drop(self.replies.send(true)),
            ToSession::No => drop(self.replies.send(false)),
            ToSession::Link => drop(self.links.send(fd)),
            ToSession::NoLink => drop(self.links.send(None)),
            ToSession::Staging => drop(self.staging.send(fd)),
            ToSession::NoStaging => drop(self.staging.send(None)),
            ToSession::Quit => drop(self.stop.send(true)),
        }
    }
}

/// The weight cache's writer in a session process: the front.
struct FrontKeeper(Arc<Front>);

impl crate::cache::CacheKeeper for FrontKeeper {
    fn store(&self, data: &[u8]) {
        self.0.store(data);
    }

    fn check(&self, hash: u64) {
        self.0.send(&ToFront::Check(hash));
    }
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
        let Ok(bytes) = <[u8; rpc_proto::COMM_INIT_SIZE]>::try_from(bytes.as_slice()) else {
            return Err(std::io::Error::other("COMM_INIT of an unexpected size"));
        };
        if !self.front.send(&ToFront::CommInit(bytes)) {
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

/// Reads the front's messages, with the descriptors sent along (`SCM_RIGHTS`), until the line
/// closes (or carries something that is no message): `on_msg` gets each message and, for one
/// that carries a descriptor (`K`, `M`), the descriptor that came with it.
fn read_front_lines(sock: UnixStream, mut on_msg: impl FnMut(ToSession, Option<OwnedFd>)) {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut fds: std::collections::VecDeque<OwnedFd> = Default::default();
    let mut lines = LineSplitter::default();
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
        lines.push(buf.get(..n).unwrap_or(&[]));
        while let Some(line) = lines.next_line() {
            match line.and_then(|l| ToSession::decode(&l)) {
                Ok(msg) => {
                    let fd = if msg.carries_fd() {
                        fds.pop_front()
                    } else {
                        None
                    };
                    on_msg(msg, fd);
                }
                Err(e) => {
                    tracing::error!("the front sent something else than a message: {e}");
                    return;
                }
            }
        }
    }
}

impl Front {
    fn send(&self, msg: &ToFront) -> bool {
        let mut w = self.wr.lock().unwrap_or_else(PoisonError::into_inner);
        w.write_all(&msg.encode()).is_ok()
    }
}

impl Upstream for Front {
    fn reserve(&self, n: u64) -> bool {
        // One question at a time: the lock is held until its answer.
        let replies = self.replies.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.send(&ToFront::Reserve(n)) {
            return false;
        }
        replies
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or(false)
    }

    fn release(&self, n: u64) {
        self.send(&ToFront::Free(n));
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
        let deltas = now.iter().zip(&self.last).map(|(n, l)| n.wrapping_sub(*l));
        if front.send(&ToFront::Stats(deltas.collect())) {
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

/// The memory bound of a contained session (Linux: its address space, `sandbox::limit_memory`),
/// set once its budget is known, before the client's first byte. A session that cannot be
/// bounded is refused.
fn limit_memory(on: bool, budget: u64) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if on {
        match crate::sandbox::limit_memory(budget) {
            Ok(Some(n)) => tracing::debug!(bytes = n, "address space bounded"),
            Ok(None) => tracing::debug!("address space not bounded (no budget, or a GPU build)"),
            Err(e) => return Err(format!("cannot bound the session's memory: {e}")),
        }
    }
    let _ = (on, budget);
    Ok(())
}

/// Once the transport is up: the Seatbelt profile on macOS (`sandbox_mac.rs`; on Linux the
/// sandbox is in place since the process started, `namespaces.rs` and `sandbox.rs`); then the
/// self-test when `RPC_SANDBOX_SELFTEST=1`.
fn restrict_syscalls(on: bool, cache_dir: Option<&std::path::Path>) {
    #[cfg(target_os = "macos")]
    if on {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        match crate::sandbox_mac::apply(home.as_deref(), cache_dir) {
            Ok(()) => tracing::debug!("sandbox profile applied"),
            // Fail closed, as on Linux.
            Err(e) => {
                tracing::error!(
                    "session refused: its sandbox profile cannot be applied: {e} (--no-sandbox serves without it)"
                );
                std::process::exit(SANDBOX_REFUSED);
            }
        }
    }
    let _ = on;
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
        // Only the front writes the cache; sessions read it.
        let p = d.join(format!(".sandbox-selftest-{}", std::process::id()));
        report("write the cache", std::fs::write(&p, b"x"));
        match std::fs::read_dir(d) {
            Ok(_) => tracing::info!("sandbox self-test: list the cache: allowed"),
            Err(e) => tracing::warn!("sandbox self-test: list the cache: DENIED ({e})"),
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
    if let Err(e) = limit_memory(c.sandbox, per_connection) {
        tracing::error!("session refused: {e} (--no-sandbox serves without containment)");
        return SANDBOX_REFUSED;
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
    let (front, answers) = Front::new(ctl, stop_tx);
    std::thread::spawn(move || {
        read_front_lines(reader, |msg, fd| answers.deliver(msg, fd));
        let _ = answers.stop.send(true);
        let t = std::time::Instant::now();
        while !finished_seen.load(Relaxed) {
            if t.elapsed() >= FRONT_GONE_GRACE {
                tracing::warn!("the server's front process is gone; ending this session now");
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let front = Arc::new(front);
    if let Some(cache) = &c.config.cache {
        // Only the front writes the cache: this session's stores and checks go to it.
        cache.delegate(Box::new(FrontKeeper(front.clone())));
    }
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
    fn a_session_log_line_is_tidied_for_the_front() {
        let (level, text) = tidy_session_line(
            b"2026-12-02T13:07:02.219332Z  WARN session{pid=1}: x: hello \x1b[31mred\x1b[0m\x07 \x1b]0;title\x07end",
            false,
        );
        assert_eq!(level, Some("WARN"));
        assert_eq!(text, "session{pid=1}: x: hello red? 0;title?end");
        assert!(!text.contains('\u{1b}'));
        let (level, text) = tidy_session_line(b"plain \xff\r\n text", true);
        assert_eq!(level, None);
        assert_eq!(text, "plain \u{fffd}?? text [...]");
        assert_eq!(
            tidy_session_line(b"ERROR boom", false),
            (Some("ERROR"), "boom".into())
        );
    }

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

    /// A front for [`serve_control`] tests: a cache in `dir`, a budget of 1 MiB per session
    /// (and the shutdown switch, which must live).
    fn front_ctx(dir: &std::path::Path) -> (ConnectionContext, watch::Sender<bool>) {
        let (tx, shutdown) = watch::channel(false);
        let ctx = ConnectionContext {
            config: Arc::new(SessionConfig {
                devices: Vec::new(),
                n_threads: 1,
                cache: Some(crate::cache::WeightCache::open(dir, None).unwrap()),
                local: None,
            }),
            major: rpc_proto::Major::V8,
            limits: Limits::default(),
            stats: Arc::new(Stats::default()),
            rdma: Arc::new(RdmaConfig::new(TransportMode::Tcp, Default::default(), 1)),
            conn: ConnectionOptions {
                budget: Arc::new(MemoryBudget::new(crate::session::MemoryLimits {
                    per_connection: 1 << 20,
                    total: 1 << 30,
                })),
                ..Default::default()
            },
            shutdown,
        };
        (ctx, tx)
    }

    fn connector() -> crate::comm::TcpConnector {
        crate::comm::TcpConnector {
            bind_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            allow: Default::default(),
            setup_timeout: Duration::from_secs(1),
            io_timeout: Duration::from_secs(1),
        }
    }

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("rpc-isolate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Runs [`serve_control`] for a stand-in session process (`sleep`) while `session` plays
    /// the session's side of the line; returns what the front still held and how the stand-in
    /// ended (its signal, if killed).
    fn serve_against(
        ctx: &ConnectionContext,
        session: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (u64, Option<i32>) {
        let mut stand_in = Command::new("sleep").arg("30").spawn().unwrap();
        let (front_end, session_end) = UnixStream::pair().unwrap();
        let player = std::thread::spawn(move || session(session_end));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut shutdown = ctx.shutdown.clone();
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let held = rt.block_on(serve_control(
            front_end,
            ctx,
            peer,
            stand_in.id(),
            &connector(),
            &mut shutdown,
        ));
        player.join().unwrap();
        // A kill takes effect a moment later.
        let t = std::time::Instant::now();
        let signal = loop {
            match stand_in.try_wait().unwrap() {
                Some(s) => break s.signal(),
                None if t.elapsed() > Duration::from_secs(2) => {
                    let _ = stand_in.kill();
                    let _ = stand_in.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        (held, signal)
    }

    #[test]
    fn anything_but_a_message_kills_the_session_process() {
        let d = tmpdir("violations");
        let (ctx, _stop) = front_ctx(&d);
        let n = counters(&ctx.stats, &ctx.rdma, &ctx.config, &ctx.conn.budget).len();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("unknown", b"HELLO\n".to_vec()),
            ("malformed", b"R -1\n".to_vec()),
            ("over-long, no newline", vec![b'1'; 1 << 20]),
            ("flood", b"F 0\n".repeat(30_000)),
            (
                "wrong counter count",
                format!("S{}\n", " 1".repeat(n + 1)).into_bytes(),
            ),
            ("D without W", b"D\n".to_vec()),
        ];
        for (what, bytes) in cases {
            let (held, signal) = serve_against(&ctx, move |mut s| {
                // The front may close the line before all is written.
                let _ = s.write_all(b"R 100\n");
                let _ = s.write_all(&bytes);
                let mut sink = Vec::new();
                let _ = std::io::Read::read_to_end(&mut s, &mut sink);
            });
            assert_eq!(signal, Some(9), "{what}: the session process is killed");
            assert_eq!(
                held, 100,
                "{what}: what it held is given back by the caller"
            );
            ctx.conn.budget.release(held);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_store_goes_through_a_sealed_memfd_the_front_hashes() {
        use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        let d = tmpdir("store");
        let (ctx, _stop) = front_ctx(&d);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let expect = rpc_proto::fnv1a64(&data);
        let budget = ctx.conn.budget.clone();
        let (held, signal) = serve_against(&ctx, move |mut s| {
            s.write_all(&ToFront::Store(data.len() as u64).encode())
                .unwrap();
            let mut buf = [0u8; 16];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let r = recvmsg(
                &s,
                &mut [std::io::IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .unwrap();
            assert_eq!(&buf[..r.bytes], ToSession::Staging.encode());
            let fd = control
                .drain()
                .find_map(|m| match m {
                    RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
                    _ => None,
                })
                .expect("a staging file");
            assert_eq!(budget.used(), data.len() as u64, "charged while it lives");
            let f = std::fs::File::from(fd);
            assert!(f.set_len(10).is_err(), "sealed against shrinking");
            f.write_all_at(&data, 0).unwrap();
            s.write_all(&ToFront::Stored.encode()).unwrap();
            // Done: a second store of nothing is refused (X), then the line closes.
            s.write_all(&ToFront::Store(0).encode()).unwrap();
            let mut b = [0u8; 2];
            std::io::Read::read_exact(&mut s, &mut b).unwrap();
            assert_eq!(&b, ToSession::NoStaging.encode());
            assert!(
                f.write_all_at(b"x", 0).is_err(),
                "sealed against writes once stored"
            );
        });
        assert_eq!(signal, None, "a well-behaved session lives");
        assert_eq!(held, 0);
        assert_eq!(
            ctx.conn.budget.used(),
            0,
            "the staging charge is given back"
        );
        assert!(d.join(format!("{expect:016x}")).is_file());
        let _ = std::fs::remove_dir_all(&d);
    }
}
