//! The control line between the front and a session process (`handoff/`, `child/`), as typed messages:
//! one encoder and one decoder each way, lines bounded while they are read, a rate bound, and
//! the clamp on reported counters. The front trusts nothing a session says: a malformed or
//! unknown message, an over-long line, or more messages than the rate bound allows end the
//! session (the front kills its process and logs why).
//!
//! | from | line | message |
//! |---|---|---|
//! | session | `R <bytes>` | [`ToFront::Reserve`]: may I hold `bytes` more? answered `Y` or `N` |
//! | session | `F <bytes>` | [`ToFront::Free`]: I freed `bytes` |
//! | session | `S <n> <n> ...` | [`ToFront::Stats`]: counters since the last `S` (the order of `stats::reported_counters`) |
//! | session | `C <160 hex>` | [`ToFront::CommInit`]: COMM_INIT's 80 bytes: set up the link to the peer server for me |
//! | session | `W <bytes>` | [`ToFront::Store`]: an upload of `bytes` for the weight cache: a staging file for it, please |
//! | session | `D` | [`ToFront::Stored`]: the staging file holds the upload |
//! | session | `V <16 hex>` | [`ToFront::Check`]: I hashed the cache entry of this hash: check it (record or delete) |
//! | session | `O <16 hex>` | [`ToFront::Open`]: open the cache entry of this hash for me (Linux: a session reads no cache directory) |
//! | front | `Y` / `N` | [`ToSession::Yes`] / [`ToSession::No`]: the answer to `R` |
//! | front | `K` + a socket (`SCM_RIGHTS`) / `E` | [`ToSession::Link`] / [`ToSession::NoLink`]: the answer to `C` |
//! | front | `M` + a memfd (`SCM_RIGHTS`) / `X` | [`ToSession::Staging`] / [`ToSession::NoStaging`]: the answer to `W` |
//! | front | `H` or `G` + the entry (`SCM_RIGHTS`) / `U` | [`ToSession::Entry`] (`H`: recorded as verified with this file's stamp; `G`: to be hashed) / [`ToSession::NoEntry`]: the answer to `O` |
//! | front | `Q` | [`ToSession::Quit`]: the server is shutting down: finish the running command and exit |
//!
//! A pooled session process (`--session-pool`) is started before its connection exists: it
//! sets up its containment and opens its devices from the message in its environment, then
//! waits on the control line for one line, `A <SessionStart as JSON>`
//! ([`SessionStart::assignment`], at most [`MAX_ASSIGNMENT`] bytes), which carries the client's
//! socket (`SCM_RIGHTS`); from there on the line is the table's.
//!
//! Numbers are decimal digits only (no sign, at most 20, no overflow), hashes 16 hex digits;
//! fields are separated by exactly one space; a line ends with `\n` and holds at most
//! [`MAX_LINE`] bytes.

use std::time::Instant;

/// Longest line either side sends, newline included (an `S` line of [`MAX_STATS_FIELDS`]
/// counters of 20 digits fits).
pub const MAX_LINE: usize = 24 << 10;
/// Most counters an `S` line may carry (the front also requires exactly its own count).
pub const MAX_STATS_FIELDS: usize = 1000;
/// The rate bound: messages per second a session may send, sustained...
pub const RATE_PER_SEC: f64 = 5000.0;
/// ... and in a burst.
pub const BURST: f64 = 10_000.0;
/// A line costs one message of the rate bound per started [`BYTES_PER_MESSAGE`] bytes (so the
/// bound is also ~1.3 MB/s: a flood of long `S` lines costs the front no more than short ones).
pub const BYTES_PER_MESSAGE: usize = 256;
/// The counter clamp: no counter may grow by more than this per second of the session's life
/// (plus one second), summed over its reports: ≈ 137 G, above any byte rate of a link and any
/// nanoseconds of computing per second.
pub const COUNTER_PER_SEC: u64 = 1 << 37;

/// The exit status of a session process refused because its containment could not be set up.
pub const SANDBOX_REFUSED: i32 = 70;

/// The environment variable that carries a session process's [`SessionStart`] (readable only by
/// its own user and root, unlike the command line).
pub const SESSION_START_ENV: &str = "RPC_SESSION_START";

/// Everything a session process is configured from, sent by its front as one message: the
/// server's options (limits already resolved against the devices) and the client's connection.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionStart {
    pub options: crate::options::ServerOptions,
    /// The client's HELLO caps.
    pub caps: [u8; rpc_proto::CONN_CAPS_SIZE],
    /// The header of the first command, when the front answered the HELLO.
    pub pending: Option<[u8; rpc_proto::FRAME_HEADER_SIZE]>,
    /// The client's address, for the logs.
    pub peer: String,
    /// The protocol major of the listener the client came in on.
    pub major: u8,
    /// The front has no RDMA place for this session: stay on TCP.
    pub tcp_only: bool,
}

impl SessionStart {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(s: &str) -> Result<SessionStart, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    /// The message this process was started with (`None`: none in the environment).
    pub fn from_env() -> Option<Result<SessionStart, String>> {
        let v = std::env::var(SESSION_START_ENV).ok()?;
        Some(SessionStart::decode(&v))
    }

    /// The line that hands this connection to a waiting session process (newline included;
    /// the client's socket travels with it).
    pub fn assignment(&self) -> Vec<u8> {
        let mut v = b"A ".to_vec();
        v.extend_from_slice(self.encode().as_bytes());
        v.push(b'\n');
        v
    }

    /// An assignment line, without its newline.
    pub fn from_assignment(line: &[u8]) -> Result<SessionStart, String> {
        if line.len() >= MAX_ASSIGNMENT {
            return Err(format!("assignment over {MAX_ASSIGNMENT} bytes"));
        }
        let json = line.strip_prefix(b"A ").ok_or("not an assignment line")?;
        let json = std::str::from_utf8(json).map_err(|_| "assignment not UTF-8")?;
        SessionStart::decode(json)
    }
}

/// Longest assignment line ([`SessionStart::assignment`]), newline included.
pub const MAX_ASSIGNMENT: usize = 1 << 20;

/// Session → front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToFront {
    Reserve(u64),
    Free(u64),
    Stats(Vec<u64>),
    CommInit([u8; rpc_proto::COMM_INIT_SIZE]),
    Store(u64),
    Stored,
    Check(u64),
    Open(u64),
}

/// Front → session (`Link`, `Staging` and `Entry` travel with a descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToSession {
    Yes,
    No,
    Link,
    NoLink,
    Staging,
    NoStaging,
    /// A cache entry, opened read-only; `verified`: the front has it recorded as hashing right
    /// with the stamp of this very file.
    Entry {
        verified: bool,
    },
    NoEntry,
    Quit,
}

/// Why a control line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("line over {MAX_LINE} bytes")]
    TooLong,
    #[error("malformed line: {0}")]
    Malformed(&'static str),
    #[error("unknown message {0:?}")]
    Unknown(String),
    #[error("more than {RATE_PER_SEC} messages (or {BYTES_PER_MESSAGE}-byte pieces of a line) per second")]
    Flood,
    #[error("{got} counters where {want} were expected")]
    FieldCount { got: usize, want: usize },
    #[error("out of order: {0}")]
    OutOfOrder(&'static str),
    #[error("a link it may not have: {0}")]
    Link(String),
    #[error("a staging file it may not keep: {0}")]
    Staging(&'static str),
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A decimal u64: digits only, no sign, no empty string, no overflow.
fn number(s: &str) -> Result<u64, ControlError> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ControlError::Malformed("not a number"));
    }
    s.parse()
        .map_err(|_| ControlError::Malformed("number too large"))
}

/// Exactly `2 * N` lowercase or uppercase hex digits.
fn hex_bytes<const N: usize>(s: &str) -> Result<[u8; N], ControlError> {
    let mut out = [0u8; N];
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ControlError::Malformed("bad hex"));
    }
    for (i, c) in out.iter_mut().enumerate() {
        *c = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| ControlError::Malformed("bad hex"))?;
    }
    Ok(out)
}

impl ToFront {
    /// The line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let s = match self {
            ToFront::Reserve(n) => format!("R {n}"),
            ToFront::Free(n) => format!("F {n}"),
            ToFront::Stats(v) => {
                let mut s = String::from("S");
                for n in v {
                    s.push_str(&format!(" {n}"));
                }
                s
            }
            ToFront::CommInit(b) => format!("C {}", hex(b)),
            ToFront::Store(n) => format!("W {n}"),
            ToFront::Stored => "D".to_string(),
            ToFront::Check(h) => format!("V {h:016x}"),
            ToFront::Open(h) => format!("O {h:016x}"),
        };
        let mut v = s.into_bytes();
        v.push(b'\n');
        v
    }

    /// One line, without its newline.
    pub fn decode(line: &[u8]) -> Result<ToFront, ControlError> {
        if line.len() >= MAX_LINE {
            return Err(ControlError::TooLong);
        }
        let line = std::str::from_utf8(line).map_err(|_| ControlError::Malformed("not UTF-8"))?;
        let (tag, rest) = match line.split_once(' ') {
            Some((t, r)) => (t, Some(r)),
            None => (line, None),
        };
        let one = |r: Option<&str>| -> Result<u64, ControlError> {
            let r = r.ok_or(ControlError::Malformed("missing argument"))?;
            number(r)
        };
        match tag {
            "R" => Ok(ToFront::Reserve(one(rest)?)),
            "F" => Ok(ToFront::Free(one(rest)?)),
            "W" => Ok(ToFront::Store(one(rest)?)),
            "S" => {
                let r = rest.ok_or(ControlError::Malformed("no counters"))?;
                let mut v = Vec::new();
                for w in r.split(' ') {
                    if v.len() == MAX_STATS_FIELDS {
                        return Err(ControlError::FieldCount {
                            got: v.len() + 1,
                            want: MAX_STATS_FIELDS,
                        });
                    }
                    v.push(number(w)?);
                }
                Ok(ToFront::Stats(v))
            }
            "C" => Ok(ToFront::CommInit(hex_bytes(
                rest.ok_or(ControlError::Malformed("missing argument"))?,
            )?)),
            "V" => Ok(ToFront::Check(u64::from_be_bytes(hex_bytes(
                rest.ok_or(ControlError::Malformed("missing argument"))?,
            )?))),
            "O" => Ok(ToFront::Open(u64::from_be_bytes(hex_bytes(
                rest.ok_or(ControlError::Malformed("missing argument"))?,
            )?))),
            "D" if rest.is_none() => Ok(ToFront::Stored),
            "D" => Err(ControlError::Malformed("D takes no argument")),
            _ => Err(ControlError::Unknown(tag.chars().take(16).collect())),
        }
    }
}

impl ToSession {
    /// The line, newline included.
    pub fn encode(self) -> &'static [u8] {
        match self {
            ToSession::Yes => b"Y\n",
            ToSession::No => b"N\n",
            ToSession::Link => b"K\n",
            ToSession::NoLink => b"E\n",
            ToSession::Staging => b"M\n",
            ToSession::NoStaging => b"X\n",
            ToSession::Entry { verified: true } => b"H\n",
            ToSession::Entry { verified: false } => b"G\n",
            ToSession::NoEntry => b"U\n",
            ToSession::Quit => b"Q\n",
        }
    }

    /// One line, without its newline.
    pub fn decode(line: &[u8]) -> Result<ToSession, ControlError> {
        Ok(match line {
            b"Y" => ToSession::Yes,
            b"N" => ToSession::No,
            b"K" => ToSession::Link,
            b"E" => ToSession::NoLink,
            b"M" => ToSession::Staging,
            b"X" => ToSession::NoStaging,
            b"H" => ToSession::Entry { verified: true },
            b"G" => ToSession::Entry { verified: false },
            b"U" => ToSession::NoEntry,
            b"Q" => ToSession::Quit,
            _ if line.len() >= MAX_LINE => return Err(ControlError::TooLong),
            other => {
                return Err(ControlError::Unknown(
                    String::from_utf8_lossy(other).chars().take(16).collect(),
                ))
            }
        })
    }

    /// Whether a descriptor travels with this message.
    pub fn carries_fd(self) -> bool {
        matches!(
            self,
            ToSession::Link | ToSession::Staging | ToSession::Entry { .. }
        )
    }
}

/// Splits bytes as they arrive into lines of at most [`MAX_LINE`] bytes (newline included),
/// holding at most that many bytes of an unfinished line: an over-long line is an error as
/// soon as its first [`MAX_LINE`] bytes are in, not after it was buffered whole.
#[derive(Debug, Default)]
pub struct LineSplitter {
    pending: Vec<u8>,
    failed: bool,
}

impl LineSplitter {
    /// Bytes that arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// The next whole line (without its newline), `None` when more bytes are needed. After an
    /// error the splitter stays failed.
    pub fn next_line(&mut self) -> Option<Result<Vec<u8>, ControlError>> {
        if self.failed {
            return Some(Err(ControlError::TooLong));
        }
        let scan = self.pending.len().min(MAX_LINE);
        match self.pending[..scan].iter().position(|&b| b == b'\n') {
            Some(end) => {
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                line.pop();
                Some(Ok(line))
            }
            None if self.pending.len() >= MAX_LINE => {
                self.failed = true;
                self.pending = Vec::new();
                Some(Err(ControlError::TooLong))
            }
            None => None,
        }
    }

    /// Bytes held (for tests: never more than [`MAX_LINE`] plus one read's worth).
    pub fn held(&self) -> usize {
        self.pending.len()
    }
}

/// A token bucket: `rate` tokens per second, at most `burst` held.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// The control line's bound ([`RATE_PER_SEC`], [`BURST`]).
    pub fn messages(now: Instant) -> TokenBucket {
        TokenBucket::new(RATE_PER_SEC, BURST, now)
    }

    /// Takes `n` tokens if there are that many.
    pub fn take(&mut self, n: f64, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }
}

/// The front's check of `S` lines: exactly its own number of counters, and no counter grown
/// by more than [`COUNTER_PER_SEC`] per second of the session's life (plus one), summed.
#[derive(Debug)]
pub struct StatsGate {
    reported: Vec<u64>,
    start: Instant,
}

impl StatsGate {
    pub fn new(fields: usize, start: Instant) -> StatsGate {
        StatsGate {
            reported: vec![0; fields],
            start,
        }
    }

    /// The deltas to add (each clamped to what is left of its allowance), and whether any was
    /// clamped; an error when the number of counters differs.
    pub fn admit(
        &mut self,
        deltas: &[u64],
        now: Instant,
    ) -> Result<(Vec<u64>, bool), ControlError> {
        if deltas.len() != self.reported.len() {
            return Err(ControlError::FieldCount {
                got: deltas.len(),
                want: self.reported.len(),
            });
        }
        let secs = now.saturating_duration_since(self.start).as_secs() + 1;
        let allowance = COUNTER_PER_SEC.saturating_mul(secs);
        let mut clamped = false;
        let out = deltas
            .iter()
            .zip(self.reported.iter_mut())
            .map(|(&d, r)| {
                let d2 = d.min(allowance.saturating_sub(*r));
                clamped |= d2 != d;
                *r += d2;
                d2
            })
            .collect();
        Ok((out, clamped))
    }
}

/// The front's view of one session's messages: the rate bound, then the decoder.
#[derive(Debug)]
pub struct Inbound {
    bucket: TokenBucket,
}

impl Inbound {
    pub fn new(now: Instant) -> Inbound {
        Inbound {
            bucket: TokenBucket::messages(now),
        }
    }

    /// One line (without its newline) as a message, or why the session must end.
    pub fn message(&mut self, line: &[u8], now: Instant) -> Result<ToFront, ControlError> {
        let cost = line.len().div_ceil(BYTES_PER_MESSAGE).max(1);
        if !self.bucket.take(cost as f64, now) {
            return Err(ControlError::Flood);
        }
        ToFront::decode(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn all_to_front() -> Vec<ToFront> {
        let mut init = [0u8; rpc_proto::COMM_INIT_SIZE];
        for (i, b) in init.iter_mut().enumerate() {
            *b = (i * 31 + 7) as u8;
        }
        vec![
            ToFront::Reserve(0),
            ToFront::Reserve(u64::MAX),
            ToFront::Free(4096),
            ToFront::Stats(vec![0, 1, u64::MAX]),
            ToFront::Stats(vec![7; MAX_STATS_FIELDS]),
            ToFront::CommInit(init),
            ToFront::Store(1 << 30),
            ToFront::Stored,
            ToFront::Check(0x0123_4567_89ab_cdef),
            ToFront::Check(u64::MAX),
            ToFront::Open(0),
            ToFront::Open(0xfedc_ba98_7654_3210),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in all_to_front() {
            let line = m.encode();
            assert_eq!(line.last(), Some(&b'\n'));
            assert!(line.len() <= MAX_LINE, "{m:?} fits a line");
            assert_eq!(ToFront::decode(&line[..line.len() - 1]), Ok(m));
        }
        for m in [
            ToSession::Yes,
            ToSession::No,
            ToSession::Link,
            ToSession::NoLink,
            ToSession::Staging,
            ToSession::NoStaging,
            ToSession::Entry { verified: true },
            ToSession::Entry { verified: false },
            ToSession::NoEntry,
            ToSession::Quit,
        ] {
            let line = m.encode();
            assert_eq!(ToSession::decode(&line[..line.len() - 1]), Ok(m));
        }
    }

    #[test]
    fn an_assignment_round_trips_in_one_line() {
        let mut options = crate::options::ServerOptions::default();
        options.session.gguf = vec!["/models/a\nb.gguf".into()];
        let start = SessionStart {
            options,
            caps: [7; rpc_proto::CONN_CAPS_SIZE],
            pending: Some([1; rpc_proto::FRAME_HEADER_SIZE]),
            peer: "10.0.0.1:5000".into(),
            major: 7,
            tcp_only: true,
        };
        let line = start.assignment();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        assert_eq!(line.last(), Some(&b'\n'));
        let back = SessionStart::from_assignment(&line[..line.len() - 1]).unwrap();
        assert_eq!(back, start);
        for bad in [&b""[..], b"A", b"A {", b"B {}", b"A \xff", b"Q"] {
            assert!(SessionStart::from_assignment(bad).is_err(), "{bad:?}");
        }
        let mut huge = b"A ".to_vec();
        huge.resize(MAX_ASSIGNMENT, b' ');
        assert!(SessionStart::from_assignment(&huge).is_err());
    }

    #[test]
    fn every_malformed_line_is_refused() {
        let bad: &[&[u8]] = &[
            b"",
            b" ",
            b"R",
            b"R ",
            b"R  5",
            b"R 5 ",
            b"R 5 6",
            b"R -5",
            b"R +5",
            b"R 0x10",
            b"R 18446744073709551616",
            b"R 99999999999999999999999",
            b"R five",
            b"r 5",
            b"F",
            b"F 1.5",
            b"W",
            b"W -1",
            b"S",
            b"S ",
            b"S 1  2",
            b"S 1 2 ",
            b"S 1 x",
            b"C",
            b"C 00",
            b"C zz",
            b"V",
            b"V 123",
            b"V 0123456789abcdefg",
            b"V 0123456789abcdeg",
            b"O",
            b"O ",
            b"O 123",
            b"O 0123456789abcdef0",
            b"O 0123456789abcdeg",
            b"O ../../etc/passwd",
            b"O 0123456789abcdef ",
            b"D 1",
            b"D ",
            b"Q",
            b"Y",
            b"R \xff",
            b"\xff\xfe",
            b"HELLO",
        ];
        for l in bad {
            assert!(
                ToFront::decode(l).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(l)
            );
        }
        let long_c = format!("C {}", "0".repeat(2 * rpc_proto::COMM_INIT_SIZE + 2));
        assert!(ToFront::decode(long_c.as_bytes()).is_err());
        let too_many = format!("S{}", " 1".repeat(MAX_STATS_FIELDS + 1));
        assert!(matches!(
            ToFront::decode(too_many.as_bytes()),
            Err(ControlError::FieldCount { .. })
        ));
        assert!(matches!(
            ToFront::decode(&vec![b'R'; MAX_LINE]),
            Err(ControlError::TooLong)
        ));
        for l in [&b""[..], b"y", b"YY", b"K \x01", b"Z", b"H 1", b"h", b"U "] {
            assert!(ToSession::decode(l).is_err());
        }
    }

    #[test]
    fn an_over_long_line_fails_before_it_is_buffered() {
        let mut s = LineSplitter::default();
        s.push(b"R 1\nF 2\nR");
        assert_eq!(s.next_line(), Some(Ok(b"R 1".to_vec())));
        assert_eq!(s.next_line(), Some(Ok(b"F 2".to_vec())));
        assert_eq!(s.next_line(), None, "a partial line waits");
        s.push(b" 3\n");
        assert_eq!(s.next_line(), Some(Ok(b"R 3".to_vec())));
        // A line without end: refused once MAX_LINE bytes are in, and nothing more is held.
        let chunk = vec![b'1'; 4096];
        let mut failed = false;
        for _ in 0..(MAX_LINE / chunk.len() + 2) {
            s.push(&chunk);
            assert!(s.held() <= MAX_LINE + chunk.len());
            if let Some(r) = s.next_line() {
                assert_eq!(r, Err(ControlError::TooLong));
                failed = true;
                break;
            }
        }
        assert!(failed);
        assert_eq!(s.held(), 0);
        s.push(b"R 1\n");
        assert_eq!(
            s.next_line(),
            Some(Err(ControlError::TooLong)),
            "stays failed"
        );
        // A line of exactly MAX_LINE - 1 bytes and its newline is fine.
        let mut s = LineSplitter::default();
        let mut l = vec![b'x'; MAX_LINE - 1];
        l.push(b'\n');
        s.push(&l);
        assert_eq!(
            s.next_line().map(|r| r.map(|v| v.len())),
            Some(Ok(MAX_LINE - 1))
        );
    }

    #[test]
    fn a_flood_is_cut_off_and_a_steady_rate_is_not() {
        let t0 = Instant::now();
        let mut inb = Inbound::new(t0);
        // The burst, all at one instant, then the next message is a flood.
        for _ in 0..BURST as usize {
            assert!(inb.message(b"F 1", t0).is_ok());
        }
        assert_eq!(inb.message(b"F 1", t0), Err(ControlError::Flood));
        // At the sustained rate, forever fine.
        let mut inb = Inbound::new(t0);
        let step = Duration::from_secs_f64(1.0 / RATE_PER_SEC);
        for i in 0..(3 * BURST as u32) {
            assert!(inb.message(b"F 1", t0 + step * i).is_ok(), "message {i}");
        }
        // Twice the rate: cut off within a few seconds.
        let mut inb = Inbound::new(t0);
        let fast = step / 2;
        let cut = (0..(10 * BURST as u32)).find(|&i| inb.message(b"F 1", t0 + fast * i).is_err());
        assert!(cut.is_some_and(|i| i >= BURST as u32));
        // Long lines count by their length: a burst of 24 KiB lines is cut off ~100 times sooner.
        let mut inb = Inbound::new(t0);
        let long = format!("S{}", " 12345678901234567890".repeat(MAX_STATS_FIELDS));
        let cut = (0..BURST as u32).find(|_| inb.message(long.as_bytes(), t0).is_err());
        let per_line = long.len().div_ceil(BYTES_PER_MESSAGE) as u32;
        assert_eq!(cut, Some(BURST as u32 / per_line));
    }

    #[test]
    fn counters_must_match_in_number_and_are_clamped_by_time() {
        let t0 = Instant::now();
        let mut g = StatsGate::new(3, t0);
        assert!(matches!(
            g.admit(&[1, 2], t0),
            Err(ControlError::FieldCount { got: 2, want: 3 })
        ));
        assert!(g.admit(&[1, 2, 3, 4], t0).is_err());
        assert_eq!(g.admit(&[1, 2, 3], t0).unwrap(), (vec![1, 2, 3], false));
        // Within the first second: at most COUNTER_PER_SEC in all.
        let (v, clamped) = g.admit(&[u64::MAX, 0, 5], t0).unwrap();
        assert!(clamped);
        assert_eq!(v, vec![COUNTER_PER_SEC - 1, 0, 5]);
        let (v, clamped) = g.admit(&[1, 0, 0], t0).unwrap();
        assert!(clamped);
        assert_eq!(v, vec![0, 0, 0]);
        // Ten seconds later, ten more seconds' worth.
        let (v, _) = g
            .admit(&[u64::MAX, 0, 0], t0 + Duration::from_secs(10))
            .unwrap();
        assert_eq!(v[0], 10 * COUNTER_PER_SEC);
    }
}
