//! A session process (`--session-child`): serves one client whose connection its front handed
//! over (`handoff/`), on the socket that is its stdin, reporting to the front on the control
//! line that is its stdout (`control.rs`): memory reservations, counters, links and the weight
//! cache's writes go to the front, and (Linux) the cache entries it reads come from it. Its configuration is one message from the front,
//! [`SessionStart`]; nothing is rebuilt from flags. A pooled one (`--session-wait`) gets it, and
//! the client's socket, on the control line once a client arrives ([`await_connection`]).

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use rpc_session::{MemoryBudget, SessionConfig, Upstream};
use tokio::sync::watch;

use crate::connection::ConnectionContext;
use crate::control::{LineSplitter, SessionStart, ToFront, ToSession, SANDBOX_REFUSED};
use crate::rdma::RdmaConfig;
use crate::stats::{reported_counters, Stats};

/// How long a session process whose front is gone may take to finish its running command.
const FRONT_GONE_GRACE: Duration = Duration::from_secs(1);

/// Session side of the control line: memory reservations asked of the front, links, and the
/// weight cache's writes.
struct Front {
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
struct Answers {
    replies: mpsc::Sender<bool>,
    links: mpsc::Sender<Option<OwnedFd>>,
    staging: mpsc::Sender<Option<OwnedFd>>,
    entries: mpsc::Sender<Option<(OwnedFd, bool)>>,
    stop: watch::Sender<bool>,
}

impl Front {
    fn new(ctl: UnixStream, stop: watch::Sender<bool>) -> (Front, Answers) {
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
    fn deliver(&self, msg: ToSession, fd: Option<OwnedFd>) {
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
struct FrontKeeper(Arc<Front>);

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
struct FrontConnector {
    front: Arc<Front>,
    /// The policy the front enforces: a request outside it is not sent (the front would take
    /// it for a compromised session's and end this process).
    policy: crate::comm::CommPolicy,
    /// This session's devices.
    devices: usize,
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
fn read_front_lines(
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

/// The memory bound of a contained session (Linux: its address space,
/// `rpc_contain::sandbox::limit_memory`), set once its budget is known, before the client's
/// first byte. A session that cannot be bounded is refused.
fn limit_memory(on: bool, budget: u64) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if on {
        match rpc_contain::sandbox::limit_memory(budget) {
            Ok(Some(n)) => tracing::debug!(bytes = n, "address space bounded"),
            Ok(None) => tracing::debug!("address space not bounded (no budget, or a GPU build)"),
            Err(e) => return Err(format!("cannot bound the session's memory: {e}")),
        }
    }
    let _ = (on, budget);
    Ok(())
}

/// Once the transport is up: the Seatbelt profile on macOS (rpc-contain's `sandbox_mac.rs`; on
/// Linux the sandbox is in place since the process started, its `namespaces.rs` and
/// `sandbox.rs`); then the self-test when `selftest` (`ServerOptions::sandbox_selftest`:
/// `RPC_SANDBOX_SELFTEST=1` where the front started).
fn restrict_syscalls(on: bool, selftest: bool, cache_dir: Option<&std::path::Path>) {
    #[cfg(target_os = "macos")]
    if on {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        match rpc_contain::sandbox_mac::apply(home.as_deref(), cache_dir) {
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
    if selftest {
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

/// Session side: serves the client on its socket (`handed`, stdin unless pooled) after its
/// HELLO, reporting to the front on the control line (stdout). Returns the process's exit
/// status.
pub fn child_main(start: SessionStart, config: Arc<SessionConfig>, handed: Handed) -> i32 {
    let span = tracing::info_span!("session", peer = %start.peer, pid = std::process::id());
    let _enter = span.enter();
    rpc_ggml::abort::abort_on_assertions();
    let Some(major) = rpc_proto::Major::from_number(start.major) else {
        tracing::error!(
            major = start.major,
            "session process started for an unknown protocol major"
        );
        return 2;
    };
    let options = Arc::new(start.options);
    let cache_dir = config.cache.as_ref().map(|w| w.dir().to_path_buf());
    // The front resolved the limits against the devices.
    let limits = options.memory(u64::MAX);
    if let Err(e) = limit_memory(options.sandbox, limits.per_connection) {
        tracing::error!("session refused: {e} (--no-sandbox serves without containment)");
        return SANDBOX_REFUSED;
    }
    let Handed { stream, ctl, early } = handed;
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
        read_front_lines(reader, &early, |msg, fd| answers.deliver(msg, fd));
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
    if let Some(cache) = &config.cache {
        // Only the front writes the cache: this session's stores and checks go to it.
        cache.delegate(Box::new(FrontKeeper(front.clone())));
    }
    let budget = Arc::new(MemoryBudget::with_upstream(
        rpc_session::MemoryLimits {
            per_connection: limits.per_connection,
            // The server-wide limit is the front's to enforce.
            total: u64::MAX,
        },
        Box::new(ArcFront(front.clone())),
    ));
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the client's socket");
            return 2;
        }
    };
    let comm = Arc::new(FrontConnector {
        front: front.clone(),
        policy: options.comm_policy(local),
        devices: config.devices.len(),
    });
    let rdma = match start.tcp_only {
        true => Arc::new(RdmaConfig::new(
            crate::rdma::TransportMode::Tcp,
            Default::default(),
            1,
        )),
        false => options.rdma_config(),
    };
    let stats = Arc::new(Stats::default());
    let reporter = {
        let (stats, rdma, config, front, done, budget) = (
            stats.clone(),
            rdma.clone(),
            config.clone(),
            front.clone(),
            done.clone(),
            budget.clone(),
        );
        std::thread::spawn(move || {
            let counters = reported_counters(&stats, &rdma, &config, &budget);
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
    let local_ip = local.ip();
    let tcp = rpc_transport::BlockingTcpTransport::new(
        stream,
        Some(stop_rx.clone()),
        options.poll_window,
    )
    .and_then(|mut t| match &start.pending {
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
    let (sandbox, selftest) = (options.sandbox, options.sandbox_selftest);
    let ctx = ConnectionContext {
        options,
        config,
        major,
        stats: stats.clone(),
        rdma,
        budget,
        comm: Some(comm),
        shutdown: stop_rx,
    };
    let ready = move || restrict_syscalls(sandbox, selftest, cache_dir.as_deref());
    let r = match start.pending {
        // The front answered the HELLO: the session starts at the command it read.
        Some(_) => rt.block_on(crate::connection::serve_commands(tcp, ctx, ready)),
        None => rt.block_on(crate::connection::serve_hello(
            tcp, local_ip, start.caps, ctx, ready,
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
