//! Containment (the default; `--no-isolate` turns it off): each client session computes in a process of its own, so that a
//! request that gets past validation and trips a ggml kernel can read or write only its own
//! session's memory and end only its own process.
//!
//! The front process (the one listening) keeps the listener, admission, the HELLO deadline, the
//! server-wide memory account, the RDMA queue-pair budget and the counters. It answers a TCP
//! client's HELLO and the device queries after it itself (`front.rs`, reading no further than
//! each request); at the first other command it starts a fresh session process (`child.rs`: the
//! same executable with `--session-child`; never `fork()`, which is unsafe after a GPU backend
//! started) and hands it the socket as its stdin, and its whole configuration (the server's
//! options, the client's HELLO, the command's header) as one typed message,
//! [`SessionStart`]. A client that offers RDMA is handed over as soon as its HELLO is in (and
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
//! | session | `C <hex>` | COMM_INIT (its 80 bytes): set up the link to the peer server for me (checked, see below) |
//! | session | `W <bytes>` | an upload for the weight cache: a staging file of `bytes`, please |
//! | session | `D` | the staging file holds the upload |
//! | session | `V <hash>` | I hashed the cache entry `hash`: check it (record it as verified, or delete it) |
//! | session | `O <hash>` | open the cache entry `hash` for me (Linux: a session reads no cache directory) |
//! | front | `K` + a socket (`SCM_RIGHTS`) / `E` | the link's connected socket / no link |
//! | front | `M` + a memfd (`SCM_RIGHTS`) / `X` | the staging file / no store |
//! | front | `H` or `G` + the entry (`SCM_RIGHTS`) / `U` | the entry, read-only (`H`: recorded as verified with this file's stamp; `G`: hash it as you read it) / no such entry |
//! | front | `Q` | the server is shutting down: finish the running command and exit |
//!
//! With `--session-pool N` the front keeps N session processes started ahead (`Pool`): each set
//! up its containment (a TCP session's) and opened its devices from the front's options, and
//! waits on its control line; a TCP client's first command takes the oldest, which gets the
//! connection's [`SessionStart`] and the client's socket in one line (`A`, `SCM_RIGHTS`), and a
//! replacement is started in the background. A client that offers RDMA always gets a process
//! started for it.
//!
//! Only the front writes the weight cache. A session's upload with the cache flag goes into a
//! memfd the front created, sized and sealed against growing, charged to the session's memory
//! account while the session may write it; the session writes it with `pwrite` and says `D`;
//! the front seals it against writes and further seals (a store whose seal fails is refused; one
//! the session sealed against shrinking kills it), hashes the sealed bytes itself off the
//! runtime's thread, stores them under the hash it computed (`WeightCache::store_file`) and
//! empties the file (`WeightCache::revoke_staging`), so a session that kept the descriptor keeps
//! no memory; only then is the charge given back. One store or check is in flight per session. A session's
//! verified or corrupt entry is a `V`: the front hashes the file again before it records or
//! deletes anything (`WeightCache::check_entry`). Nor does a session read the cache directory
//! (Linux): it runs as a uid of its own, which a private (0700) directory does not let search,
//! so each SET_TENSOR_HASH lookup is an `O`, and the front opens the entry named by the hash
//! (16 hex digits) relative to its directory handle, read-only, never through a link, a regular
//! file only, and passes the descriptor down (`WeightCache::open_for_session`); the session's
//! read then goes straight from it into tensor memory. The session's stderr is a pipe the
//! front reads (bounded lines and bytes per second) and logs through `tracing`, tagged with the
//! session.
//!
//! A session process may not open sockets (its sandbox), so the front sets up 8.0's
//! server-to-server link (`comm.rs`: the connection's `CommPolicy`; rank 0's peer vetted by the caps
//! block it sent, rank 1's peer by its silence) and passes the connected socket down; the session
//! process does the caps exchange on it (`link.rs`: its queue pair, if the link goes on RDMA) and
//! the allreduces directly. The front answers
//! a `C` from what it holds: the session checked the request against the same policy before
//! asking, so one outside it (any from a 7.0 session, a device the session does not have, world ≠ 2, rank 0 elsewhere
//! than the server's port + 1000, rank 1 to a port or numeric address the policy refuses) kills
//! the session (`rpc_sessions_killed_total`); one link per device at a time (a new one shuts the
//! old one down: the front keeps its own copy of each socket).
//!
//! When the session process ends, however it ends, the front gives back whatever it held in the
//! memory account and its RDMA place; a process killed by a signal is logged and counted as a
//! connection closed with an error. The front then serves on. It does not wait for a session
//! process to notice that its client left: it keeps its own handle on the client's socket and
//! ends the process once the client is gone ([`ClientWatch`]).

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use rpc_proto::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::connection::{ConnectionContext, ConnectionError};
use crate::control::{
    ControlError, Inbound, LineSplitter, SessionStart, StatsGate, ToFront, ToSession,
    SANDBOX_REFUSED, SESSION_START_ENV,
};
use crate::options::ServerOptions;
use crate::rdma::Fallback;
use crate::session::MemoryBudget;
use crate::stats::reported_counters;

/// How a front process starts session processes: this executable (or `exe`), configured by
/// the front's own options; with `--session-pool`, some started ahead.
#[derive(Debug)]
pub struct Isolation {
    pub exe: PathBuf,
    pub options: ServerOptions,
    pool: Option<Pool>,
}

impl Isolation {
    /// Session processes of `options.session_exe`, else of this executable, configured by
    /// `options` with the memory limits resolved (`memory`).
    pub fn new(
        options: &ServerOptions,
        memory: crate::session::MemoryLimits,
    ) -> std::io::Result<Isolation> {
        let exe = match &options.session_exe {
            Some(e) => e.clone(),
            None => std::env::current_exe()?,
        };
        let options = ServerOptions {
            max_alloc_per_connection: Some(memory.per_connection),
            max_alloc_total: Some(memory.total),
            ..options.clone()
        };
        let pool = (options.session_pool > 0)
            .then(|| Pool::start(options.session_pool, exe.clone(), &options))
            .transpose()?;
        Ok(Isolation { exe, options, pool })
    }
}

/// Session processes started ahead (`--session-pool`), each contained as a TCP session's is
/// and with its devices open, waiting on its control line for a connection
/// (`child::await_connection`). One thread of the front starts them all and lives as long as
/// the pool: a session process is killed when the thread that started it ends (its parent-death
/// signal, `namespaces.rs`), so none may be started by a connection's thread, which ends
/// first. A pooled process whose front goes away ends: its control line closes, and its
/// parent-death signal fires.
struct Pool {
    shared: Arc<PoolShared>,
    /// Asks the pool's thread to start replacements; dropped, the thread ends the waiting ones
    /// and exits.
    refill: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How long after a take the pool starts its replacement.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

struct PoolShared {
    size: usize,
    exe: PathBuf,
    /// The message they are started with: the front's options, TCP only (the containment of a
    /// session whose HELLO the front answered); the connection's own comes at the hand-off.
    template: SessionStart,
    waiting: Mutex<std::collections::VecDeque<Waiting>>,
}

/// A pooled session process and the front's end of its control line.
struct Waiting {
    child: std::process::Child,
    ctl: UnixStream,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Pool {
    /// Starts the pool's thread, which fills it.
    fn start(size: usize, exe: PathBuf, options: &ServerOptions) -> std::io::Result<Pool> {
        let shared = Arc::new(PoolShared {
            size,
            exe,
            template: SessionStart {
                options: options.clone(),
                caps: [0; rpc_proto::CONN_CAPS_SIZE],
                pending: None,
                peer: String::new(),
                major: rpc_proto::Major::V8.number(),
                tcp_only: true,
            },
            waiting: Mutex::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let filler = shared.clone();
        let thread = std::thread::Builder::new()
            .name("session-pool".into())
            .spawn(move || {
                filler.refill();
                while rx.recv().is_ok() {
                    // Not while the taken process serves its first command: a process start
                    // competes with it for the cores. Requests meanwhile are one refill.
                    std::thread::sleep(REFILL_DELAY);
                    while rx.try_recv().is_ok() {}
                    filler.refill();
                }
                filler.close();
            })?;
        Ok(Pool {
            shared,
            refill: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The oldest waiting process still alive (one that ended while waiting is let go); a
    /// replacement is started in the background either way.
    fn take(&self) -> Option<Waiting> {
        let taken = self.shared.take();
        if let Some(tx) = &*self.refill.lock().unwrap_or_else(PoisonError::into_inner) {
            let _ = tx.send(());
        }
        taken
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(
            self.refill
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl PoolShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts processes until `size` are waiting (on the pool's thread only).
    fn refill(&self) {
        while self.lock().len() < self.size {
            match spawn_session(&self.exe, &self.template, None, None) {
                Ok((child, ctl)) => {
                    tracing::debug!(pid = child.id(), "pooled session process started");
                    self.lock().push_back(Waiting { child, ctl });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a pooled session process");
                    return;
                }
            }
        }
    }

    fn take(&self) -> Option<Waiting> {
        let mut waiting = self.lock();
        while let Some(mut w) = waiting.pop_front() {
            match w.child.try_wait() {
                Ok(None) => return Some(w),
                Ok(Some(status)) => tracing::warn!(
                    pid = w.child.id(),
                    %status,
                    "a pooled session process ended while waiting (see its log)"
                ),
                Err(e) => {
                    tracing::warn!(pid = w.child.id(), error = %e, "a pooled session process cannot be checked; not used")
                }
            }
        }
        None
    }

    /// Ends the waiting processes: their lines close, and the kill covers one still starting.
    fn close(&self) {
        let waiting = std::mem::take(&mut *self.lock());
        for mut w in waiting {
            drop(w.ctl);
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// Starts a session process: `client` given, for that connection (its socket as stdin, `start`
/// in the environment); else a pooled one that waits for its connection. Returns it and the
/// front's end of its control line (its stdout); its stderr is relayed to the front's log.
fn spawn_session(
    exe: &std::path::Path,
    start: &SessionStart,
    client: Option<std::net::TcpStream>,
    peer: Option<SocketAddr>,
) -> std::io::Result<(std::process::Child, UnixStream)> {
    let (front_end, child_end) = UnixStream::pair()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--session-child");
    // The peer in the command line is a label for `ps`; the message configures the process.
    if let Some(p) = peer {
        cmd.arg("--session-peer").arg(p.to_string());
    }
    let stdin = match client {
        Some(s) => Stdio::from(OwnedFd::from(s)),
        None => {
            cmd.arg("--session-wait");
            Stdio::null()
        }
    };
    cmd.env(SESSION_START_ENV, start.encode())
        .stdin(stdin)
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal reaches the front, which shuts the
        // sessions down in order (`Q`), not every session process at once.
        .process_group(0);
    let mut child = cmd.spawn()?;
    drop(cmd); // the parent's copies of the socket and of the session's end of the control line
    let label = match peer {
        Some(p) => p.to_string(),
        None => "pooled".to_string(),
    };
    if let Some(err) = child.stderr.take() {
        relay_stderr(err, label, child.id());
    }
    Ok((child, front_end))
}

/// Hands a connection to a waiting process: the assignment line with the client's socket.
fn assign(ctl: &UnixStream, start: &SessionStart, client: &impl AsFd) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let msg = start.assignment();
    let fds = [client.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let mut sent = loop {
        match sendmsg(
            ctl,
            &[std::io::IoSlice::new(&msg)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    while sent < msg.len() {
        match rustix::net::send(ctl, msg.get(sent..).unwrap_or(&[]), SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::Error::other("control line closed")),
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
    let (budget, rdma) = (&ctx.budget, &*ctx.rdma);
    let mut shutdown = ctx.shutdown.clone();
    // The queue-pair budget is the front's: a session process may engage RDMA only with one of
    // its places, held until the process ends.
    let offers_rdma = pending.is_none() && rdma.engages(caps);
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
    let comm = ctx.options.comm_policy(stream.local_addr()?);
    // The front keeps a handle on the socket for the session's whole life, never read: a
    // session process that does not end when its client leaves is ended by the front. None is
    // handed over unwatched.
    let mut watch = ClientWatch::start(stream.try_clone()?, peer)?;
    let start = SessionStart {
        options: iso.options.clone(),
        caps: *caps,
        pending: pending.copied(),
        peer: peer.to_string(),
        major: ctx.major.number(),
        tcp_only: rdma_place.is_none(),
    };
    // A TCP session whose HELLO the front answered may go to a waiting process of the pool
    // (contained for exactly that); one that offers RDMA sets up its queue pair in a process
    // started for it.
    let waiting = match (&iso.pool, start.pending.is_some() && start.tcp_only) {
        (Some(pool), true) => pool.take(),
        _ => None,
    };
    let mut client = Some(stream);
    let mut taken = None;
    if let (Some(mut w), Some(s)) = (waiting, client.as_ref()) {
        match assign(&w.ctl, &start, s) {
            Ok(()) => {
                client = None;
                taken = Some(w);
            }
            Err(e) => {
                tracing::warn!(pid = w.child.id(), error = %e, "a pooled session process did not take its connection; starting one");
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
    let (mut child, front_end) = match (taken, client) {
        (Some(w), _) => {
            tracing::debug!(%peer, pid = w.child.id(), "connection handed to a pooled session process");
            (w.child, w.ctl)
        }
        (None, client) => {
            let started = spawn_session(&iso.exe, &start, client, Some(peer))
                .map_err(|e| child_error(format!("cannot start a session process: {e}")))?;
            tracing::debug!(%peer, pid = started.0.id(), "session process started");
            started
        }
    };
    let pid = child.id();

    let serve = serve_control(front_end, ctx, peer, pid, &comm, &mut shutdown);
    tokio::pin!(serve);
    let (held, gone) = tokio::select! {
        biased;
        held = &mut serve => (held, None),
        how = watch.enforce(peer, pid) => (serve.await, Some(how)),
    };
    // The front's handle on the socket goes with the session: the client sees it close.
    drop(watch);
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
    if let (Some(how), Some(9)) = (gone, signal) {
        tracing::warn!(%peer, pid, "session process killed: its client is gone ({how}) and it did not end");
        return Err(child_error(format!(
            "client gone ({how}); session process {pid} did not end and was killed"
        )));
    }
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

/// How long a session process whose client left may take to end by itself before the front
/// shuts the client's socket down, and then again before it kills the process.
pub const HANGUP_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The front's own handle on a handed-off connection's socket, which it never reads, and a
/// thread of its own asleep in `poll` on it until the client is gone: its FIN (`POLLRDHUP`; a
/// client that half-closes is gone too, as a read of the end of stream tells a session), a
/// reset, or the kernel giving up on a peer that vanished (keepalive, `TCP_USER_TIMEOUT`:
/// `POLLERR`/`POLLHUP`). Neither a request nor a reply wakes it. A session process may not
/// notice its client leave (one that never reads: compromised, stopped), so the front ends it
/// ([`ClientWatch::enforce`]): the slot, the peer share and the process never outlive the
/// client by more than `2 × HANGUP_GRACE` past the moment the kernel knows it is gone.
struct ClientWatch {
    socket: Arc<std::net::TcpStream>,
    /// How the client left, once it did.
    hangup: tokio::sync::oneshot::Receiver<&'static str>,
    /// Dropped with the watch: the thread's `poll` wakes and the thread ends.
    _stop: UnixStream,
}

impl ClientWatch {
    fn start(socket: std::net::TcpStream, peer: SocketAddr) -> std::io::Result<ClientWatch> {
        let socket = Arc::new(socket);
        let (stop, stopped) = UnixStream::pair()?;
        let (tx, hangup) = tokio::sync::oneshot::channel();
        let watched = socket.clone();
        std::thread::Builder::new()
            .name("client-watch".into())
            .stack_size(256 << 10)
            .spawn(move || match wait_for_hangup(&watched, &stopped) {
                Ok(Some(how)) => drop(tx.send(how)),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(%peer, error = %e, "cannot watch a session's client any more")
                }
            })?;
        Ok(ClientWatch {
            socket,
            hangup,
            _stop: stop,
        })
    }

    /// Resolves only once the client is gone and its session process `pid` did not end by
    /// itself: [`HANGUP_GRACE`] after the client left the front shuts the socket down (which
    /// wakes a session blocked reading or writing it), another [`HANGUP_GRACE`] later it kills
    /// the process. Returns how the client left.
    async fn enforce(&mut self, peer: SocketAddr, pid: u32) -> &'static str {
        let Ok(how) = (&mut self.hangup).await else {
            return std::future::pending().await;
        };
        tracing::debug!(%peer, pid, "client gone ({how}): its session process has {HANGUP_GRACE:?} to end");
        tokio::time::sleep(HANGUP_GRACE).await;
        tracing::info!(%peer, pid, "client gone ({how}) and its session process still runs: shutting the connection down");
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        tokio::time::sleep(HANGUP_GRACE).await;
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
        how
    }
}

/// Sleeps in `poll` until the client of `socket` is gone (how, in words) or `stop` stirs
/// (`None`). Linux wakes it only for those (`POLLRDHUP`, `POLLHUP`, `POLLERR`); elsewhere there
/// is no `POLLRDHUP` and it looks every 200 ms for `POLLHUP` (a FIN or a dead connection).
fn wait_for_hangup(
    socket: &std::net::TcpStream,
    stop: &UnixStream,
) -> std::io::Result<Option<&'static str>> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let (watched, tick): (PollFlags, Option<Timespec>) = (PollFlags::RDHUP, None);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let (watched, tick) = (
        PollFlags::HUP,
        Some(Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    );
    loop {
        let mut fds = [
            PollFd::new(socket, watched),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, tick.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let [client, stopped] = fds.map(|f| f.revents());
        if !stopped.is_empty() {
            return Ok(None);
        }
        if client.contains(PollFlags::ERR) {
            return Ok(Some(
                "its connection failed: reset, or found dead by keepalive",
            ));
        }
        if client.intersects(PollFlags::HUP | watched) {
            return Ok(Some("it closed the connection"));
        }
        if tick.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
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
    comm: &crate::comm::CommPolicy,
    shutdown: &mut watch::Receiver<bool>,
) -> u64 {
    let (budget, stats, rdma, config) = (&ctx.budget, &*ctx.stats, &*ctx.rdma, &ctx.config);
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
    let counters = reported_counters(stats, rdma, config, budget);
    let start = Instant::now();
    let mut inbound = Inbound::new(start);
    let mut gate = StatsGate::new(counters.len(), start);
    let mut lines = LineSplitter::default();
    let mut chunk = [0u8; 4096];
    // Reservations the session holds; bytes charged for its store (staging file) in progress.
    let (mut held, mut store_charge) = (0u64, 0u64);
    let mut staging: Option<std::fs::File> = None;
    // The links handed to the session, one per device (the front's copy of each socket).
    let devices = config.devices.len();
    let mut links: std::collections::HashMap<u32, std::net::TcpStream> = Default::default();
    // The store or check running off the runtime's thread (one per session): it sends its
    // charge back when done.
    // (charge, whether the staging file was emptied: if not, the charge stays, `kept`).
    let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, bool)>();
    let mut kept = 0u64;
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
                if let Some(done) = job_rx.recv().await {
                    settle(budget, &mut store_charge, &mut kept, done);
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
                ToFront::CommInit(bytes) => {
                    // Outside the policy the session process checked before asking: not a
                    // request a sound session makes.
                    let (device, target) = match link_request(&bytes, comm, devices, ctx.major) {
                        Ok(t) => t,
                        Err(e) => break 'serve Some(e),
                    };
                    match broker_link(target, comm).await {
                        Ok(stream) => {
                            if send_fd(&wr, ToSession::Link.encode(), &stream)
                                .await
                                .is_err()
                            {
                                break 'serve None;
                            }
                            // One link per device: the one it replaces stops working, whatever
                            // the session does with its descriptor.
                            if let Some(old) = links.insert(device, stream) {
                                let _ = old.shutdown(std::net::Shutdown::Both);
                            }
                            None
                        }
                        Err(e) => {
                            tracing::warn!(%peer, pid, "COMM_INIT of a session: no link ({e})");
                            Some(ToSession::NoLink)
                        }
                    }
                }
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
                    let charge = store_charge;
                    match crate::cache::WeightCache::seal_staging(&file) {
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                            // It would keep the memory past the store: not what a sound
                            // session does. Charged until the process is gone.
                            break 'serve Some(ControlError::Staging(
                                "sealed its staging file against being emptied",
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(%peer, pid, error = %e, "a session's cache store refused: its staging file cannot be sealed");
                            let revoked = crate::cache::WeightCache::revoke_staging(&file).is_ok();
                            settle(budget, &mut store_charge, &mut kept, (charge, revoked));
                        }
                        Ok(()) => {
                            let (config, tx) = (config.clone(), job_tx.clone());
                            job_running = true;
                            // Its log lines are the connection's (`peer_log`).
                            let span = tracing::Span::current();
                            tokio::task::spawn_blocking(move || {
                                let _in = span.enter();
                                if let Some(c) = &config.cache {
                                    c.store_file(&file, n);
                                }
                                // Emptied: the session's copy of the descriptor holds nothing.
                                let revoked =
                                    crate::cache::WeightCache::revoke_staging(&file).is_ok();
                                drop(file);
                                let _ = tx.send((charge, revoked));
                            });
                        }
                    }
                    None
                }
                ToFront::Check(hash) => {
                    if cache.is_some() {
                        let (config, tx) = (config.clone(), job_tx.clone());
                        job_running = true;
                        // What the check logs is charged to this connection's peer.
                        let span = tracing::Span::current();
                        tokio::task::spawn_blocking(move || {
                            let _in = span.enter();
                            if let Some(c) = &config.cache {
                                let r = c.check_entry(hash);
                                tracing::debug!(
                                    %peer,
                                    pid,
                                    hash = format!("{hash:016x}"),
                                    ?r,
                                    "cache entry checked for a session"
                                );
                            }
                            let _ = tx.send((0, true));
                        });
                    }
                    None
                }
                // A cache lookup: the session cannot read the directory (a uid of its own, a
                // private directory), so the front opens the entry, by its hash's name only,
                // read-only, a regular file, and passes it down (`cache::open_for_session`).
                ToFront::Open(hash) => match cache.and_then(|c| c.open_for_session(hash)) {
                    Some(e) => {
                        let msg = ToSession::Entry {
                            verified: e.verified,
                        };
                        if send_fd(&wr, msg.encode(), &e.file).await.is_err() {
                            break 'serve None;
                        }
                        None
                    }
                    None => Some(ToSession::NoEntry),
                },
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
            Some(done) = job_rx.recv(), if job_running => {
                settle(budget, &mut store_charge, &mut kept, done);
                job_running = false;
            }
        }
    };
    if let Some(why) = violation {
        stats.sessions_killed.fetch_add(1, Relaxed);
        tracing::warn!(%peer, pid, "session process killed: {why} on its control line");
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
    if let Some(f) = staging.take() {
        // A store the session never finished: emptied now, its charge returned by the caller.
        let _ = crate::cache::WeightCache::revoke_staging(&f);
    }
    if job_running {
        if let Some(done) = job_rx.recv().await {
            settle(budget, &mut store_charge, &mut kept, done);
        }
    }
    held + store_charge + kept
}

/// A finished store's charge: given back when its staging file was emptied, else kept
/// (`kept`) until the session ends.
fn settle(
    budget: &MemoryBudget,
    store_charge: &mut u64,
    kept: &mut u64,
    (n, revoked): (u64, bool),
) {
    *store_charge -= n;
    match revoked {
        true => budget.release(n),
        false => *kept += n,
    }
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
fn relay_stderr(err: std::process::ChildStderr, peer: String, pid: u32) {
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
                log_session_line(line, truncated, &peer, pid);
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
fn log_session_line(raw: &[u8], truncated: bool, peer: &str, pid: u32) {
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

/// A session's `C` line checked against the link policy and what the front knows of the
/// session (its devices): the device and where the link goes, or the violation.
fn link_request(
    bytes: &[u8; rpc_proto::COMM_INIT_SIZE],
    comm: &crate::comm::CommPolicy,
    devices: usize,
    major: rpc_proto::Major,
) -> Result<(u32, crate::comm::Target), ControlError> {
    if major != rpc_proto::Major::V8 {
        return Err(ControlError::Link(
            "a protocol 7.0 session has no collectives".to_string(),
        ));
    }
    let req = rpc_proto::Request::decode(
        rpc_proto::Major::V8,
        rpc_proto::Command::CommInit,
        bytes,
        &Limits::default(),
    )
    .map_err(|_| ControlError::Malformed("not a COMM_INIT"))?;
    let rpc_proto::Request::CommInit(init) = req else {
        return Err(ControlError::Malformed("not a COMM_INIT"));
    };
    let target = comm
        .check(&init, devices)
        .map_err(|r| ControlError::Link(r.to_string()))?;
    Ok((init.device, target))
}

/// Front side of a session's checked `C` line: the link's connection made and vetted with the
/// connection's policy, off the runtime's thread (its caps exchange, which may lead to RDMA, is
/// the session's: the queue pair is that process's, `link.rs`).
async fn broker_link(
    target: crate::comm::Target,
    comm: &crate::comm::CommPolicy,
) -> std::io::Result<std::net::TcpStream> {
    let comm = comm.clone();
    tokio::task::spawn_blocking(move || comm.establish(&target))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::{RdmaConfig, TransportMode};
    use crate::session::SessionConfig;
    use crate::stats::Stats;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::sync::Arc;
    use std::time::Duration;

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

    /// A front for [`serve_control`] tests: a cache in `dir`, a budget of 1 MiB per session
    /// (and the shutdown switch, which must live).
    fn front_ctx(dir: &std::path::Path) -> (ConnectionContext, watch::Sender<bool>) {
        let (tx, shutdown) = watch::channel(false);
        let ctx = ConnectionContext {
            options: Arc::new(ServerOptions::default()),
            config: Arc::new(SessionConfig {
                devices: Vec::new(),
                n_threads: 1,
                cache: Some(crate::cache::WeightCache::open(dir, None).unwrap()),
                local: None,
            }),
            major: rpc_proto::Major::V8,
            stats: Arc::new(Stats::default()),
            rdma: Arc::new(RdmaConfig::new(TransportMode::Tcp, Default::default(), 1)),
            budget: Arc::new(MemoryBudget::new(crate::session::MemoryLimits {
                per_connection: 1 << 20,
                total: 1 << 30,
            })),
            comm: None,
            shutdown,
        };
        (ctx, tx)
    }

    fn connector() -> crate::comm::CommPolicy {
        crate::comm::CommPolicy::new(
            "127.0.0.1:50052".parse().unwrap(),
            Default::default(),
            Vec::new(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
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
        let n = reported_counters(&ctx.stats, &ctx.rdma, &ctx.config, &ctx.budget).len();
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
            ctx.budget.release(held);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_store_goes_through_a_sealed_memfd_the_front_hashes() {
        let d = tmpdir("store");
        let (ctx, _stop) = front_ctx(&d);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let expect = rpc_proto::fnv1a64(&data);
        let budget = ctx.budget.clone();
        let (held, signal) = serve_against(&ctx, move |mut s| {
            s.write_all(&ToFront::Store(data.len() as u64).encode())
                .unwrap();
            let (line, fd) = reply_with_fd(&s);
            assert_eq!(line, ToSession::Staging.encode());
            let fd = fd.expect("a staging file");
            assert_eq!(budget.used(), data.len() as u64, "charged while it lives");
            let f = std::fs::File::from(fd);
            assert!(
                f.set_len(data.len() as u64 + 1).is_err(),
                "sealed against growing"
            );
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
            assert_eq!(f.metadata().unwrap().len(), 0, "emptied once stored");
        });
        assert_eq!(signal, None, "a well-behaved session lives");
        assert_eq!(held, 0);
        assert_eq!(ctx.budget.used(), 0, "the staging charge is given back");
        assert!(d.join(format!("{expect:016x}")).is_file());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// One reply line of the front (two bytes) and the descriptor that came with it, if any.
    fn reply_with_fd(s: &UnixStream) -> (Vec<u8>, Option<OwnedFd>) {
        use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        let mut buf = [0u8; 2];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = recvmsg(
            s,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .unwrap();
        let fd = control.drain().find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        });
        (buf[..r.bytes].to_vec(), fd)
    }

    /// Receives a staging file (`M` + a memfd) or `X`.
    fn staging_reply(s: &UnixStream) -> Option<std::fs::File> {
        let (line, fd) = reply_with_fd(s);
        match line.as_slice() {
            b"M\n" => Some(std::fs::File::from(fd.expect("a staging file"))),
            other => {
                assert_eq!(other, ToSession::NoStaging.encode());
                None
            }
        }
    }

    /// A compromised session that asks for staging files, fills them, says it is done and keeps
    /// every descriptor, again and again: the memory it can still reach stays within its budget
    /// (each file is emptied once stored), and one that seals its file against being emptied is
    /// killed.
    #[test]
    fn a_session_that_keeps_its_staging_files_keeps_no_memory() {
        let d = tmpdir("keep");
        let (ctx, _stop) = front_ctx(&d);
        let budget = ctx.budget.clone();
        let per = 600 * 1024u64; // of a 1 MiB budget
        let (held, signal) = serve_against(&ctx, move |mut s| {
            let mut kept = Vec::new();
            for i in 0..16u32 {
                s.write_all(&ToFront::Store(per).encode()).unwrap();
                let f = staging_reply(&s).expect("a staging file while within the budget");
                let data = vec![(i % 251) as u8 + 1; per as usize];
                f.write_all_at(&data, 0).unwrap();
                s.write_all(&ToFront::Stored.encode()).unwrap();
                kept.push(f);
                let reachable: u64 = kept.iter().map(|f| f.metadata().unwrap().len()).sum();
                assert!(
                    reachable <= 2 * (1 << 20),
                    "round {i}: {reachable} bytes reachable"
                );
            }
            // The next W waits for the last store: then every kept file is empty.
            s.write_all(&ToFront::Store(per).encode()).unwrap();
            let last = staging_reply(&s).expect("a staging file");
            let reachable: u64 = kept.iter().map(|f| f.metadata().unwrap().len()).sum();
            assert_eq!(reachable, 0, "every stored file emptied");
            assert!(budget.used() <= 1 << 20);
            // Sealed against shrinking: the front would have to keep the charge; killed.
            rustix::fs::fcntl_add_seals(&last, rustix::fs::SealFlags::SHRINK).unwrap();
            s.write_all(&ToFront::Stored.encode()).unwrap();
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut sink);
        });
        assert_eq!(signal, Some(9), "killed for keeping its staging file");
        assert_eq!(
            held, per,
            "the last file's charge is given back by the caller"
        );
        ctx.budget.release(held);
        assert_eq!(ctx.budget.used(), 0);
        assert_eq!(ctx.stats.sessions_killed.load(Relaxed), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A `C` line for `init`.
    fn comm_line(rank: u32, device: u32, host: &str, port: u16) -> Vec<u8> {
        let init = rpc_proto::CommInit {
            device,
            rank,
            world: 2,
            port: u32::from(port),
            host: rpc_proto::CommInit::host_field(host).unwrap(),
        };
        let mut bytes = Vec::new();
        rpc_proto::Request::CommInit(init).encode_payload(&mut bytes);
        ToFront::CommInit(bytes.try_into().unwrap()).encode()
    }

    /// A listener on 127.0.0.1 on a port `connector()`'s policy lets rank 1 dial (an RPC port
    /// within 100 of 50052, + 1000).
    fn allowed_listener() -> std::net::TcpListener {
        (50952..=51152)
            .find_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .expect("a free port in 50952-51152")
    }

    /// Receives `K` + a socket, or `E`.
    fn link_reply(s: &UnixStream) -> Option<std::net::TcpStream> {
        let (line, fd) = reply_with_fd(s);
        match line.as_slice() {
            b"K\n" => Some(std::net::TcpStream::from(fd.expect("a socket"))),
            other => {
                assert_eq!(other, ToSession::NoLink.encode());
                None
            }
        }
    }

    /// The front as a link broker answers from what it holds: a service that is no RPC server
    /// gets the session no socket; a real peer does, one link per device (a second request
    /// for the device shuts the first link down); a request outside the policy (rank 0 on
    /// another port than the server's + 1000, a device the session does not have, world 3)
    /// kills the session.
    #[test]
    fn link_requests_are_answered_from_what_the_front_holds() {
        use std::io::Read;
        let d = tmpdir("links");
        let (mut ctx, _stop) = front_ctx(&d);
        let cpu = crate::ggml::Device::all()
            .into_iter()
            .next()
            .expect("a CPU device");
        ctx.config = Arc::new(SessionConfig {
            devices: vec![cpu],
            n_threads: 1,
            cache: None,
            local: None,
        });
        // A loopback service that greets first (SSH): no socket for the session.
        let ssh = allowed_listener();
        let ssh_port = ssh.local_addr().unwrap().port();
        let greeter = std::thread::spawn(move || {
            let (mut c, _) = ssh.accept().unwrap();
            c.write_all(b"SSH-2.0-OpenSSH_9.2p1\r\n").unwrap();
            let mut rest = Vec::new();
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let _ = c.read_to_end(&mut rest);
            rest
        });
        // A peer that waits to be spoken to, like a ggml RPC rank 0, three times (the caps
        // exchange is the session's, on the socket it gets).
        let rpc = allowed_listener();
        let rpc_port = rpc.local_addr().unwrap().port();
        let peer = std::thread::spawn(move || {
            let mut conns = Vec::new();
            for _ in 0..3 {
                let (c, _) = rpc.accept().unwrap();
                conns.push(c);
            }
            conns
        });
        let (held, signal) = serve_against(&ctx, move |mut s| {
            s.write_all(&comm_line(1, 0, "127.0.0.1", ssh_port))
                .unwrap();
            assert!(
                link_reply(&s).is_none(),
                "no socket to a service that greets first"
            );
            let mut got = Vec::new();
            for _ in 0..3 {
                s.write_all(&comm_line(1, 0, "127.0.0.1", rpc_port))
                    .unwrap();
                got.push(link_reply(&s).expect("a link to an RPC peer"));
            }
            // The first two were replaced: shut down, whatever this end does with them.
            for (i, l) in got.iter_mut().enumerate() {
                l.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                let mut b = [0u8; 1];
                let r = l.read(&mut b);
                assert_eq!(i < 2, matches!(r, Ok(0)), "link {i}: {r:?}");
            }
            // Rank 0 on a port the session chose: killed.
            s.write_all(&comm_line(0, 0, "", 51053)).unwrap();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        assert_eq!(signal, Some(9), "rank 0 on another port than 50052 + 1000");
        assert_eq!(held, 0);
        assert!(
            greeter.join().unwrap().is_empty(),
            "the service got no partial"
        );
        drop(peer.join().unwrap());
        for (what, line) in [
            ("device 1 of 1", comm_line(1, 1, "127.0.0.1", rpc_port)),
            (
                "a port that is no RPC port + 1000",
                comm_line(1, 0, "127.0.0.1", 6379),
            ),
        ] {
            let (_, signal) = serve_against(&ctx, move |mut s| {
                s.write_all(&line).unwrap();
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            });
            assert_eq!(signal, Some(9), "{what}");
        }
        // A protocol 7.0 session has no COMM_INIT: any `C` from one is a violation.
        let v7 = ConnectionContext {
            major: rpc_proto::Major::V7,
            ..ctx.clone()
        };
        let line = comm_line(1, 0, "127.0.0.1", rpc_port);
        let (_, signal) = serve_against(&v7, move |mut s| {
            s.write_all(&line).unwrap();
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        });
        assert_eq!(signal, Some(9), "a C line from a 7.0 session");
        assert_eq!(ctx.stats.sessions_killed.load(Relaxed), 4);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A session's `O <hash>`: the front opens the entry (read-only) and passes it down, `H`
    /// when it has it recorded as verified, `G` when the session must hash it; `U` for no entry
    /// or anything at an entry's name that is no regular file.
    #[test]
    fn an_entry_is_opened_for_the_session_and_passed_down() {
        let d = tmpdir("open");
        let (ctx, _stop) = front_ctx(&d);
        let stored = vec![5u8; 70_000];
        let hs = rpc_proto::fnv1a64(&stored);
        ctx.config.cache.as_ref().unwrap().store(&stored);
        let foreign = vec![6u8; 1000];
        let hf = rpc_proto::fnv1a64(&foreign);
        std::fs::write(d.join(format!("{hf:016x}")), &foreign).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join(format!("{:016x}", 7u64))).unwrap();
        let (held, signal) = serve_against(&ctx, move |mut s| {
            let mut ask = |hash: u64| -> (Vec<u8>, Option<OwnedFd>) {
                s.write_all(&ToFront::Open(hash).encode()).unwrap();
                reply_with_fd(&s)
            };
            let (line, fd) = ask(hs);
            assert_eq!(line, ToSession::Entry { verified: true }.encode());
            let f = std::fs::File::from(fd.expect("the entry"));
            let mut got = vec![0u8; stored.len()];
            f.read_exact_at(&mut got, 0).unwrap();
            assert_eq!(got, stored);
            assert!(f.write_all_at(b"x", 0).is_err(), "read-only");
            let (line, fd) = ask(hf);
            assert_eq!(line, ToSession::Entry { verified: false }.encode());
            assert!(fd.is_some());
            for missing in [7u64, 8] {
                let (line, fd) = ask(missing);
                assert_eq!(line, ToSession::NoEntry.encode(), "{missing}");
                assert!(fd.is_none());
            }
        });
        assert_eq!(signal, None, "a well-behaved session lives");
        assert_eq!(held, 0);
        let _ = std::fs::remove_dir_all(&d);
    }
}
