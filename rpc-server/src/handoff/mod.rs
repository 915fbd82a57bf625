//! Containment (the default; `--no-isolate` turns it off): each client session computes in a process of its own, so that a
//! request that gets past validation and trips a ggml kernel can read or write only its own
//! session's memory and end only its own process.
//!
//! The front process (the one listening) keeps the listener, admission, the HELLO deadline, the
//! server-wide memory account, the RDMA queue-pair budget and the counters. It answers a TCP
//! client's HELLO and the device queries after it itself (`front.rs`, reading no further than
//! each request); at the first other command it starts a fresh session process (`child/`: the
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
//! | session | `S <n> <n> ...` | counters since the last `S` (the order of [`reported_counters`](crate::stats::reported_counters); clamped, `control::StatsGate`) |
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
//! ends the process once the client is gone (`watch.rs`: `ClientWatch`).
//!
//! The parts: this file, the hand-off itself ([`hand_off`]: which process serves the
//! connection, and how its end maps to the connection's result); `pool.rs` (`--session-pool`);
//! `spawn.rs` (starting a process, the descriptors passed to it); `serve.rs` (the loop that
//! serves the control line and does what the ledger says); `ledger.rs` (the control line's
//! rules without I/O, `Ledger::on(message, now) -> Action`: the memory account, the stats gate,
//! the link policy, cache staging, one job at a time); `relay.rs` (the session's stderr in the
//! front's log); `watch.rs` (the end of a session whose client is gone).

mod ledger;
mod pool;
mod relay;
mod serve;
mod spawn;
mod watch;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use crate::connection::{ConnectionContext, ConnectionError};
use crate::control::{SessionStart, SANDBOX_REFUSED};
use crate::options::ServerOptions;
use crate::rdma::Fallback;

use pool::Pool;
use serve::serve_control;
use spawn::{assign, spawn_session};
use watch::ClientWatch;
pub use watch::HANGUP_GRACE;

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
        memory: rpc_session::MemoryLimits,
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
    // exit status 128 + n (`rpc_contain::namespaces::run_outer`).
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
