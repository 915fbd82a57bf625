//! TCP: the protocol's native transport. `TCP_NODELAY`, buffered reads, vectored writes.
//!
//! Two forms of the one transport: [`TcpTransport`] for tasks that share a runtime (the shim,
//! the clients), and [`BlockingTcpTransport`] for a connection that has an OS thread to itself
//! (the server): a request that arrives finds its thread asleep in `recv` and wakes it directly,
//! with no readiness poll, timer or re-read in between.

use std::io::{self, IoSlice, Write};
use std::time::{Duration, Instant};

use rustix::net::RecvFlags;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::Transport;

/// A TCP connection with a read buffer sized for pipelined small commands.
pub struct TcpTransport {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

impl TcpTransport {
    /// Wraps a connected stream (sets `TCP_NODELAY`).
    pub fn new(stream: TcpStream) -> io::Result<TcpTransport> {
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        Ok(TcpTransport {
            rd: BufReader::with_capacity(256 * 1024, rd),
            wr,
        })
    }

    /// Bytes received but not consumed yet (must be empty before switching transports).
    pub fn buffered(&self) -> usize {
        self.rd.buffer().len()
    }

    /// The underlying halves.
    pub fn into_inner(self) -> (BufReader<OwnedReadHalf>, OwnedWriteHalf) {
        (self.rd, self.wr)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.wr.peer_addr()
    }

    /// The socket, e.g. to keep it as a liveness anchor under RDMA; fails if received bytes are
    /// still buffered.
    pub fn into_stream(self) -> io::Result<TcpStream> {
        if self.buffered() != 0 {
            return Err(io::Error::other(
                "the peer sent TCP bytes after switching to RDMA",
            ));
        }
        self.rd
            .into_inner()
            .reunite(self.wr)
            .map_err(io::Error::other)
    }
}

impl Transport for TcpTransport {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.rd.read(buf).await
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.rd.read_exact(buf).await.map(|_| ())
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        let mut idx = 0;
        while idx < parts.len() {
            let slices: Vec<IoSlice<'_>> = parts[idx..].iter().map(|p| IoSlice::new(p)).collect();
            let mut n = self.wr.write_vectored(&slices).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while idx < parts.len() && n >= parts[idx].len() {
                n -= parts[idx].len();
                idx += 1;
            }
            if n > 0 {
                parts[idx] = &parts[idx][n..];
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "TCP"
    }
}

/// How often a blocked read or write of a [`BlockingTcpTransport`] wakes to look at its deadline
/// and at the stop signal (a request that arrives wakes it at once).
const TICK: Duration = Duration::from_millis(200);

/// Default poll window of a [`BlockingTcpTransport`] (`rpc-server --poll-window`): longer than
/// a client needs to turn a reply into its next request on the same machine, short enough to
/// cost little when the next request is a token away.
pub const DEFAULT_POLL_WINDOW: Duration = Duration::from_micros(50);

/// Read buffer of a [`BlockingTcpTransport`] (pipelined small commands arrive in one `recv`).
const READ_BUFFER: usize = 256 * 1024;

/// Most credit a [`PollPolicy`] holds: that many waits in a row whose bytes came later than the
/// poll window turn polling off.
const POLL_CREDIT_MAX: u8 = 4;

/// Whether a wait for bytes polls first: only while recent waits ended within the poll window.
///
/// Each wait that ended within the window (taken while polling, or, while not polling, found
/// by a sleeping read no later than the window after the wait began) earns a credit, each that
/// did not costs one; a wait polls while credit is left. A client in a round-trip loop, or the
/// parts of a request burst, keep it polling; a peer whose requests come farther apart than the
/// window (a client that talks to other servers in between, a token's compute) turns it off,
/// and the thread then sleeps at once, as a plain blocking server does, instead of spinning for
/// the whole window after every request only to sleep anyway.
#[derive(Debug, Clone, Copy)]
struct PollPolicy {
    credit: u8,
}

impl PollPolicy {
    fn new() -> PollPolicy {
        PollPolicy {
            credit: POLL_CREDIT_MAX,
        }
    }

    fn polls(&self) -> bool {
        self.credit > 0
    }

    /// A wait ended: within the window (`true`) or not.
    fn record(&mut self, within: bool) {
        self.credit = match within {
            true => (self.credit + 1).min(POLL_CREDIT_MAX),
            false => self.credit.saturating_sub(1),
        };
    }
}

/// TCP with blocking reads and writes, for a connection served by its own OS thread.
///
/// A read that finds nothing buffered first polls the socket (`recv` with `MSG_DONTWAIT`,
/// yielding the core between tries) for up to its poll window before it sleeps: the next part
/// of a request burst, or the next request of a client in a round-trip loop, is then taken
/// without the thread being put to sleep and woken again, which on a virtual machine or a
/// loaded host costs more than the request itself. It polls only while that pays: once the
/// last waits all lasted longer than the window it sleeps at once, until waits are short again
/// (`PollPolicy`). Deadlines and the stop signal are looked at every [`TICK`] while a read or
/// write sleeps. The futures of its [`Transport`] methods complete without ever returning
/// `Pending`.
pub struct BlockingTcpTransport {
    stream: std::net::TcpStream,
    buf: Box<[u8]>,
    /// Unread bytes are `buf[pos..end]`.
    pos: usize,
    end: usize,
    poll_window: Duration,
    poll: PollPolicy,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Whether a read may take more bytes from the socket than it asked for (see
    /// [`BlockingTcpTransport::set_read_ahead`]).
    read_ahead: bool,
}

impl BlockingTcpTransport {
    /// Wraps a connected stream (sets `TCP_NODELAY`, blocking mode and the wake-up tick). A
    /// `stop` that turns `true` makes sleeping reads and writes fail. `poll_window`: how long a
    /// read polls before it sleeps (zero: sleep at once).
    pub fn new(
        stream: std::net::TcpStream,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
        poll_window: Duration,
    ) -> io::Result<BlockingTcpTransport> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(TICK))?;
        stream.set_write_timeout(Some(TICK))?;
        Ok(BlockingTcpTransport {
            stream,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            pos: 0,
            end: 0,
            poll_window,
            poll: PollPolicy::new(),
            stop,
            read_ahead: true,
        })
    }

    /// The local address of the socket (the one the peer reached us at).
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.local_addr()
    }

    /// With read-ahead off, a read takes from the socket at most the bytes it asked for, so
    /// that the socket can change hands between any two reads with nothing left behind here
    /// (the front of a contained server reads HELLO and the queries it answers this way, then
    /// hands the socket over). On by default.
    pub fn set_read_ahead(&mut self, on: bool) {
        self.read_ahead = on;
    }

    /// Puts `bytes` in front of what the socket will deliver: the next reads return them first
    /// (the header a front process read before handing the socket over). Fails if bytes are
    /// still buffered or `bytes` is larger than the read buffer.
    pub fn preload(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.buffered() != 0 || bytes.len() > self.buf.len() {
            return Err(io::Error::other("cannot preload: buffer busy or too small"));
        }
        self.buf[..bytes.len()].copy_from_slice(bytes);
        (self.pos, self.end) = (0, bytes.len());
        Ok(())
    }

    /// Bytes received but not consumed yet (must be empty before switching transports).
    pub fn buffered(&self) -> usize {
        self.end - self.pos
    }

    /// Whether the next read that finds nothing buffered polls before it sleeps (the poll
    /// window is not zero and recent waits ended within it).
    pub fn polls(&self) -> bool {
        !self.poll_window.is_zero() && self.poll.polls()
    }

    /// The socket, e.g. to keep it as a liveness anchor under RDMA; fails if received bytes
    /// are still buffered.
    pub fn into_stream(self) -> io::Result<std::net::TcpStream> {
        if self.buffered() != 0 {
            return Err(io::Error::other(
                "client sent TCP bytes after switching to RDMA",
            ));
        }
        Ok(self.stream)
    }

    /// A wait timed out: fail if the stop signal is up.
    fn check_stop(&self) -> io::Result<()> {
        match &self.stop {
            Some(s) if *s.borrow() => Err(io::Error::other("server shutting down")),
            _ => Ok(()),
        }
    }

    /// Buffered bytes if there are any, else one `recv`: straight into `out` when it is at least
    /// as large as the buffer or read-ahead is off, else through the buffer.
    fn recv(&mut self, out: &mut [u8], flags: RecvFlags) -> io::Result<usize> {
        if self.pos == self.end {
            if out.len() >= self.buf.len() || !self.read_ahead {
                return Ok(rustix::net::recv(&self.stream, out, flags)?.0);
            }
            let got = rustix::net::recv(&self.stream, &mut self.buf[..], flags)?.0;
            (self.pos, self.end) = (0, got);
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    fn read_blocking(
        &mut self,
        out: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        if out.is_empty() {
            return Ok(Some(0));
        }
        // A wait: nothing buffered. When it began, and whether it polled in vain.
        let mut wait = None;
        if self.pos == self.end && !self.poll_window.is_zero() {
            let start = Instant::now();
            let mut in_vain = false;
            if self.poll.polls() {
                loop {
                    match self.recv(out, RecvFlags::DONTWAIT) {
                        Ok(n) => {
                            self.poll.record(true);
                            return Ok(Some(n));
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if start.elapsed() >= self.poll_window {
                                in_vain = true;
                                break;
                            }
                            std::thread::yield_now();
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            wait = Some((start, in_vain));
        }
        loop {
            match self.recv(out, RecvFlags::empty()) {
                Ok(n) => {
                    if let Some((start, in_vain)) = wait {
                        self.poll
                            .record(!in_vain && start.elapsed() <= self.poll_window);
                    }
                    return Ok(Some(n));
                }
                // SO_RCVTIMEO expired (EAGAIN on Unix; ETIMEDOUT is a real error, e.g.
                // TCP_USER_TIMEOUT).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.check_stop()?;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn send_blocking(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let mut store = [IoSlice::new(&[]); 8];
        if parts.len() > store.len() {
            for p in parts {
                self.send_blocking(&[p])?;
            }
            return Ok(());
        }
        for (s, p) in store.iter_mut().zip(parts) {
            *s = IoSlice::new(p);
        }
        let mut slices = &mut store[..parts.len()];
        IoSlice::advance_slices(&mut slices, 0); // skips leading empty parts
        while !slices.is_empty() {
            match (&self.stream).write_vectored(slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.check_stop()?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Transport for BlockingTcpTransport {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_blocking(buf, None).map(|n| n.unwrap_or(0))
    }

    async fn read_by(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        self.read_blocking(buf, deadline)
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_blocking(&mut buf[done..], None)? {
                Some(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection mid-message",
                    ))
                }
                Some(n) => done += n,
                None => return Err(io::ErrorKind::TimedOut.into()), // no deadline: not reached
            }
        }
        Ok(())
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.send_blocking(parts)
    }

    fn name(&self) -> &'static str {
        "TCP"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    fn pair(poll: Duration) -> (BlockingTcpTransport, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        (
            BlockingTcpTransport::new(server, None, poll).unwrap(),
            client,
        )
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Bytes that arrive after a read polled in vain and slept are delivered once, in order:
    /// a failed poll must not replay what the buffer held before.
    #[test]
    fn reads_across_gaps_in_order_without_replay() {
        for poll in [Duration::ZERO, Duration::from_micros(50)] {
            let (mut t, mut c) = pair(poll);
            let writer = std::thread::spawn(move || {
                for i in 0u8..20 {
                    c.write_all(&[i; 5]).unwrap();
                    std::thread::sleep(Duration::from_millis(if i % 4 == 0 { 30 } else { 0 }));
                }
                // One message larger than the read buffer: read straight into the caller's.
                let big: Vec<u8> = (0..READ_BUFFER * 2 + 7).map(|i| i as u8).collect();
                c.write_all(&big).unwrap();
                big
            });
            let mut got = vec![0u8; 100];
            block_on(t.read_exact(&mut got)).unwrap();
            let want: Vec<u8> = (0u8..20).flat_map(|i| [i; 5]).collect();
            assert_eq!(got, want, "poll window {poll:?}");
            let big = writer.join().unwrap();
            let mut got = vec![0u8; big.len()];
            block_on(t.read_exact(&mut got)).unwrap();
            assert!(got == big, "large read differs (poll window {poll:?})");
        }
    }

    /// With read-ahead off nothing beyond what was asked for leaves the socket, so a second
    /// owner of the socket (with the header preloaded) reads the rest in order; with read-ahead
    /// on, the same first read takes everything that had arrived (the control).
    #[test]
    fn without_read_ahead_the_socket_changes_hands_losing_nothing() {
        for ahead in [false, true] {
            let (mut t, mut c) = pair(Duration::ZERO);
            t.set_read_ahead(ahead);
            let msg: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
            c.write_all(&msg).unwrap();
            std::thread::sleep(Duration::from_millis(50)); // all of it has arrived
            let mut head = [0u8; 9];
            block_on(t.read_exact(&mut head)).unwrap();
            assert_eq!(head[..], msg[..9]);
            if ahead {
                assert_eq!(t.buffered(), 1000 - 9, "read-ahead took the rest");
                assert!(t.into_stream().is_err(), "bytes would be lost");
                continue;
            }
            assert_eq!(t.buffered(), 0);
            let stream = t.into_stream().unwrap();
            let mut next = BlockingTcpTransport::new(stream, None, Duration::ZERO).unwrap();
            next.preload(&head).unwrap();
            assert!(
                next.preload(&head).is_err(),
                "preload only into an empty buffer"
            );
            let mut got = vec![0u8; 1000];
            block_on(next.read_exact(&mut got)).unwrap();
            assert_eq!(got, msg);
        }
    }

    #[test]
    fn poll_policy_spends_and_earns_credit() {
        let mut p = PollPolicy::new();
        assert!(p.polls(), "polls from the start");
        for _ in 0..POLL_CREDIT_MAX {
            assert!(p.polls());
            p.record(false);
        }
        assert!(
            !p.polls(),
            "off after {POLL_CREDIT_MAX} late waits in a row"
        );
        p.record(true);
        assert!(p.polls(), "one wait within the window turns it back on");
        // A burst of short waits and one long one (a token's parts, then its compute) keeps it on.
        for _ in 0..10 {
            for _ in 0..5 {
                p.record(true);
            }
            p.record(false);
            assert!(p.polls());
        }
    }

    /// A peer whose messages come farther apart than the poll window turns polling off (the
    /// thread sleeps at once); messages that come sooner turn it back on. The bytes arrive
    /// whole and in order either way.
    #[test]
    fn polling_follows_the_gaps_between_messages() {
        let window = Duration::from_millis(20);
        let (mut t, mut c) = pair(window);
        let (tx, rx) = std::sync::mpsc::channel::<Duration>();
        let writer = std::thread::spawn(move || {
            let mut i = 0u8;
            while let Ok(gap) = rx.recv() {
                std::thread::sleep(gap);
                c.write_all(&[i]).unwrap();
                i = i.wrapping_add(1);
            }
        });
        let mut next = 0u8;
        let mut one = |t: &mut BlockingTcpTransport, gap: Duration| {
            tx.send(gap).unwrap();
            let mut b = [0u8; 1];
            block_on(t.read_exact(&mut b)).unwrap();
            assert_eq!(b[0], next);
            next = next.wrapping_add(1);
        };
        assert!(t.polls());
        for _ in 0..POLL_CREDIT_MAX {
            one(&mut t, Duration::from_millis(120));
        }
        assert!(!t.polls(), "late messages turn polling off");
        // Sleeping reads that end within the window earn the credit back.
        one(&mut t, Duration::ZERO);
        assert!(t.polls(), "a prompt message turns polling on again");
        for _ in 0..3 {
            one(&mut t, Duration::ZERO);
        }
        assert!(t.polls());
        drop(tx);
        writer.join().unwrap();
        let unpolled = pair(Duration::ZERO).0;
        assert!(!unpolled.polls(), "a zero window never polls");
    }

    #[test]
    fn deadline_passes_then_data_still_arrives() {
        let (mut t, mut c) = pair(Duration::from_micros(50));
        let start = Instant::now();
        let mut b = [0u8; 4];
        let r = block_on(t.read_by(&mut b, Some(start + Duration::from_millis(300)))).unwrap();
        assert_eq!(r, None);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        c.write_all(b"abcd").unwrap();
        block_on(t.read_exact(&mut b)).unwrap();
        assert_eq!(&b, b"abcd");
        drop(c);
        assert_eq!(
            block_on(t.read(&mut b)).unwrap(),
            0,
            "peer closed: end of stream"
        );
    }

    #[test]
    fn stop_signal_ends_a_sleeping_read() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server, _) = l.accept().unwrap();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut t = BlockingTcpTransport::new(server, Some(rx), Duration::ZERO).unwrap();
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            tx.send(true).unwrap();
            tx
        });
        let mut b = [0u8; 1];
        let err = block_on(t.read(&mut b)).unwrap_err();
        assert!(err.to_string().contains("shutting down"), "{err}");
        drop(stopper.join());
    }

    #[test]
    fn message_parts_arrive_concatenated() {
        let (mut t, mut c) = pair(Duration::ZERO);
        block_on(t.send_message(&[b"", b"ab", b"", b"cde", b""])).unwrap();
        let big = vec![7u8; 8 << 20]; // more than the socket buffer: partial writes
        let reader = std::thread::spawn(move || {
            let mut b = vec![0u8; 5 + (8 << 20)];
            std::io::Read::read_exact(&mut c, &mut b).unwrap();
            b
        });
        block_on(t.send_message(&[&big[..1], &big[1..]])).unwrap();
        let b = reader.join().unwrap();
        assert_eq!(&b[..5], b"abcde");
        assert!(b[5..].iter().all(|&x| x == 7));
    }
}
