//! A flavor driven from one blocking thread, with a deadline on every call: the server-to-server
//! link of 8.0's collectives, where a session's thread waits for the peer's partial anyway and
//! an async runtime would only add a wake-up.
//!
//! It polls the queue pair without blocking: it spins while completions keep coming (the same
//! window as [`super::RdmaTransport`]: an allreduce follows the previous one within a layer's
//! compute), then yields the thread, then sleeps in short steps, so a link waiting for a slow
//! peer does not hold a core. The TCP socket the link was set up on stays open as its liveness
//! anchor: readable means the peer is gone.

use std::io;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{spin_window, Flavored, KEEPALIVE};

/// Sleep between polls once the spin window is over.
const IDLE_STEP: Duration = Duration::from_micros(50);

/// A flavor's framing over a connected queue pair, driven by blocking calls.
pub struct BlockingLink<F: Flavored> {
    link: F,
    anchor: Option<TcpStream>,
    last_activity: Instant,
    last_keepalive: Instant,
    name: &'static str,
}

impl<F: Flavored> BlockingLink<F> {
    /// `anchor` (if any) is put in non-blocking mode and only ever peeked at.
    pub fn new(
        link: F,
        anchor: Option<TcpStream>,
        name: &'static str,
    ) -> io::Result<BlockingLink<F>> {
        if let Some(a) = &anchor {
            a.set_nonblocking(true)?;
        }
        Ok(BlockingLink {
            link,
            anchor,
            last_activity: Instant::now(),
            last_keepalive: Instant::now(),
            name,
        })
    }

    /// `"RDMA/RC"`, `"RDMA/UC+lean"`, …
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// SENDs posted and receives completed.
    pub fn counters(&self) -> (u64, u64) {
        self.link.counters()
    }

    /// Sends `data` as one message; `Err(TimedOut)` if the peer has not made room by `deadline`.
    pub fn send(&mut self, data: &[u8], deadline: Instant) -> io::Result<()> {
        let mut off = 0;
        let mut spins = 0u32;
        while off < data.len() {
            let n = self.link.write_part(&data[off..])?;
            if n > 0 {
                off += n;
                self.last_activity = Instant::now();
                continue;
            }
            self.wait(&mut spins, deadline, "send")?;
        }
        self.link.end_message()?;
        while !self.link.flushed() {
            self.wait(&mut spins, deadline, "send")?;
        }
        Ok(())
    }

    /// Receives exactly `buf.len()` bytes by `deadline`.
    pub fn recv_exact(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        let mut done = 0;
        let mut spins = 0u32;
        while done < buf.len() {
            let n = self.link.read_available(&mut buf[done..])?;
            if n > 0 {
                done += n;
                self.last_activity = Instant::now();
                continue;
            }
            self.wait(&mut spins, deadline, "receive")?;
        }
        Ok(())
    }

    /// Between allreduces (called every [`KEEPALIVE`] or so by whoever holds the link idle):
    /// takes what arrived (the peer's keepalives, returned credits) and, once the link has been
    /// idle for [`KEEPALIVE`], sends a keepalive, so Apple's queue pairs, which fall asleep after
    /// 1-2 s idle and take seconds to wake, stay awake between tokens. Whether one went out; an
    /// error (the peer gone, the queue pair failed) is what the next allreduce would meet too.
    pub fn idle_tick(&mut self) -> io::Result<bool> {
        self.link.progress()?;
        self.check_anchor()?;
        if self.last_activity.elapsed() >= KEEPALIVE && self.last_keepalive.elapsed() >= KEEPALIVE {
            self.last_keepalive = Instant::now();
            return self.link.keepalive();
        }
        Ok(false)
    }

    /// One step of waiting for the queue pair: progress, else spin, yield or sleep; the anchor
    /// and the deadline are looked at as it goes.
    fn wait(&mut self, spins: &mut u32, deadline: Instant, what: &str) -> io::Result<()> {
        if self.link.progress()? {
            self.last_activity = Instant::now();
            *spins = 0;
            return Ok(());
        }
        *spins = spins.wrapping_add(1);
        let spinning = self.last_activity.elapsed() < spin_window();
        if !spinning || spins.is_multiple_of(1024) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("RDMA link {what}: the peer did not answer in time"),
                ));
            }
            self.check_anchor()?;
        }
        if spinning {
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if self.last_activity.elapsed() >= KEEPALIVE && self.last_keepalive.elapsed() >= KEEPALIVE {
            self.last_keepalive = Instant::now();
            self.link.keepalive()?;
        }
        std::thread::sleep(IDLE_STEP);
        Ok(())
    }

    fn check_anchor(&self) -> io::Result<()> {
        let Some(a) = &self.anchor else {
            return Ok(());
        };
        let mut b = [0u8; 1];
        match a.peek(&mut b) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the peer closed the link's TCP anchor",
            )),
            Ok(_) => Err(io::Error::other(
                "unexpected bytes on the link's TCP anchor after RDMA activation",
            )),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::fake::{self, FakeQp, Rules};
    use crate::rdma::rc::{RC_RX_SIZE, RC_TX_SIZE};
    use crate::rdma::uc::UC_RING_SIZE;
    use crate::rdma::{Geometry, LeanLink, RcLink, UcLink};

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    fn lean_pair(g: Geometry, rules: Rules) -> (LeanLink<FakeQp>, LeanLink<FakeQp>) {
        let max_inline = if rules == Rules::Rc { 256 } else { 0 };
        let (a, b) = fake::pair(rules, g.tx_size(), g.rx_size(), max_inline);
        let (mut a, mut b) = (LeanLink::new(a, g), LeanLink::new(b, g));
        a.post_all_receives().unwrap();
        b.post_all_receives().unwrap();
        (a, b)
    }

    #[test]
    fn idle_ticks_keep_a_uc_link_warm_and_the_next_exchange_works() {
        let (a, b) = lean_pair(Geometry::UC, Rules::Uc);
        let mut a = BlockingLink::new(a, None, "a").unwrap();
        let mut b = BlockingLink::new(b, None, "b").unwrap();
        // Just used: no keepalive yet.
        assert!(!a.idle_tick().unwrap());
        std::thread::sleep(KEEPALIVE + Duration::from_millis(20));
        assert!(
            a.idle_tick().unwrap(),
            "idle past KEEPALIVE: a keepalive goes out"
        );
        assert!(!a.idle_tick().unwrap(), "and not again at once");
        let (sent, _) = a.counters();
        assert_eq!(sent, 1);
        // b takes it on its own tick (nothing to read: a keepalive carries no bytes) ...
        b.idle_tick().unwrap();
        assert_eq!(b.counters().1, 1);
        // ... and the next exchange is exact.
        let t = std::thread::spawn(move || {
            let mut got = [0u8; 5];
            b.recv_exact(&mut got, deadline()).unwrap();
            b.send(b"world", deadline()).unwrap();
            got
        });
        a.send(b"hello", deadline()).unwrap();
        let mut got = [0u8; 5];
        a.recv_exact(&mut got, deadline()).unwrap();
        assert_eq!(&got, b"world");
        assert_eq!(&t.join().unwrap(), b"hello");
    }

    /// Rank 0 sends then receives, rank 1 receives then sends, as on the comm link; sizes below,
    /// at and above one SEND.
    fn exchange_both_ways<F: Flavored + 'static>(a: F, b: F) {
        let mut a = BlockingLink::new(a, None, "a").unwrap();
        let mut b = BlockingLink::new(b, None, "b").unwrap();
        let sizes = [4usize, 8192, 65_536, 300_000, 1 << 20];
        let t = std::thread::spawn(move || {
            for n in sizes {
                let mut got = vec![0u8; n];
                b.recv_exact(&mut got, deadline()).unwrap();
                assert!(got.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
                let mine: Vec<u8> = (0..n).map(|i| (i % 13) as u8).collect();
                b.send(&mine, deadline()).unwrap();
            }
            b.counters()
        });
        for n in sizes {
            let mine: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            a.send(&mine, deadline()).unwrap();
            let mut got = vec![0u8; n];
            a.recv_exact(&mut got, deadline()).unwrap();
            assert!(got.iter().enumerate().all(|(i, &x)| x == (i % 13) as u8));
        }
        let (sends, recvs) = t.join().unwrap();
        assert!(sends > 0 && recvs > 0);
    }

    #[test]
    fn upstream_rc_and_uc_exchange_on_the_fake_fabric() {
        let (a, b) = fake::pair(Rules::Rc, RC_TX_SIZE, RC_RX_SIZE, 256);
        let (mut a, mut b) = (RcLink::new(a), RcLink::new(b));
        a.post_all_receives().unwrap();
        b.post_all_receives().unwrap();
        exchange_both_ways(a, b);
        let (a, b) = fake::pair(Rules::Uc, UC_RING_SIZE, UC_RING_SIZE, 0);
        let (mut a, mut b) = (UcLink::new(a), UcLink::new(b));
        a.post_all_receives().unwrap();
        b.post_all_receives().unwrap();
        exchange_both_ways(a, b);
    }

    #[test]
    fn lean_rc_and_uc_exchange_on_the_fake_fabric() {
        for (g, rules) in [(Geometry::RC, Rules::Rc), (Geometry::UC, Rules::Uc)] {
            let (a, b) = lean_pair(g, rules);
            exchange_both_ways(a, b);
        }
    }

    #[test]
    fn a_silent_peer_times_out_and_a_closed_anchor_ends_the_wait() {
        let (a, _b) = lean_pair(Geometry::RC, Rules::Rc);
        let mut a = BlockingLink::new(a, None, "a").unwrap();
        let mut buf = [0u8; 16];
        let t0 = Instant::now();
        let e = a
            .recv_exact(&mut buf, Instant::now() + Duration::from_millis(300))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(5));

        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let (qc, _qd) = lean_pair(Geometry::RC, Rules::Rc);
        let mut c = BlockingLink::new(qc, Some(c), "c").unwrap();
        drop(s);
        let e = c.recv_exact(&mut buf, deadline()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
    }
}
