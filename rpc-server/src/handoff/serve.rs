//! The loop that serves a session process's control line: it reads lines, asks the ledger
//! (`ledger.rs`) what each means, and does it (replies, descriptors passed, links made, stores
//! and checks run off the runtime's thread, the process killed for a violation). Every decision
//! is the ledger's; this file holds the sockets, the staging file and the jobs.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::connection::ConnectionContext;
use crate::control::{ControlError, LineSplitter, ToSession};
use crate::stats::reported_counters;

use super::ledger::{Action, Ledger, Session};
use super::spawn::send_fd;

/// Serves a session process's control line until it closes; returns the bytes it still held.
/// A message the front cannot accept (`control.rs`: malformed, unknown, over-long, out of
/// order, too many; `ledger.rs`: outside the rules) ends the session: its process is killed and
/// the reason logged.
pub(super) async fn serve_control(
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
    // The cache this process writes (checks: always; stores: not with --trusted-weights-only).
    let cache = config.cache.as_ref().filter(|c| c.writes());
    let mut ledger = Ledger::new(
        Session {
            budget,
            comm,
            devices: config.devices.len(),
            major: ctx.major,
            counters: counters.len(),
            cache: cache.is_some(),
            stores: cache.is_some_and(|c| c.seeded_before().is_none()),
        },
        Instant::now(),
    );
    let mut lines = LineSplitter::default();
    let mut chunk = [0u8; 4096];
    let mut staging: Option<std::fs::File> = None;
    // The links handed to the session, one per device (the front's copy of each socket).
    let mut links: std::collections::HashMap<u32, std::net::TcpStream> = Default::default();
    // The store or check running off the runtime's thread (one per session): it sends its
    // charge back when done.
    // (charge, whether the staging file was emptied: if not, the charge stays, `kept`).
    let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<(u64, bool)>();
    let mut stopping = false;
    let violation: Option<ControlError> = 'serve: loop {
        while let Some(l) = lines.next_line() {
            let mut action = ledger.on_line(l, Instant::now());
            if let Action::WaitForJob(msg) = action {
                ledger.job_done(job_rx.recv().await);
                action = ledger.on(msg, Instant::now());
            }
            let reply = match action {
                Action::Nothing | Action::WaitForJob(_) => None,
                Action::Reply(r) => Some(r),
                Action::Violation(e) => break 'serve Some(e),
                Action::Count {
                    deltas,
                    first_clamp,
                } => {
                    for (c, d) in counters.iter().zip(deltas) {
                        c.fetch_add(d, Relaxed);
                    }
                    if first_clamp {
                        tracing::warn!(%peer, pid, "a session process reported counters faster than possible; clamped");
                    }
                    None
                }
                Action::Link { device, target } => match broker_link(target, comm).await {
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
                },
                Action::Stage(n) => match cache.map(|c| c.staging_file(n)) {
                    Some(Ok(f)) => {
                        if send_fd(&wr, ToSession::Staging.encode(), &f).await.is_err() {
                            ledger.staging_failed(n);
                            break 'serve None;
                        }
                        staging = Some(f);
                        None
                    }
                    failed => {
                        if let Some(Err(e)) = failed {
                            tracing::warn!(error = %e, "cannot make a staging file for a cache store");
                        }
                        ledger.staging_failed(n);
                        Some(ToSession::NoStaging)
                    }
                },
                Action::Seal { charge } => {
                    let Some(file) = staging.take() else {
                        break 'serve Some(ControlError::OutOfOrder("D without W"));
                    };
                    let n = file.metadata().map_or(0, |m| m.len()).min(charge);
                    match rpc_weights::cache::WeightCache::seal_staging(&file) {
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                            // It would keep the memory past the store: not what a sound
                            // session does. Charged until the process is gone.
                            break 'serve Some(ControlError::Staging(
                                "sealed its staging file against being emptied",
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(%peer, pid, error = %e, "a session's cache store refused: its staging file cannot be sealed");
                            let revoked =
                                rpc_weights::cache::WeightCache::revoke_staging(&file).is_ok();
                            ledger.settle((charge, revoked));
                        }
                        Ok(()) => {
                            let (config, tx) = (config.clone(), job_tx.clone());
                            ledger.job_started();
                            // Its log lines are the connection's (`peer_log`).
                            let span = tracing::Span::current();
                            tokio::task::spawn_blocking(move || {
                                let _in = span.enter();
                                if let Some(c) = &config.cache {
                                    c.store_file(&file, n);
                                }
                                // Emptied: the session's copy of the descriptor holds nothing.
                                let revoked =
                                    rpc_weights::cache::WeightCache::revoke_staging(&file).is_ok();
                                drop(file);
                                let _ = tx.send((charge, revoked));
                            });
                        }
                    }
                    None
                }
                Action::Check(hash) => {
                    let (config, tx) = (config.clone(), job_tx.clone());
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
                    None
                }
                // A cache lookup: the session cannot read the directory (a uid of its own, a
                // private directory), so the front opens the entry, by its hash's name only,
                // read-only, a regular file, and passes it down (`WeightCache::open_for_session`).
                Action::Open(hash) => match cache.and_then(|c| c.open_for_session(hash)) {
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
            Some(done) = job_rx.recv(), if ledger.job_running() => ledger.job_done(Some(done)),
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
        let _ = rpc_weights::cache::WeightCache::revoke_staging(&f);
    }
    if ledger.job_running() {
        ledger.job_done(job_rx.recv().await);
    }
    ledger.held()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ToFront;
    use crate::options::ServerOptions;
    use crate::rdma::{RdmaConfig, TransportMode};
    use crate::stats::Stats;
    use rpc_session::{MemoryBudget, SessionConfig};
    use std::io::Write;
    use std::os::fd::OwnedFd;
    use std::os::unix::fs::FileExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    use std::sync::Arc;
    use std::time::Duration;

    /// A front for [`serve_control`] tests: a cache in `dir`, a budget of 1 MiB per session
    /// (and the shutdown switch, which must live).
    fn front_ctx(dir: &std::path::Path) -> (ConnectionContext, watch::Sender<bool>) {
        let (tx, shutdown) = watch::channel(false);
        let ctx = ConnectionContext {
            options: Arc::new(ServerOptions::default()),
            config: Arc::new(SessionConfig {
                devices: Vec::new(),
                n_threads: 1,
                cache: Some(rpc_weights::cache::WeightCache::open(dir, None).unwrap()),
                local: None,
            }),
            major: rpc_proto::Major::V8,
            stats: Arc::new(Stats::default()),
            rdma: Arc::new(RdmaConfig::new(TransportMode::Tcp, Default::default(), 1)),
            budget: Arc::new(MemoryBudget::new(rpc_session::MemoryLimits {
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
        let cpu = rpc_ggml::Device::all()
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
            (
                "past device 0 of 1 and the connection's LINK_SLOTS link slots",
                comm_line(1, 1 + rpc_proto::LINK_SLOTS, "127.0.0.1", rpc_port),
            ),
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
