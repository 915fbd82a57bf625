//! The emulator's self-check (`rpc-bench emulator-check`): measures the link emulator against its
//! own configured figures.
//!
//! For each profile: the RTT of small ping-pongs through the relay (minus the relay's own RTT
//! without delay, measured the same way), and the throughput of a bulk one-way transfer (time
//! until the receiver acknowledges the last byte, minus one RTT). Also the precision of the
//! timer ([`wait_until`]) on this machine. Tolerances are loose on purpose: this is a
//! benchmark-style self-check for noisy machines, not a test.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::links::{LinkKind, LinkProfile};
use crate::relay::{wait_until, Relay, RelayOptions, Wire};
use crate::stats::Summary;

/// Settings of the check.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// Profiles to check (`none` is always measured first as the baseline).
    pub links: Vec<LinkProfile>,
    /// Ping-pongs per profile.
    pub pings: usize,
    /// Ping size in bytes.
    pub ping_bytes: usize,
    /// Bulk transfer duration target (the size is `bandwidth × this`, within limits).
    pub bulk_time: Duration,
    /// Rounds over all profiles; per profile the least disturbed round counts (lowest ping
    /// p50, highest bulk throughput), which filters out other load on a shared machine.
    pub rounds: usize,
}

impl CheckConfig {
    /// Progress steps of [`run`]: every ping of every link in every round.
    pub fn steps(&self) -> u64 {
        let links = 1 + self
            .links
            .iter()
            .filter(|l| l.kind == LinkKind::Emulated)
            .count();
        (self.rounds.max(1) * links * (self.pings + 10)) as u64
    }
}

/// Result for one profile.
#[derive(Debug, Clone)]
pub struct CheckRow {
    /// The profile.
    pub link: LinkProfile,
    /// Ping RTTs.
    pub rtt: Summary,
    /// Emulated part of the RTT: p50 minus the baseline p50.
    pub rtt_excess: Duration,
    /// Bulk bytes sent.
    pub bulk_bytes: u64,
    /// Measured bulk throughput, Gbit/s.
    pub gbps: f64,
    /// Verdict on the RTT.
    pub rtt_ok: bool,
    /// Verdict on the bandwidth (`None`: unlimited or host-limited).
    pub bw_ok: Option<bool>,
    /// Explanation.
    pub note: String,
}

/// Timer precision: overshoot of [`wait_until`] for deadlines 20–1000 µs away.
pub fn timer_precision(n: usize) -> Summary {
    let mut over = Vec::with_capacity(n);
    for i in 0..n {
        let d = Duration::from_micros(20 + ((i as u64 * 7919) % 980));
        let deadline = Instant::now() + d;
        wait_until(deadline);
        over.push(Instant::now() - deadline);
    }
    Summary::of(&over)
}

fn echo_server() -> io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    thread::Builder::new()
        .name("check-echo".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let _ = thread::Builder::new()
                    .name("check-echo-conn".into())
                    .spawn(move || {
                        let _ = c.set_nodelay(true);
                        if let Ok(mut r) = c.try_clone() {
                            let _ = io::copy(&mut r, &mut c);
                        }
                        let _ = c.shutdown(Shutdown::Write);
                    });
            }
        })?;
    Ok(addr)
}

/// A sink: reads a u64 length, then that many bytes, then answers one byte.
fn sink_server() -> io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    thread::Builder::new()
        .name("check-sink".into())
        .spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                let _ = thread::Builder::new()
                    .name("check-sink-conn".into())
                    .spawn(move || {
                        let _ = c.set_nodelay(true);
                        let mut len = [0u8; 8];
                        if c.read_exact(&mut len).is_err() {
                            return;
                        }
                        let mut left = u64::from_le_bytes(len);
                        let mut buf = vec![0u8; 256 * 1024];
                        while left > 0 {
                            let want = buf.len().min(left as usize);
                            match c.read(&mut buf[..want]) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => left -= n as u64,
                            }
                        }
                        let _ = c.write_all(&[1]);
                    });
            }
        })?;
    Ok(addr)
}

fn pings(
    addr: SocketAddr,
    n: usize,
    size: usize,
    pb: &indicatif::ProgressBar,
) -> io::Result<Summary> {
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let msg = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let t = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut back)?;
        if i >= 10 {
            samples.push(t.elapsed());
        }
        pb.inc(1);
    }
    Ok(Summary::of(&samples))
}

fn bulk(addr: SocketAddr, bytes: u64) -> io::Result<Duration> {
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let chunk = vec![0xa5u8; 1 << 20];
    let t = Instant::now();
    c.write_all(&bytes.to_le_bytes())?;
    let mut left = bytes;
    while left > 0 {
        let n = (chunk.len() as u64).min(left) as usize;
        c.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack)?;
    Ok(t.elapsed())
}

/// Runs the check, counting every ping on `pb` (length: [`CheckConfig::steps`]).
pub fn run(
    cfg: &CheckConfig,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<(Vec<CheckRow>, Summary)> {
    let echo = echo_server()?;
    let sink = sink_server()?;
    let mut links = vec![LinkProfile::none()];
    links.extend(
        cfg.links
            .iter()
            .filter(|l| l.kind == LinkKind::Emulated)
            .cloned(),
    );
    let rounds = cfg.rounds.max(1);
    let opts = RelayOptions {
        protocol: false,
        zero_hello_caps: false,
        ..RelayOptions::default()
    };
    // Best (least disturbed) ping summary and bulk result per link over the rounds.
    let mut best: Vec<(Option<Summary>, u64, f64)> = vec![(None, 0, 0.0); links.len()];
    for round in 0..rounds {
        for (li, link) in links.iter().enumerate() {
            pb.set_message(format!("round {}/{rounds}: {} pings", round + 1, link.name));
            let wire = if link.kind == LinkKind::Native {
                Wire::transparent()
            } else {
                Wire::of(link)
            };
            let relay_echo = Relay::start(echo, wire, opts)?;
            let rtt = pings(relay_echo.addr(), cfg.pings, cfg.ping_bytes, pb)?;
            drop(relay_echo);
            // Bulk size: about `bulk_time` worth at the configured rate (64 MiB when unlimited),
            // between 8 MiB and 512 MiB.
            let bytes = link
                .bytes_per_sec()
                .map_or(64 << 20, |bps| (bps * cfg.bulk_time.as_secs_f64()) as u64)
                .clamp(8 << 20, 512 << 20);
            pb.set_message(format!(
                "round {}/{rounds}: {} bulk {} MiB",
                round + 1,
                link.name,
                bytes >> 20
            ));
            let relay_sink = Relay::start(sink, wire, opts)?;
            let took = bulk(relay_sink.addr(), bytes)?;
            drop(relay_sink);
            let transfer = took.saturating_sub(rtt.p50).max(Duration::from_micros(1));
            let gbps = bytes as f64 * 8.0 / transfer.as_secs_f64() / 1e9;
            let b = &mut best[li];
            if b.0.as_ref().is_none_or(|s| rtt.p50 < s.p50) {
                b.0 = Some(rtt);
            }
            if gbps > b.2 {
                b.1 = bytes;
                b.2 = gbps;
            }
        }
    }
    let mut rows: Vec<CheckRow> = Vec::new();
    let mut base_rtt = Duration::ZERO;
    let mut base_gbps = f64::INFINITY;
    for (link, (rtt, bytes, gbps)) in links.into_iter().zip(best) {
        let mut row = CheckRow {
            rtt_excess: Duration::ZERO,
            bulk_bytes: bytes,
            gbps,
            rtt_ok: true,
            bw_ok: None,
            note: String::new(),
            rtt: rtt.unwrap_or_else(|| Summary::of(&[])),
            link,
        };
        if row.link.kind == LinkKind::Native {
            base_rtt = row.rtt.p50;
            base_gbps = gbps;
            row.note = "baseline: the same relay without delay (loopback + relay threads)".into();
        } else {
            row.rtt_excess = row.rtt.p50.saturating_sub(base_rtt);
            let want = row.link.rtt.as_secs_f64();
            let err = row.rtt_excess.as_secs_f64() - want;
            let tol = (want * 0.10).max(25e-6);
            row.rtt_ok = err.abs() <= tol;
            let mut notes = vec![format!(
                "RTT error {:+.1} us (tolerance ±{:.0} us)",
                err * 1e6,
                tol * 1e6
            )];
            if let Some(cfg_gbps) = row.link.gbps {
                if base_gbps < cfg_gbps * 1.5 {
                    notes.push(format!(
                        "bandwidth host-limited: the relay on loopback moves only {base_gbps:.1} Gbit/s here"
                    ));
                    row.bw_ok = None;
                } else {
                    let ratio = gbps / cfg_gbps;
                    row.bw_ok = Some((0.90..=1.05).contains(&ratio));
                    notes.push(format!("bandwidth {:.1} % of configured", ratio * 100.0));
                }
            }
            row.note = notes.join("; ");
        }
        rows.push(row);
    }
    pb.set_message("timer");
    let timer = timer_precision(2000);
    pb.finish_and_clear();
    Ok((rows, timer))
}
