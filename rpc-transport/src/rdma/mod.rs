//! RDMA transports compatible with upstream llama.cpp's two flavors, negotiated inside HELLO.
//!
//! - [`caps`]: the 24-byte HELLO blob in both layouts, and flavor detection from a peer's blob.
//! - [`rc`] / [`uc`]: the flavors' framing as state machines over the [`verbs::Verbs`] trait
//!   (one connected queue pair with its registered memory), with no I/O of their own.
//! - [`lean`]: our own framing (sequence numbers, checksums, credits, frames sized to the
//!   message) over an RC or UC queue pair, used only when both ends are ours.
//! - [`negotiate`]: who speaks what, from the HELLO caps (both roles), and the client role over
//!   real verbs ([`negotiate::negotiate_client`]).
//! - [`RdmaTransport`]: drives a flavor asynchronously as a [`crate::Transport`], and watches the
//!   TCP socket that stays open as the liveness anchor (UC reports nothing when a peer dies).
//! - [`blocking::BlockingLink`]: drives a flavor from one blocking thread with a deadline on
//!   every call (the server-to-server link of 8.0's collectives).
//! - `fake`: an in-process fabric that enforces both flavors' hardware rules, for fast tests
//!   (only in test builds and with the `test-util` feature: it is not part of the library users get).

pub mod blocking;
pub mod caps;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod lean;
pub mod negotiate;
pub mod rc;
pub mod real;
pub mod uc;
pub mod verbs;
pub mod wire;

use std::io;
use std::time::{Duration, Instant};

use rdma_verbs::AsyncCompChannel;
use tokio::net::TcpStream;

pub use caps::{gid_for_ip, gid_to_string, lean_rc_psn, Caps, Flavor, CAPS_SIZE, LEAN_UC_MARK};
pub use lean::{Geometry, LeanLink};
pub use rc::RcLink;
pub use uc::UcLink;

/// A flavor's framing over a queue pair, polled without blocking.
pub trait Flavored: Send {
    /// Polls completions; `Ok(true)` if any arrived.
    fn progress(&mut self) -> io::Result<bool>;
    /// Copies received bytes (up to `buf.len()`); 0 when none are ready.
    fn read_available(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Accepts a prefix of one `send_data()` part; 0 when it must wait for send resources.
    fn write_part(&mut self, part: &[u8]) -> io::Result<usize>;
    /// End of a message: post what is buffered.
    fn end_message(&mut self) -> io::Result<()>;
    /// Everything written so far is posted (a flavor with flow control may hold frames until
    /// the peer has room; [`RdmaTransport`] waits for this before a send returns).
    fn flushed(&self) -> bool {
        true
    }
    /// A SEND is still waiting for its completion.
    fn sends_pending(&self) -> bool;
    /// SENDs posted and receives completed so far.
    fn counters(&self) -> (u64, u64);
    /// Sends something harmless to keep an idle link awake; `Ok(false)` if the flavor has no
    /// such need or cannot do it now.
    fn keepalive(&mut self) -> io::Result<bool> {
        Ok(false)
    }
    /// [`verbs::Verbs::arm`] of the underlying queue pair.
    fn arm(&mut self) -> io::Result<Option<rdma_verbs::CompChannel>> {
        Ok(None)
    }
}

/// How long a sender waits for send resources before giving up on the connection.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Busy-poll this long after the last completion before sleeping. Like upstream (100 ms), so
/// the next token's traffic, which follows within tens of milliseconds, is met by a polling
/// thread instead of a sleeping one (waking costs tens of microseconds on the completion
/// channel, a timer tick without one, far more than an RDMA round trip). After it, the
/// connection sleeps on the queue pair's completion channel (Linux; no CPU while idle) or,
/// without one, polls on a 1 ms timer. `RPC_RDMA_SPIN_MS` overrides it (0: never spin).
pub(crate) fn spin_window() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let ms = std::env::var("RPC_RDMA_SPIN_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(100);
        Duration::from_millis(ms)
    })
}
/// Sleep between polls when idle and the queue pair has no completion channel.
const IDLE_TICK: Duration = Duration::from_millis(1);
/// Longest sleep on the completion channel: the anchor and keepalives are looked at this often.
const IDLE_WAKE: Duration = Duration::from_millis(250);

/// How an idle connection waits.
enum Idle {
    /// Not tried yet.
    Unknown,
    /// On the completion channel, registered with the runtime.
    Events(AsyncCompChannel),
    /// On a timer (no channel, or it failed).
    Ticks,
}
/// Apple's Thunderbolt queue pairs fall asleep after 1-2 s idle and take seconds to wake: an
/// idle link gets a keepalive this often.
pub const KEEPALIVE: Duration = Duration::from_millis(500);

/// An activated RDMA connection as a [`crate::Transport`].
pub struct RdmaTransport<F: Flavored> {
    idle: Idle,
    link: F,
    /// The bootstrap TCP socket: carries nothing after activation; readable = peer gone.
    anchor: Option<TcpStream>,
    name: &'static str,
    last_activity: Instant,
    last_keepalive: Instant,
    keepalives: u64,
    /// Idle waits that ended on a completion event / on a timer.
    event_wakeups: u64,
    timer_wakeups: u64,
}

impl<F: Flavored> RdmaTransport<F> {
    pub fn new(link: F, anchor: Option<TcpStream>, name: &'static str) -> RdmaTransport<F> {
        RdmaTransport {
            idle: Idle::Unknown,
            link,
            anchor,
            name,
            last_activity: Instant::now(),
            last_keepalive: Instant::now(),
            keepalives: 0,
            event_wakeups: 0,
            timer_wakeups: 0,
        }
    }

    pub fn link(&mut self) -> &mut F {
        &mut self.link
    }

    /// The flavor state, without the anchor.
    pub fn into_link(self) -> F {
        self.link
    }

    /// SENDs posted and receives completed on this connection.
    pub fn counters(&self) -> (u64, u64) {
        self.link.counters()
    }

    /// How idle waits sleep (`"events"`: on the completion channel, `"ticks"`: on a 1 ms timer,
    /// `"none"`: the connection never went idle) and how many ended on a completion event and
    /// on a timer.
    pub fn idle_stats(&self) -> (&'static str, u64, u64) {
        let mode = match self.idle {
            Idle::Unknown => "none",
            Idle::Events(_) => "events",
            Idle::Ticks => "ticks",
        };
        (mode, self.event_wakeups, self.timer_wakeups)
    }

    /// Keepalive frames sent while idle.
    pub fn keepalives(&self) -> u64 {
        self.keepalives
    }

    fn check_anchor(&self) -> io::Result<()> {
        if let Some(a) = &self.anchor {
            let mut b = [0u8; 1];
            match a.try_read(&mut b) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "peer closed the TCP anchor",
                    ))
                }
                Ok(_) => {
                    return Err(io::Error::other(
                        "unexpected bytes on the TCP anchor after RDMA activation",
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One step of waiting: progress if possible, else spin briefly, then sleep in ticks,
    /// checking that the peer is alive.
    async fn step(&mut self, spins: &mut u32) -> io::Result<()> {
        if self.link.progress()? {
            self.last_activity = Instant::now();
            *spins = 0;
            return Ok(());
        }
        *spins += 1;
        if self.last_activity.elapsed() < spin_window() {
            if spins.is_multiple_of(1024) {
                self.check_anchor()?;
            }
            tokio::task::yield_now().await;
        } else {
            self.check_anchor()?;
            if self.last_activity.elapsed() >= KEEPALIVE
                && self.last_keepalive.elapsed() >= KEEPALIVE
            {
                self.last_keepalive = Instant::now();
                if self.link.keepalive()? {
                    self.keepalives += 1;
                }
            }
            self.idle_wait().await?;
        }
        Ok(())
    }

    /// Sleeps until a completion, the anchor stirring, or [`IDLE_WAKE`]; on a 1 ms timer when
    /// the queue pair has no completion channel.
    async fn idle_wait(&mut self) -> io::Result<()> {
        if matches!(self.idle, Idle::Unknown) {
            self.idle = match self.link.arm() {
                Ok(Some(ch)) => match AsyncCompChannel::new(&ch) {
                    Ok(a) => Idle::Events(a),
                    Err(e) => {
                        tracing::debug!(
                            "RDMA: completion channel not usable ({e}); idle waits poll"
                        );
                        Idle::Ticks
                    }
                },
                Ok(None) => Idle::Ticks,
                Err(e) => {
                    tracing::debug!("RDMA: arming completion events failed ({e}); idle waits poll");
                    Idle::Ticks
                }
            };
        } else if matches!(self.idle, Idle::Events(_)) {
            if let Err(e) = self.link.arm() {
                tracing::debug!("RDMA: arming completion events failed ({e}); idle waits poll");
                self.idle = Idle::Ticks;
            }
        }
        let Idle::Events(events) = &self.idle else {
            tokio::time::sleep(IDLE_TICK).await;
            self.timer_wakeups += 1;
            return Ok(());
        };
        // A completion queued before arming raises no event.
        if self.link.progress()? {
            self.last_activity = Instant::now();
            return Ok(());
        }
        let anchor = async {
            match &self.anchor {
                Some(a) => a.readable().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = events.wait() => {
                r?;
                self.event_wakeups += 1;
            }
            // check_anchor() on the next step tells what it was.
            _ = anchor => {}
            _ = tokio::time::sleep(IDLE_WAKE) => self.timer_wakeups += 1,
        }
        Ok(())
    }
}

impl<F: Flavored> crate::Transport for RdmaTransport<F> {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut spins = 0;
        loop {
            let n = self.link.read_available(buf)?;
            if n > 0 {
                self.last_activity = Instant::now();
                return Ok(n);
            }
            match self.step(&mut spins).await {
                Ok(()) => {}
                // The peer closed its TCP socket: end of stream, like a TCP close.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => return Ok(0),
                Err(e) => return Err(e),
            }
        }
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read(&mut buf[done..]).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection mid-message",
                ));
            }
            done += n;
        }
        Ok(())
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let mut spins = 0;
        for part in parts {
            let mut off = 0;
            let mut waiting_since: Option<Instant> = None;
            while off < part.len() {
                let n = self.link.write_part(&part[off..])?;
                if n > 0 {
                    off += n;
                    waiting_since = None;
                    self.last_activity = Instant::now();
                    continue;
                }
                let since = *waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() > SEND_TIMEOUT {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "RDMA send: no completion within 30 s",
                    ));
                }
                self.step(&mut spins).await?;
            }
        }
        self.link.end_message()?;
        let since = Instant::now();
        while !self.link.flushed() {
            if since.elapsed() > SEND_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "RDMA send: the peer returned no credits within 30 s",
                ));
            }
            self.step(&mut spins).await?;
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        self.name
    }
}
