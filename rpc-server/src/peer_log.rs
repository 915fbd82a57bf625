//! The per-peer limit on the front's log: a `tracing` layer that charges every line a remote
//! party can cause to that party and drops what is over its budget, so that no client can flood
//! the log (and the disk under it).
//!
//! A line is charged to the peer it names: the event's own `peer` or `session.peer` field (a
//! socket address or an IP address, as text or `%` display), else the `peer` field of the
//! nearest enclosing span (`server.rs` runs each connection's work inside a `conn` span, so what
//! a connection's thread logs, a `--no-isolate` session's included, is attributed). Peers are
//! keyed as admission keys them (`admission::peer_key`: an IPv4 address, an IPv6 /64). Each key
//! has a token bucket of bytes: [`BURST`] at once and [`PER_MINUTE`] in any minute; a line costs
//! what the default `fmt` format writes for it (its fields, spans, target and a fixed overhead
//! for timestamp and level, estimated from above). A line over the budget is dropped and
//! counted; every [`SUMMARY_EVERY`] a thread (started at the first dropped line) logs one
//! `suppressed N log lines (B bytes) from peer X in the last T s` line per key that had some,
//! marked with the [`SUMMARY_FIELD`] field, which exempts it. Lines that name no peer (the
//! operator's: banner, start-up, shutdown) are never limited.
//!
//! The layer sits only in the front: a session process's log reaches the front's through
//! `handoff::relay::relay_stderr` (tagged `session.peer`), and is limited there.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{span, Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::admission::peer_key;

/// Bytes of log a peer may cause at once.
pub const BURST: f64 = 64.0 * 1024.0;
/// Bytes of log a peer may cause in any minute (the burst included).
pub const PER_MINUTE: f64 = 256.0 * 1024.0;
/// The refill, bytes per second: a burst plus a minute of refill is [`PER_MINUTE`].
pub const RATE: f64 = (PER_MINUTE - BURST) / 60.0;
/// How often the lines dropped per peer are summarized.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// The field that marks a summary line (never limited).
pub const SUMMARY_FIELD: &str = "log_summary";
/// The fields that name the peer a line concerns.
const PEER_FIELDS: [&str; 2] = ["peer", "session.peer"];
/// What a line costs beyond its fields, spans and target: the timestamp (27 bytes), the level,
/// separators and the newline, rounded up.
const LINE_OVERHEAD: usize = 48;
/// With ANSI colours: what the escape sequences add per line, and per field or span.
const ANSI_LINE: usize = 32;
const ANSI_PER_FIELD: usize = 12;
/// The number of keys at which idle ones are first pruned (then at twice what remained).
const PRUNE_AT_LEAST: usize = 1024;

/// One peer's budget, and what was dropped since its last summary.
#[derive(Debug, Clone)]
struct Budget {
    tokens: f64,
    last: Instant,
    lines: u64,
    bytes: u64,
    since: Instant,
}

impl Budget {
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * RATE).min(BURST);
    }
}

/// What was dropped of one peer's lines since its last summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Suppressed {
    pub peer: IpAddr,
    pub lines: u64,
    pub bytes: u64,
    /// From the first line dropped to the summary.
    pub over: Duration,
}

/// Every peer's budget.
#[derive(Debug, Default)]
pub struct Budgets {
    peers: HashMap<IpAddr, Budget>,
    prune_at: usize,
}

impl Budgets {
    /// Whether a line of `cost` bytes concerning `peer` is logged (then charged); one that is
    /// not is counted for the next summary.
    pub fn admit(&mut self, peer: IpAddr, cost: usize, now: Instant) -> bool {
        let key = peer_key(peer);
        if !self.peers.contains_key(&key) && self.peers.len() >= self.prune_at.max(PRUNE_AT_LEAST) {
            self.prune(now);
            self.prune_at = self.peers.len() * 2;
        }
        let b = self.peers.entry(key).or_insert(Budget {
            tokens: BURST,
            last: now,
            lines: 0,
            bytes: 0,
            since: now,
        });
        b.refill(now);
        let cost = cost as f64;
        if b.tokens >= cost {
            b.tokens -= cost;
            return true;
        }
        if b.lines == 0 {
            b.since = now;
        }
        b.lines += 1;
        b.bytes = b.bytes.saturating_add(cost as u64);
        false
    }

    /// The peers with dropped lines, their counts taken (and idle peers forgotten).
    pub fn take_suppressed(&mut self, now: Instant) -> Vec<Suppressed> {
        let mut out: Vec<Suppressed> = self
            .peers
            .iter_mut()
            .filter(|(_, b)| b.lines > 0)
            .map(|(&peer, b)| Suppressed {
                peer,
                lines: std::mem::take(&mut b.lines),
                bytes: std::mem::take(&mut b.bytes),
                over: now.saturating_duration_since(b.since),
            })
            .collect();
        out.sort_by_key(|s| s.peer);
        self.prune(now);
        out
    }

    /// Forgets the peers whose budget is full again and who have nothing to summarize: a
    /// fresh entry is the same.
    fn prune(&mut self, now: Instant) {
        self.peers.retain(|_, b| {
            b.refill(now);
            b.lines > 0 || b.tokens < BURST
        });
    }

    /// Peers remembered now.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

/// How a peer shows in a summary: an IPv4 address, an IPv6 /64.
fn shown(key: IpAddr) -> String {
    match key {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("{a}/64"),
    }
}

/// The address in a peer field's text: `1.2.3.4:5`, `[::1]:5`, `1.2.3.4`, `::1`.
pub fn parse_peer(text: &str) -> Option<IpAddr> {
    let t = text.trim().trim_matches('"');
    t.parse::<SocketAddr>()
        .map(|a| a.ip())
        .or_else(|_| t.trim_start_matches('[').trim_end_matches(']').parse())
        .ok()
}

/// Counts the bytes written to it, keeping the first [`KEPT`] of them.
#[derive(Default)]
struct Counter {
    n: usize,
    kept: String,
}

/// Bytes of a peer field's value kept to parse (an IPv6 socket address with a scope fits).
const KEPT: usize = 64;

impl std::fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.n += s.len();
        if self.kept.len() + s.len() <= KEPT {
            self.kept.push_str(s);
        }
        Ok(())
    }
}

/// What one event's or span's fields cost, and the peer they name.
#[derive(Default)]
struct Fields {
    bytes: usize,
    count: usize,
    peer: Option<IpAddr>,
    summary: bool,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let name = field.name();
        let mut c = Counter::default();
        let _ = write!(c, "{value:?}");
        if self.peer.is_none() && PEER_FIELDS.contains(&name) {
            self.peer = parse_peer(&c.kept);
        }
        if name == SUMMARY_FIELD {
            self.summary = true;
        }
        // `name=value ` (the message's name is not written: an overestimate).
        self.bytes += name.len() + 2 + c.n;
        self.count += 1;
    }
}

/// What the layer keeps on each span: the peer it names and what it adds to each line.
struct SpanCost {
    peer: Option<IpAddr>,
    bytes: usize,
}

struct Shared {
    budgets: Mutex<Budgets>,
    ansi: bool,
    /// Whether dropped lines start the summary thread (tests call [`PeerLimiter::report`]).
    reporter: bool,
    started: Once,
}

/// The layer (see the module docs); clones share the budgets.
#[derive(Clone)]
pub struct PeerLimiter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PeerLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLimiter").finish_non_exhaustive()
    }
}

impl PeerLimiter {
    /// The limiter of a log written with (`ansi`) or without colours; its summaries come from a
    /// thread of its own, started at the first dropped line.
    pub fn new(ansi: bool) -> PeerLimiter {
        PeerLimiter::with_reporter(ansi, true)
    }

    fn with_reporter(ansi: bool, reporter: bool) -> PeerLimiter {
        PeerLimiter {
            shared: Arc::new(Shared {
                budgets: Mutex::new(Budgets::default()),
                ansi,
                reporter,
                started: Once::new(),
            }),
        }
    }

    fn budgets(&self) -> std::sync::MutexGuard<'_, Budgets> {
        self.shared
            .budgets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs a summary line for each peer with dropped lines since the last.
    pub fn report(&self) {
        let suppressed = self.budgets().take_suppressed(Instant::now());
        for s in suppressed {
            let peer = shown(s.peer);
            tracing::warn!(
                peer = %peer,
                log_summary = true,
                suppressed_lines = s.lines,
                suppressed_bytes = s.bytes,
                "suppressed {} log lines ({} bytes) from peer {peer} in the last {} s (over {} KiB of log per minute per peer)",
                s.lines,
                s.bytes,
                s.over.as_secs().max(1),
                PER_MINUTE as u64 / 1024
            );
        }
    }

    fn start_reporter(&self) {
        if !self.shared.reporter {
            return;
        }
        self.shared.started.call_once(|| {
            let me = self.clone();
            // Without the thread the lines are still dropped; only their summary is missing.
            let _ = std::thread::Builder::new()
                .name("log-summary".into())
                .spawn(move || loop {
                    std::thread::sleep(SUMMARY_EVERY);
                    me.report();
                });
        });
    }

    fn ansi_extra(&self, fields: usize) -> usize {
        match self.shared.ansi {
            true => ANSI_PER_FIELD * fields,
            false => 0,
        }
    }
}

impl<S> Layer<S> for PeerLimiter
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        // `name{fields}:`
        let bytes = attrs.metadata().name().len() + 3 + f.bytes + self.ansi_extra(f.count + 1);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanCost {
                peer: f.peer,
                bytes,
            });
        }
    }

    fn event_enabled(&self, event: &Event<'_>, ctx: Context<'_, S>) -> bool {
        let mut f = Fields::default();
        event.record(&mut f);
        if f.summary {
            return true;
        }
        let mut peer = f.peer;
        let mut cost = LINE_OVERHEAD + event.metadata().target().len() + f.bytes;
        if self.shared.ansi {
            cost += ANSI_LINE + self.ansi_extra(f.count);
        }
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(s) = span.extensions().get::<SpanCost>() {
                    cost += s.bytes;
                    peer = peer.or(s.peer);
                }
            }
        }
        let Some(peer) = peer else {
            return true;
        };
        let logged = self.budgets().admit(peer, cost, Instant::now());
        if !logged {
            self.start_reporter();
        }
        logged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use tracing_subscriber::layer::SubscriberExt;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A peer gets its burst at once, then the refill: never more than [`PER_MINUTE`] bytes in
    /// a minute, however it spreads its lines; the rest is counted for the summary.
    #[test]
    fn a_peer_gets_its_burst_then_the_refill() {
        let mut b = Budgets::default();
        let t0 = Instant::now();
        let p = ip("192.0.2.7");
        let line = 200;
        let mut logged = 0usize;
        for _ in 0..10_000 {
            if b.admit(p, line, t0) {
                logged += line;
            }
        }
        assert!(logged as f64 <= BURST && logged as f64 > BURST - line as f64);
        // A minute of lines every 10 ms: the refill and nothing more.
        let mut minute = 0usize;
        for i in 1..=6000u64 {
            let now = t0 + Duration::from_millis(10 * i);
            for _ in 0..10 {
                if b.admit(p, line, now) {
                    minute += line;
                }
            }
        }
        assert!(logged + minute <= PER_MINUTE as usize + line);
        assert!(minute as f64 >= RATE * 60.0 - 2.0 * line as f64);
        let s = b.take_suppressed(t0 + Duration::from_secs(60));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].peer, p);
        let admitted = (logged + minute) / line;
        assert_eq!(s[0].lines as usize, 10_000 + 60_000 - admitted);
        assert_eq!(s[0].bytes, s[0].lines * line as u64);
        assert_eq!(s[0].over, Duration::from_secs(60), "from the first drop");
        assert!(
            b.take_suppressed(t0 + Duration::from_secs(61)).is_empty(),
            "taken"
        );
    }

    /// Peers are keyed as admission keys them: an IPv6 /64 shares one budget, another IPv4
    /// address has its own.
    #[test]
    fn peers_are_keyed_by_address_and_ipv6_64() {
        let mut b = Budgets::default();
        let t = Instant::now();
        assert!(b.admit(ip("2001:db8:1:2::1"), BURST as usize, t));
        assert!(!b.admit(ip("2001:db8:1:2:ffff::9"), 1, t), "same /64");
        assert!(b.admit(ip("2001:db8:1:3::1"), 1, t), "another /64");
        assert!(b.admit(ip("192.0.2.1"), BURST as usize, t));
        assert!(!b.admit(ip("192.0.2.1"), 1, t));
        assert!(b.admit(ip("192.0.2.2"), 1, t), "another address");
        assert!(!b.admit(ip("::ffff:192.0.2.1"), 1, t), "a mapped address");
        let s = b.take_suppressed(t);
        let peers: Vec<String> = s.iter().map(|s| shown(s.peer)).collect();
        assert_eq!(peers, ["192.0.2.1", "2001:db8:1:2::/64"]);
    }

    /// Idle peers are forgotten: the map stays bounded by the peers that logged lately.
    #[test]
    fn idle_peers_are_forgotten() {
        let mut b = Budgets::default();
        let t0 = Instant::now();
        for i in 0..5000u32 {
            let p = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert!(b.admit(p, 100, t0 + Duration::from_secs(u64::from(i) / 100)));
        }
        assert!(b.len() < 3000, "pruned while filling: {}", b.len());
        assert!(b.take_suppressed(t0 + Duration::from_secs(3600)).is_empty());
        assert!(b.is_empty());
    }

    #[test]
    fn peer_fields_parse() {
        assert_eq!(parse_peer("127.0.0.1:5050"), Some(ip("127.0.0.1")));
        assert_eq!(parse_peer("[::1]:5050"), Some(ip("::1")));
        assert_eq!(parse_peer("\"10.1.2.3\""), Some(ip("10.1.2.3")));
        assert_eq!(parse_peer("fe80::1"), Some(ip("fe80::1")));
        assert_eq!(parse_peer("somewhere"), None);
    }

    /// Counts the events that reach it (what would be written).
    #[derive(Clone, Default)]
    struct Written(Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> Layer<S> for Written {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            self.0.fetch_add(1, Relaxed);
            let mut f = Fields::default();
            event.record(&mut f);
            if f.summary {
                let mut msg = Msg::default();
                event.record(&mut msg);
                self.1.lock().unwrap().push(msg.0);
            }
        }
    }

    #[derive(Default)]
    struct Msg(String);

    impl Visit for Msg {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
            }
        }
    }

    /// Through `tracing`: a line is charged to its own `peer` / `session.peer` field, else to
    /// the enclosing span's; a line that names no peer is never dropped; the summary names the
    /// peer and is not dropped itself.
    #[test]
    fn lines_are_charged_to_the_peer_they_name_or_run_under() {
        let written = Written::default();
        let limiter = PeerLimiter::with_reporter(false, false);
        let sub = tracing_subscriber::registry()
            .with(written.clone())
            .with(limiter.clone());
        let count = || written.0.load(Relaxed);
        tracing::subscriber::with_default(sub, || {
            let flood = |n: usize| {
                for _ in 0..n {
                    tracing::warn!("COMM_INIT of a session process: no link (refused)");
                }
            };
            let span = tracing::error_span!("conn", peer = %"192.0.2.9:4000");
            span.in_scope(|| flood(10_000));
            let under_span = count();
            assert!(under_span > 100 && under_span < 1000, "{under_span}");
            // The same peer named by a field, from no span (the stderr relay's lines).
            tracing::info!(session.peer = %"192.0.2.9:4001", session.pid = 7, "session: x");
            tracing::info!(peer = %"192.0.2.9:4002", "closing connection");
            assert_eq!(count(), under_span, "the same budget");
            // Another peer, and lines of no peer, are untouched.
            tracing::info!(peer = %"192.0.2.10:1", "accepted client connection");
            flood(5000);
            assert_eq!(count(), under_span + 5001);
            // The event's own peer before the span's.
            span.in_scope(|| tracing::info!(peer = %"192.0.2.11:1", "comm link: refused"));
            assert_eq!(count(), under_span + 5002);
            limiter.report();
        });
        let summaries = written.1.lock().unwrap().clone();
        assert_eq!(summaries.len(), 1, "{summaries:?}");
        assert!(
            summaries[0].starts_with("suppressed ")
                && summaries[0].contains("from peer 192.0.2.9 "),
            "{}",
            summaries[0]
        );
    }

    /// The estimate of a line is not below what the default format writes for it.
    #[test]
    fn a_line_costs_at_least_what_is_written() {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let out = sink.clone();
        let limiter = PeerLimiter::with_reporter(false, false);
        let sub = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish()
            .with(limiter.clone());
        let t0 = Instant::now();
        tracing::subscriber::with_default(sub, || {
            let span = tracing::error_span!("conn", peer = %"[2001:db8::1]:40000");
            let _g = span.enter();
            for i in 0..400 {
                tracing::warn!(
                    session.peer = %"[2001:db8::1]:40000",
                    session.pid = 4242,
                    "session: a line \"quoted\" \u{1b}[31m {i} {}",
                    "x".repeat(i)
                );
            }
        });
        let written = sink.0.lock().unwrap().len();
        // Charged: at least what was written (the elapsed time's refill allowed).
        let charged = BURST + RATE * t0.elapsed().as_secs_f64();
        assert!(
            (written as f64) <= charged,
            "{written} bytes written, {charged} charged"
        );
        assert!(
            written as f64 > BURST / 2.0,
            "{written}: the estimate is close"
        );
        let s = limiter.budgets().take_suppressed(Instant::now());
        assert_eq!(s.len(), 1);
    }
}
