//! A session process's side of the control line to its front (`control.rs`): how it is handed
//! its client ([`Handed`]: the socket and the line; pooled, the assignment on the line,
//! [`await_connection`]), memory reservations ([`Front`] is the session's
//! `rpc_session::Upstream`), COMM_INIT's links asked of the front ([`FrontConnector`]), the
//! weight cache's writes and (Linux) the cache entries it reads ([`FrontKeeper`]), the front's
//! answers read with the descriptors they carry ([`read_front_lines`]), and the counters
//! reported as they change ([`Reporter`]).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rpc_session::Upstream;
use tokio::sync::watch;

use crate::control::{LineSplitter, SessionStart, ToFront, ToSession};

/// Session side of the control line: memory reservations asked of the front, links, and the
/// weight cache's writes.
pub(super) struct Front {
    wr: Mutex<UnixStream>,
    replies: Mutex<mpsc::Receiver<bool>>,
    /// Answers to `C` lines: the link's socket, or `None` (`E`).
    links: Mutex<mpsc::Receiver<Option<OwnedFd>>>,
    /// Answers to `W` lines: the staging file, or `None` (`X`). Held for a whole store.
    staging: Mutex<mpsc::Receiver<Option<OwnedFd>>>,
    /// Answers to `O` lines: the cache entry and whether the front has it verified, or `None`
    /// (`U`).
    entries: Mutex<mpsc::Receiver<Option<(OwnedFd, bool)>>>,
    /// Set when an `O` went unanswered: a late answer would be taken for the next one's, so no
    /// entry is asked for again.
    entries_lost: std::sync::atomic::AtomicBool,
}

/// Where the front's answers go, in a session process (`read_front_lines`' side of [`Front`]).
pub(super) struct Answers {
    replies: mpsc::Sender<bool>,
    links: mpsc::Sender<Option<OwnedFd>>,
    staging: mpsc::Sender<Option<OwnedFd>>,
    entries: mpsc::Sender<Option<(OwnedFd, bool)>>,
    pub(super) stop: watch::Sender<bool>,
}

impl Front {
    pub(super) fn new(ctl: UnixStream, stop: watch::Sender<bool>) -> (Front, Answers) {
        let (reply_tx, reply_rx) = mpsc::channel();
        let (link_tx, link_rx) = mpsc::channel();
        let (staging_tx, staging_rx) = mpsc::channel();
        let (entry_tx, entry_rx) = mpsc::channel();
        (
            Front {
                wr: Mutex::new(ctl),
                replies: Mutex::new(reply_rx),
                links: Mutex::new(link_rx),
                staging: Mutex::new(staging_rx),
                entries: Mutex::new(entry_rx),
                entries_lost: Default::default(),
            },
            Answers {
                replies: reply_tx,
                links: link_tx,
                staging: staging_tx,
                entries: entry_tx,
                stop,
            },
        )
    }

    /// A cache entry, opened by the front (this process cannot read a private cache
    /// directory): one `O` line and its answer.
    fn open_entry(&self, hash: u64) -> Option<rpc_weights::cache::OpenedEntry> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if self.entries_lost.load(Relaxed) || !self.send(&ToFront::Open(hash)) {
            return None;
        }
        // The front answers at once (a few metadata calls), unless it is busy with a link.
        let wait = crate::comm::SETUP_TIMEOUT + Duration::from_secs(5);
        match entries.recv_timeout(wait) {
            Ok(Some((fd, verified))) => Some(rpc_weights::cache::OpenedEntry {
                file: std::fs::File::from(fd),
                verified,
            }),
            Ok(None) => None,
            Err(_) => {
                self.entries_lost.store(true, Relaxed);
                tracing::warn!(
                    "no answer from the front to a cache lookup; the cache is off for this session"
                );
                None
            }
        }
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
    pub(super) fn deliver(&self, msg: ToSession, fd: Option<OwnedFd>) {
        match msg {
            ToSession::Yes => drop(self.replies.send(true)),
            ToSession::No => drop(self.replies.send(false)),
            ToSession::Link => drop(self.links.send(fd)),
            ToSession::NoLink => drop(self.links.send(None)),
            ToSession::Staging => drop(self.staging.send(fd)),
            ToSession::NoStaging => drop(self.staging.send(None)),
            ToSession::Entry { verified } => drop(self.entries.send(fd.map(|f| (f, verified)))),
            ToSession::NoEntry => drop(self.entries.send(None)),
            ToSession::Quit => drop(self.stop.send(true)),
        }
    }
}

/// The weight cache's writer in a session process: the front.
pub(super) struct FrontKeeper(pub(super) Arc<Front>);

impl rpc_weights::cache::CacheKeeper for FrontKeeper {
    fn store(&self, data: &[u8]) {
        self.0.store(data);
    }

    fn check(&self, hash: u64) {
        self.0.send(&ToFront::Check(hash));
    }

    fn open(&self, hash: u64) -> Option<rpc_weights::cache::OpenedEntry> {
        self.0.open_entry(hash)
    }
}

/// COMM_INIT in a session process: the front sets the link up (a sandboxed process opens no
/// socket) and passes its socket down; the exchange then runs here.
#[derive(Debug)]
pub(super) struct FrontConnector {
    pub(super) front: Arc<Front>,
    /// The policy the front enforces: a request outside it is not sent (the front would take
    /// it for a compromised session's and end this process).
    pub(super) policy: crate::comm::CommPolicy,
    /// This session's devices.
    pub(super) devices: usize,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Front")
    }
}

impl rpc_session::peer::Connector for FrontConnector {
    fn connect(
        &self,
        init: &rpc_proto::CommInit,
    ) -> std::io::Result<Box<dyn rpc_session::peer::PeerLink>> {
        // Checked here as the front checks it (a host name is checked by the front, once
        // resolved).
        self.policy
            .check(init, rpc_session::peer::link_targets(self.devices))
            .map_err(crate::comm::refused)?;
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
            Ok(Some(fd)) => crate::link::finish(
                std::net::TcpStream::from(fd),
                init.rank,
                &self.policy.rdma,
                self.policy.io_timeout,
            ),
            Ok(None) => Err(std::io::Error::other("the front could not set up the link")),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the front",
            )),
        }
    }

    fn port(&self) -> Option<u16> {
        Some(self.policy.local.port())
    }
}

/// Reads the front's messages, with the descriptors sent along (`SCM_RIGHTS`), until the line
/// closes (or carries something that is no message): `on_msg` gets each message and, for one
/// that carries a descriptor (`K`, `M`, `H`, `G`), the descriptor that came with it.
/// `early`: bytes of the line already read (after a pooled process's assignment).
pub(super) fn read_front_lines(
    sock: UnixStream,
    early: &[u8],
    mut on_msg: impl FnMut(ToSession, Option<OwnedFd>),
) {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut fds: std::collections::VecDeque<OwnedFd> = Default::default();
    let mut lines = LineSplitter::default();
    lines.push(early);
    if !deliver_lines(&mut lines, &mut fds, &mut on_msg) {
        return;
    }
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
        if !deliver_lines(&mut lines, &mut fds, &mut on_msg) {
            return;
        }
    }
}

/// The whole lines `lines` holds, each to `on_msg` with its descriptor; `false` when one is no
/// message.
fn deliver_lines(
    lines: &mut LineSplitter,
    fds: &mut std::collections::VecDeque<OwnedFd>,
    on_msg: &mut impl FnMut(ToSession, Option<OwnedFd>),
) -> bool {
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
                return false;
            }
        }
    }
    true
}

/// What a session process serves: the client's socket and the control line to its front, and
/// any bytes of the line already read.
pub struct Handed {
    pub stream: std::net::TcpStream,
    pub ctl: UnixStream,
    pub early: Vec<u8>,
}

impl Handed {
    /// A session process started for its connection: the socket is stdin, the control line
    /// stdout.
    pub fn from_stdio() -> std::io::Result<Handed> {
        let sock = std::io::stdin().as_fd().try_clone_to_owned()?;
        let ctl = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Handed {
            stream: std::net::TcpStream::from(sock),
            ctl: UnixStream::from(ctl),
            early: Vec::new(),
        })
    }
}

/// A pooled session process (`--session-wait`), contained and with its devices open, waits
/// here for its connection: one assignment line on the control line (stdout), with the
/// client's socket (`control.rs`). `Ok(None)`: the front closed the line first (it is gone, or
/// the pool was dropped), and the process just ends. The assignment must be for the
/// containment this process has (`template`'s options, TCP only), or it is refused.
pub fn await_connection(template: &SessionStart) -> Result<Option<(SessionStart, Handed)>, String> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let ctl = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(UnixStream::from)
        .map_err(|e| format!("no control line: {e}"))?;
    let mut got: Vec<u8> = Vec::new();
    let mut socket: Option<OwnedFd> = None;
    let mut buf = [0u8; 16 << 10];
    let end = loop {
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let n = match recvmsg(
            &ctl,
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) if r.bytes == 0 => return Ok(None),
            Ok(r) => r.bytes,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(format!("control line: {e}")),
        };
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for fd in fds {
                    // The first is the client's; any other is closed.
                    socket.get_or_insert(fd);
                }
            }
        }
        let old = got.len();
        got.extend_from_slice(buf.get(..n).unwrap_or(&[]));
        if let Some(i) = got[old..].iter().position(|&b| b == b'\n') {
            break old + i;
        }
        if got.len() >= crate::control::MAX_ASSIGNMENT {
            return Err("assignment line too long".into());
        }
    };
    let start = SessionStart::from_assignment(&got[..end])?;
    if start.options != template.options || !start.tcp_only || start.pending.is_none() {
        return Err("an assignment this process is not contained for".into());
    }
    let socket = socket.ok_or("an assignment without the client's socket")?;
    let early = got.split_off(end + 1);
    Ok(Some((
        start,
        Handed {
            stream: std::net::TcpStream::from(socket),
            ctl,
            early,
        },
    )))
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
pub(super) struct Reporter {
    pub(super) last: Vec<u64>,
}

impl Reporter {
    pub(super) fn report(&mut self, counters: &[&AtomicU64], front: &Front) {
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

/// [`Upstream`] over a shared [`Front`] (the reporter thread shares the line).
pub(super) struct ArcFront(pub(super) Arc<Front>);

impl Upstream for ArcFront {
    fn reserve(&self, n: u64) -> bool {
        self.0.reserve(n)
    }

    fn release(&self, n: u64) {
        self.0.release(n)
    }
}
