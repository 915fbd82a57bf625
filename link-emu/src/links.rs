//! Link profiles: the round-trip time and bandwidth of the links users put between a llama.cpp
//! client and its RPC workers, with the published figure each number comes from, and the analytic
//! projection `round trips × RTT + bytes ÷ bandwidth + measured base`.
//!
//! Sources are the project's shared notes (`shared/docs/rdma-transports.md` §8 and
//! `shared/docs/peers-and-anchors.md` §6–§7), which cite the original measurements.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// TCP payload bytes per Ethernet wire byte at MTU 1500 with timestamps: 1448 of 1538
/// (preamble, header, FCS and inter-frame gap included). Turns a line rate into goodput.
pub const TCP_GOODPUT_MTU1500: f64 = 1448.0 / 1538.0;

/// Upstream Apple/UC RDMA flavor: one SEND per 128 KiB stride, whatever its fill
/// (rdma-transports.md §4.1, §4.6).
pub const UC_STRIDE: u64 = 128 * 1024;
/// Payload bytes per Apple/UC stride (stride minus the 8-byte frame header).
pub const UC_PAYLOAD: u64 = UC_STRIDE - 8;

/// How bytes of one protocol message occupy the wire, for projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireFraming {
    /// A byte stream: a message costs its own length (TCP, Linux RC RDMA).
    Stream,
    /// Upstream Apple/UC RDMA: every message is padded to whole 128 KiB strides.
    AppleUcStrides,
}

/// Whether a profile can be put between client and server, or only projected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// No emulation: the path as it is (loopback here, or the real network to `--server`).
    Native,
    /// Emulated in user space by the relay (delay + bandwidth limit).
    Emulated,
    /// Only projected from published figures (RDMA cannot be emulated by a TCP relay).
    ProjectedOnly,
}

impl LinkKind {
    /// `native`, `emulated`, `projected only`.
    pub fn label(self) -> &'static str {
        match self {
            LinkKind::Native => "native",
            LinkKind::Emulated => "emulated",
            LinkKind::ProjectedOnly => "projected only",
        }
    }
}

/// A link between client and server.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkProfile {
    /// Short name used on the command line and in tables (`2.5gbe`, `tb5-tcp`, ...).
    pub name: String,
    /// Round-trip time of a small message (both network stacks included).
    pub rtt: Duration,
    /// Payload bandwidth per direction in Gbit/s (`None`: not limited).
    pub gbps: Option<f64>,
    /// Emulated, native or projection-only.
    pub kind: LinkKind,
    /// Wire framing used by projections.
    pub framing: WireFraming,
    /// Where the figures come from.
    pub source: &'static str,
}

impl LinkProfile {
    /// No emulation.
    pub fn none() -> LinkProfile {
        LinkProfile {
            name: "none".into(),
            rtt: Duration::ZERO,
            gbps: None,
            kind: LinkKind::Native,
            framing: WireFraming::Stream,
            source:
                "no emulation: loopback here, or the real network between this machine and --server",
        }
    }

    /// 2.5 GbE, TCP.
    pub fn gbe2_5() -> LinkProfile {
        LinkProfile {
            name: "2.5gbe".into(),
            rtt: Duration::from_micros(56),
            gbps: Some(2.5 * TCP_GOODPUT_MTU1500),
            kind: LinkKind::Emulated,
            framing: WireFraming::Stream,
            source: "RTT 56 us = 2 x 28 us one-way (RXE over 2.5 GbE, ib_write_lat 64 B: no TCP RTT is \
                     published, this kernel-stack figure is the proxy); 2.354 Gbit/s = 2.5 Gbit/s x \
                     1448/1538 TCP goodput (RXE measured ~2.3 Gbit/s) -- rdma-transports.md §8.2 \
                     (blog.hellas.ai thunderbolt-ibverbs), peers-and-anchors.md §6.2",
        }
    }

    /// 10 GbE, TCP.
    pub fn gbe10() -> LinkProfile {
        LinkProfile {
            name: "10gbe".into(),
            rtt: Duration::from_micros(31),
            gbps: Some(10.0 * TCP_GOODPUT_MTU1500),
            kind: LinkKind::Emulated,
            framing: WireFraming::Stream,
            source: "RTT 31 us: the 25 GbE TCP figure of llama.cpp's ggml-rpc feature-readme, the proxy \
                     rdma-transports.md §8.2 names for the unpublished 10 GbE TCP RTT (gap); 9.41 Gbit/s = \
                     10 Gbit/s x 1448/1538 TCP goodput -- peers-and-anchors.md §6.2",
        }
    }

    /// Thunderbolt 5, TCP over the Thunderbolt IP interface.
    pub fn tb5_tcp() -> LinkProfile {
        LinkProfile {
            name: "tb5-tcp".into(),
            rtt: Duration::from_micros(341),
            gbps: Some(55.0),
            kind: LinkKind::Emulated,
            framing: WireFraming::Stream,
            source: "direct TB5, TCP over TB IP: RTT 0.341 ms (min; avg 0.575, max 0.698; 0.38-0.95 under load), \
                     iperf3 4 streams 52.6-56.1 Gbit/s (55 used) -- exo PR #2063 via rdma-transports.md §8.1, \
                     peers-and-anchors.md §7",
        }
    }

    /// Thunderbolt 5, RDMA (Apple UC verbs): projection only.
    pub fn tb5_rdma() -> LinkProfile {
        LinkProfile {
            name: "tb5-rdma".into(),
            rtt: Duration::from_nanos(9_280),
            gbps: Some(75.0),
            kind: LinkKind::ProjectedOnly,
            framing: WireFraming::AppleUcStrides,
            source: "RDMA UC ib_send_lat 4 KiB avg 4.64 us one-way (RTT 9.28 us), ib_send_bw 64 KiB 75.0 Gbit/s -- \
                     hellas-ai/thunderbolt-ibverbs PR #27 via rdma-transports.md §8.1; upstream Apple flavor pads \
                     every message to 128 KiB strides (§4.6); strict-order 1 MiB streams reach only \
                     14.7-15.9 Gbit/s (PR #44), so this is optimistic for large messages",
        }
    }

    /// Every named profile, in display order (`none` first, projection-only last).
    pub fn all_named() -> Vec<LinkProfile> {
        vec![
            Self::none(),
            Self::gbe2_5(),
            Self::gbe10(),
            Self::tb5_tcp(),
            Self::tb5_rdma(),
        ]
    }

    /// Bytes per second (`None`: unlimited).
    pub fn bytes_per_sec(&self) -> Option<f64> {
        self.gbps.map(|g| g * 1e9 / 8.0)
    }

    /// One-way delay used by the emulator (half the RTT).
    pub fn one_way(&self) -> Duration {
        self.rtt / 2
    }

    /// Whether the relay can emulate this profile (or pass through for `none`).
    pub fn runnable(&self) -> bool {
        self.kind != LinkKind::ProjectedOnly
    }

    /// Wire bytes of one message of `len` bytes under this profile's framing.
    pub fn wire_bytes(&self, len: u64) -> u64 {
        match self.framing {
            WireFraming::Stream => len,
            WireFraming::AppleUcStrides => {
                len.div_ceil(UC_PAYLOAD).max(1).saturating_mul(UC_STRIDE)
            }
        }
    }

    /// The link's own cost for `round_trips` blocking round trips carrying `bytes` of stream
    /// payload (or `uc_bytes` when the profile pads messages to Apple/UC strides).
    pub fn link_cost(&self, round_trips: f64, bytes: f64, uc_bytes: f64) -> Duration {
        let wire = match self.framing {
            WireFraming::Stream => bytes,
            WireFraming::AppleUcStrides => uc_bytes,
        };
        let ser = self.bytes_per_sec().map_or(0.0, |bps| wire / bps);
        Duration::from_secs_f64((round_trips * self.rtt.as_secs_f64() + ser).max(0.0))
    }

    /// Analytic projection: `base + round_trips × RTT + bytes ÷ bandwidth`, where `base` is the
    /// time measured without emulation (compute, loopback and relay included).
    pub fn project(&self, base: Duration, round_trips: f64, bytes: f64, uc_bytes: f64) -> Duration {
        base + self.link_cost(round_trips, bytes, uc_bytes)
    }

    /// One line describing the figures: `RTT 56 us, 2.354 Gbit/s`.
    pub fn figures(&self) -> String {
        let bw = self
            .gbps
            .map_or("unlimited".to_string(), |g| format!("{g:.3} Gbit/s"));
        format!("RTT {}, {bw}", fmt_dur(self.rtt))
    }
}

impl fmt::Display for LinkProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Why a link name could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("unknown link {0:?}: use none, 2.5gbe, 10gbe, tb5-tcp, tb5-rdma (projected) or custom:RTT_US:GBIT_S")]
pub struct BadLink(String);

impl FromStr for LinkProfile {
    type Err = BadLink;

    /// Parses `none`, `2.5gbe`, `10gbe`, `tb5-tcp`, `tb5-rdma` or `custom:RTT_US:GBIT_S`
    /// (e.g. `custom:200:1` = 200 µs RTT, 1 Gbit/s; `GBIT_S` 0 = unlimited).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        if let Some(rest) = lower.strip_prefix("custom:") {
            let (rtt, gbps) = rest.split_once(':').ok_or_else(|| BadLink(s.into()))?;
            let rtt: f64 = rtt.parse().map_err(|_| BadLink(s.into()))?;
            let gbps: f64 = gbps.parse().map_err(|_| BadLink(s.into()))?;
            if !(rtt.is_finite() && rtt >= 0.0 && gbps.is_finite() && gbps >= 0.0) {
                return Err(BadLink(s.into()));
            }
            return Ok(LinkProfile {
                name: format!("custom-{rtt}us-{gbps}g"),
                rtt: Duration::from_secs_f64(rtt * 1e-6),
                gbps: (gbps > 0.0).then_some(gbps),
                kind: LinkKind::Emulated,
                framing: WireFraming::Stream,
                source: "user-defined (custom:RTT_US:GBIT_S)",
            });
        }
        match lower.as_str() {
            "none" | "loopback" | "native" => Ok(Self::none()),
            "2.5gbe" | "2.5g" | "2500" => Ok(Self::gbe2_5()),
            "10gbe" | "10g" => Ok(Self::gbe10()),
            "tb5-tcp" | "tb5" | "tb5tcp" => Ok(Self::tb5_tcp()),
            "tb5-rdma" | "tb5rdma" => Ok(Self::tb5_rdma()),
            _ => Err(BadLink(s.into())),
        }
    }
}

/// Parses a comma-separated list of links (`all` = every named profile).
pub fn parse_links(s: &str) -> Result<Vec<LinkProfile>, BadLink> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(LinkProfile::all_named());
    }
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect()
}

/// Formats a duration compactly: `850 ns`, `12.3 us`, `4.56 ms`, `1.23 s`.
pub fn fmt_dur(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.3} s", ns / 1e9)
    }
}

/// Help text listing the profiles and their sources (for `--help`).
pub const PROFILES_HELP: &str = "\
Link profiles (figures from shared/docs/rdma-transports.md §8 and peers-and-anchors.md §6-§7):
  none      no emulation (loopback here; the real network when --server is another machine)
  2.5gbe    RTT 56 us, 2.354 Gbit/s   (2 x 28 us RXE one-way over 2.5 GbE, proxy: no TCP RTT published;
                                      2.5 Gbit/s x 1448/1538 TCP goodput; RXE measured ~2.3 Gbit/s)
  10gbe     RTT 31 us, 9.41 Gbit/s    (25 GbE TCP 31 us from llama.cpp feature-readme, the docs' proxy for
                                      the 10 GbE gap; 10 Gbit/s x 1448/1538)
  tb5-tcp   RTT 341 us, 55 Gbit/s     (direct Thunderbolt 5, TCP over TB IP: ping min 0.341 / avg 0.575 ms,
                                      iperf3 4 streams 52.6-56.1 Gbit/s; exo PR #2063)
  tb5-rdma  RTT 9.28 us, 75 Gbit/s    PROJECTED ONLY (Apple UC verbs ib_send_lat 4 KiB 4.64 us one-way,
                                      ib_send_bw 75.0 Gbit/s; hellas thunderbolt-ibverbs PR #27; messages
                                      padded to 128 KiB strides as upstream's Apple flavor does)
  custom:RTT_US:GBIT_S   e.g. custom:200:1 (GBIT_S 0 = unlimited)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_profiles() {
        let l = parse_links("none,2.5gbe,10gbe,tb5-tcp,tb5-rdma,custom:200:1").unwrap();
        assert_eq!(l.len(), 6);
        assert_eq!(l[1].rtt, Duration::from_micros(56));
        assert_eq!(l[4].kind, LinkKind::ProjectedOnly);
        assert_eq!(l[5].rtt, Duration::from_micros(200));
        assert_eq!(l[5].gbps, Some(1.0));
        assert!("foo".parse::<LinkProfile>().is_err());
        assert!("custom:-1:1".parse::<LinkProfile>().is_err());
        assert_eq!(parse_links("all").unwrap().len(), 5);
    }

    #[test]
    fn projection_is_rtt_plus_serialisation() {
        let l: LinkProfile = "custom:100:8".parse().unwrap(); // 1 GB/s
        let p = l.project(Duration::from_millis(1), 2.0, 1e6, 0.0);
        // 1 ms + 2 × 100 µs + 1 MB ÷ 1 GB/s = 2.2 ms
        assert!((p.as_secs_f64() - 2.2e-3).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn uc_strides_pad_messages() {
        let l = LinkProfile::tb5_rdma();
        assert_eq!(l.wire_bytes(13), UC_STRIDE);
        assert_eq!(l.wire_bytes(UC_PAYLOAD), UC_STRIDE);
        assert_eq!(l.wire_bytes(UC_PAYLOAD + 1), 2 * UC_STRIDE);
        assert_eq!(LinkProfile::gbe10().wire_bytes(13), 13);
    }
}
