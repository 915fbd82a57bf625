//! Protocol-aware traffic counting for the relay.
//!
//! The relay sees two byte streams. Client → server carries request frames
//! `| cmd u8 | size u64 LE | payload |`; the command byte says whether a response follows
//! (spec §5.1), so every command with a response is one blocking network round trip of the stock
//! client. Server → client carries responses `| size u64 LE | payload |`. The parsers here are
//! incremental (any chunking, over [`rpc_proto::Scanner`], the frame scanner rpc-shim uses too),
//! never panic, and count frames, bytes and round trips; the request
//! parser also zeroes the HELLO transport caps so an RDMA-capable client stays on TCP through the
//! relay (the relay can only carry bytes), and can move a rank 0's COMM_INIT to another port
//! ([`RequestParser::comm_rank0_port`]: so that the server-to-server link can cross an emulating
//! relay of its own).
//!
//! Command bytes are named and classified by protocol 8.0.0's table, whichever major the relayed
//! connection speaks: 0..=17 mean the same in 7.0.0, and 18..=22 (8.0's SET_TENSOR_2D,
//! GET_TENSOR_2D, COMM_INIT, COMM_ALLREDUCE, COMM_FREE) are never sent by a 7.0 client (18 is its
//! client-internal `RPC_CMD_NONE`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rpc_proto::{Command, FrameHeader, Major, Scanned, Scanner, COMM_INIT_SIZE, CONN_CAPS_SIZE};
use rpc_transport::rdma::wire::Framing;

use crate::links::LinkProfile;

/// Number of command slots (command bytes 0..=22 of 8.0.0, a superset of 7.0.0's 0..=17, plus
/// one for unknown bytes).
pub const CMD_SLOTS: usize = Command::EVERY.len() + 1;
const UNKNOWN: usize = CMD_SLOTS - 1;

/// MTUs the RDMA wire-cost counters count packets at: RoCE's common 1024 (soft-RoCE in the test
/// VM) and 4096 (Thunderbolt's frame, RoCE jumbo).
pub const WIRE_MTUS: [usize; 2] = [1024, 4096];

/// What the captured traffic would cost on the wire under one RDMA framing
/// ([`rpc_transport::rdma::wire`]); index = position in [`Framing::ALL`].
#[derive(Debug, Default)]
struct WireCounters {
    sends: AtomicU64,
    credit_sends: AtomicU64,
    bytes: AtomicU64,
    packets: [AtomicU64; WIRE_MTUS.len()],
}

/// A snapshot of one framing's [`WireCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireTraffic {
    /// SENDs by both sides.
    pub sends: u64,
    /// Of `sends`: lean credit-only frames (an upper bound).
    pub credit_sends: u64,
    /// Bytes on the wire (RDMA payloads, padding included).
    pub bytes: u64,
    /// Packets at each of [`WIRE_MTUS`].
    pub packets: [u64; WIRE_MTUS.len()],
}

impl WireTraffic {
    fn zip(self, o: WireTraffic, f: &impl Fn(u64, u64) -> u64) -> WireTraffic {
        let mut packets = [0; WIRE_MTUS.len()];
        for (i, p) in packets.iter_mut().enumerate() {
            *p = f(self.packets[i], o.packets[i]);
        }
        WireTraffic {
            sends: f(self.sends, o.sends),
            credit_sends: f(self.credit_sends, o.credit_sends),
            bytes: f(self.bytes, o.bytes),
            packets,
        }
    }

    /// Each counter divided by `k` (per repetition, per token).
    pub fn div_by(self, k: u64) -> WireTraffic {
        self.zip(self, &|a, _| a / k.max(1))
    }
}

/// Live counters shared by all connections of a relay.
#[derive(Debug, Default)]
pub struct Counters {
    wire: [WireCounters; 4],
    cmd_count: [AtomicU64; CMD_SLOTS],
    cmd_bytes: [AtomicU64; CMD_SLOTS],
    round_trips: AtomicU64,
    c2s_bytes: AtomicU64,
    s2c_bytes: AtomicU64,
    c2s_msgs: AtomicU64,
    s2c_msgs: AtomicU64,
    c2s_uc: AtomicU64,
    s2c_uc: AtomicU64,
    connections: AtomicU64,
}

/// A snapshot of [`Counters`]; subtract two snapshots for the traffic in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Request frames per command byte (last slot: unknown command bytes).
    pub cmd_count: [u64; CMD_SLOTS],
    /// Request bytes (header + payload) per command byte.
    pub cmd_bytes: [u64; CMD_SLOTS],
    /// Requests that wait for a response: blocking round trips.
    pub round_trips: u64,
    /// Bytes client → server.
    pub c2s_bytes: u64,
    /// Bytes server → client.
    pub s2c_bytes: u64,
    /// Request messages (frames) client → server.
    pub c2s_msgs: u64,
    /// Response messages server → client.
    pub s2c_msgs: u64,
    /// Client → server bytes if every message were padded to Apple/UC RDMA strides.
    pub c2s_uc: u64,
    /// Server → client bytes if every message were padded to Apple/UC RDMA strides.
    pub s2c_uc: u64,
    /// TCP connections opened by the client.
    pub connections: u64,
    /// RDMA wire cost of this traffic per framing (index: position in [`Framing::ALL`]).
    pub wire: [WireTraffic; 4],
}

impl Counters {
    /// Reads every counter.
    pub fn snapshot(&self) -> Traffic {
        let mut t = Traffic {
            round_trips: self.round_trips.load(Relaxed),
            c2s_bytes: self.c2s_bytes.load(Relaxed),
            s2c_bytes: self.s2c_bytes.load(Relaxed),
            c2s_msgs: self.c2s_msgs.load(Relaxed),
            s2c_msgs: self.s2c_msgs.load(Relaxed),
            c2s_uc: self.c2s_uc.load(Relaxed),
            s2c_uc: self.s2c_uc.load(Relaxed),
            connections: self.connections.load(Relaxed),
            ..Traffic::default()
        };
        for i in 0..CMD_SLOTS {
            t.cmd_count[i] = self.cmd_count[i].load(Relaxed);
            t.cmd_bytes[i] = self.cmd_bytes[i].load(Relaxed);
        }
        for (w, c) in t.wire.iter_mut().zip(&self.wire) {
            w.sends = c.sends.load(Relaxed);
            w.credit_sends = c.credit_sends.load(Relaxed);
            w.bytes = c.bytes.load(Relaxed);
            for (p, cp) in w.packets.iter_mut().zip(&c.packets) {
                *p = cp.load(Relaxed);
            }
        }
        t
    }

    /// Counts one flushed message under `framings` (see [`Framing::message`]).
    fn wire_message(&self, framings: &[Framing], parts: &[usize]) {
        for &f in framings {
            let Some(i) = Framing::ALL.iter().position(|&a| a == f) else {
                continue;
            };
            let c = &self.wire[i];
            for (k, &mtu) in WIRE_MTUS.iter().enumerate() {
                let cost = f.message(parts, mtu);
                if k == 0 {
                    c.sends.fetch_add(cost.sends, Relaxed);
                    c.credit_sends.fetch_add(cost.credit_sends, Relaxed);
                    c.bytes.fetch_add(cost.bytes, Relaxed);
                }
                c.packets[k].fetch_add(cost.packets, Relaxed);
            }
        }
    }

    /// Counts `n` bytes of a raw (unparsed) stream: client → server (`up`) or back. Only
    /// [`Traffic::c2s_bytes`] and [`Traffic::s2c_bytes`] grow.
    pub fn raw_bytes(&self, up: bool, n: usize) {
        let c = if up { &self.c2s_bytes } else { &self.s2c_bytes };
        c.fetch_add(n as u64, Relaxed);
    }

    /// Counts a new client connection.
    pub fn connection(&self) {
        self.connections.fetch_add(1, Relaxed);
    }
}

impl Traffic {
    /// Every counter of `self` combined with the same counter of `o` by `f`.
    fn zip(&self, o: &Traffic, f: impl Fn(u64, u64) -> u64) -> Traffic {
        let mut t = Traffic {
            round_trips: f(self.round_trips, o.round_trips),
            c2s_bytes: f(self.c2s_bytes, o.c2s_bytes),
            s2c_bytes: f(self.s2c_bytes, o.s2c_bytes),
            c2s_msgs: f(self.c2s_msgs, o.c2s_msgs),
            s2c_msgs: f(self.s2c_msgs, o.s2c_msgs),
            c2s_uc: f(self.c2s_uc, o.c2s_uc),
            s2c_uc: f(self.s2c_uc, o.s2c_uc),
            connections: f(self.connections, o.connections),
            ..Traffic::default()
        };
        for i in 0..CMD_SLOTS {
            t.cmd_count[i] = f(self.cmd_count[i], o.cmd_count[i]);
            t.cmd_bytes[i] = f(self.cmd_bytes[i], o.cmd_bytes[i]);
        }
        for i in 0..t.wire.len() {
            t.wire[i] = self.wire[i].zip(o.wire[i], &f);
        }
        t
    }

    /// `self - earlier`, saturating (counters only grow).
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        self.zip(earlier, u64::saturating_sub)
    }

    /// `self + other`.
    pub fn plus(&self, other: &Traffic) -> Traffic {
        self.zip(other, u64::saturating_add)
    }

    /// Each counter divided by `k` (per repetition, per token).
    pub fn div_by(&self, k: u64) -> Traffic {
        self.zip(self, |a, _| a / k.max(1))
    }

    /// Bytes in both directions.
    pub fn bytes(&self) -> u64 {
        self.c2s_bytes + self.s2c_bytes
    }

    /// Apple/UC-padded bytes in both directions.
    pub fn uc_bytes(&self) -> u64 {
        self.c2s_uc + self.s2c_uc
    }

    /// Request frames of `cmd`.
    pub fn count(&self, cmd: Command) -> u64 {
        self.cmd_count[cmd.index()]
    }

    /// `"SET_TENSOR×9 GRAPH_RECOMPUTE×1 GET_TENSOR×1"`: non-zero commands, divided by `per`.
    pub fn commands_summary(&self, per: f64) -> String {
        let mut parts = Vec::new();
        for (i, &n) in self.cmd_count.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let name = if i == UNKNOWN {
                "UNKNOWN"
            } else {
                Command::EVERY.get(i).map_or("UNKNOWN", |c| c.name())
            };
            let v = n as f64 / per;
            if (v - v.round()).abs() < 1e-9 {
                parts.push(format!("{name}x{}", v.round() as u64));
            } else {
                parts.push(format!("{name}x{v:.2}"));
            }
        }
        parts.join(" ")
    }
}

/// The command of a request byte of either major (see the module docs).
fn command(b: u8) -> Option<Command> {
    Major::V8.command(b)
}

/// Incremental parser of the client → server stream.
#[derive(Debug)]
pub struct RequestParser {
    scan: Scanner,
    /// Caps bytes of a HELLO request still to be zeroed.
    hello_left: usize,
    zero_hello_caps: bool,
    /// Request bytes since the last request with a response: what a lean peer (our shim)
    /// flushes as one burst at best.
    lean_burst: usize,
    /// [`RequestParser::comm_rank0_port`].
    comm_rank0_port: Option<u32>,
    /// Inside a COMM_INIT's payload (when `comm_rank0_port` is set): its rank's bytes so far.
    comm_rank: Option<[u8; 4]>,
}

impl RequestParser {
    /// A parser at a frame boundary. With `zero_hello_caps`, the 24 caps bytes of a HELLO
    /// request are overwritten with zeros in the forwarded data.
    pub fn new(zero_hello_caps: bool) -> RequestParser {
        RequestParser {
            scan: Scanner::requests(),
            hello_left: 0,
            zero_hello_caps,
            lean_burst: 0,
            comm_rank0_port: None,
            comm_rank: None,
        }
    }

    /// Rewrites the port of every rank 0's COMM_INIT (8.0's pairwise link: "listen on this
    /// port") to `port` in the forwarded data; rank 1's (the port it dials) is left alone. For a
    /// stock 8.0 server behind this relay: it listens on every interface at the port it is told,
    /// the port rank 1 dials too, so without the rewrite no relay could sit between the two on
    /// that port. Any chunking: the rank precedes the port in the payload.
    pub fn comm_rank0_port(mut self, port: u32) -> RequestParser {
        self.comm_rank0_port = Some(port);
        self
    }

    /// Parses (and possibly edits) one chunk of the stream, counting into `c`.
    pub fn feed(&mut self, data: &mut [u8], c: &Counters) {
        c.c2s_bytes.fetch_add(data.len() as u64, Relaxed);
        let mut i = 0;
        while i < data.len() {
            let (n, ev) = self.scan.step(&data[i..]);
            match ev {
                Some(Scanned::Request(h)) => self.request(h, c),
                Some(Scanned::Payload { len, .. }) if self.hello_left > 0 => {
                    let z = len.min(self.hello_left);
                    data[i..i + z].fill(0);
                    self.hello_left -= z;
                }
                Some(Scanned::Payload { offset, len }) if self.comm_rank.is_some() => {
                    self.comm_payload(offset, &mut data[i..i + len]);
                }
                _ => {}
            }
            i += n;
        }
    }

    /// Counts one request frame by its header.
    fn request(&mut self, h: FrameHeader, c: &Counters) {
        let (cmd, size) = (h.cmd, h.size);
        let slot = command(cmd).map_or(UNKNOWN, Command::index);
        c.cmd_count[slot].fetch_add(1, Relaxed);
        c.cmd_bytes[slot].fetch_add(size.saturating_add(9), Relaxed);
        c.c2s_msgs.fetch_add(1, Relaxed);
        let msg = size.saturating_add(9);
        c.c2s_uc
            .fetch_add(LinkProfile::tb5_rdma().wire_bytes(msg), Relaxed);
        let command = command(cmd);
        let psize = usize::try_from(size).unwrap_or(usize::MAX);
        // Upstream flavors flush every request; a lean peer coalesces the no-response ones into
        // the next request that waits for a response.
        c.wire_message(&[Framing::UpstreamRc, Framing::AppleUc], &[1, 8, psize]);
        self.lean_burst = self.lean_burst.saturating_add(psize.saturating_add(9));
        if command.is_some_and(Command::has_response) {
            c.round_trips.fetch_add(1, Relaxed);
            c.wire_message(&[Framing::LeanRc, Framing::LeanUc], &[self.lean_burst]);
            self.lean_burst = 0;
        }
        self.hello_left = if self.zero_hello_caps
            && command == Some(Command::Hello)
            && size == CONN_CAPS_SIZE as u64
        {
            CONN_CAPS_SIZE
        } else {
            0
        };
        self.comm_rank = (self.comm_rank0_port.is_some()
            && command == Some(Command::CommInit)
            && size == COMM_INIT_SIZE as u64)
            .then_some([0xff; 4]);
    }

    /// `bytes` of a COMM_INIT payload from `offset` (`| device u32 | rank u32 | world u32 |
    /// port u32 | host |`, little-endian): notes the rank, rewrites rank 0's port.
    fn comm_payload(&mut self, offset: u64, bytes: &mut [u8]) {
        let (Some(rank), Some(port)) = (self.comm_rank.as_mut(), self.comm_rank0_port) else {
            return;
        };
        for (k, b) in bytes.iter_mut().enumerate() {
            match offset + k as u64 {
                o @ 4..=7 => rank[o as usize - 4] = *b,
                o @ 12..=15 if u32::from_le_bytes(*rank) == 0 => {
                    *b = port.to_le_bytes()[o as usize - 12]
                }
                16.. => break,
                _ => {}
            }
        }
    }
}

/// Incremental parser of the server → client stream (`| size u64 | payload |` messages).
#[derive(Debug)]
pub struct ResponseParser {
    scan: Scanner,
}

impl Default for ResponseParser {
    fn default() -> Self {
        ResponseParser {
            scan: Scanner::responses(),
        }
    }
}

impl ResponseParser {
    /// Parses one chunk, counting into `c`.
    pub fn feed(&mut self, data: &[u8], c: &Counters) {
        c.s2c_bytes.fetch_add(data.len() as u64, Relaxed);
        let mut i = 0;
        while i < data.len() {
            let (n, ev) = self.scan.step(&data[i..]);
            if let Some(Scanned::Response(size)) = ev {
                c.s2c_msgs.fetch_add(1, Relaxed);
                c.wire_message(
                    &Framing::ALL,
                    &[8, usize::try_from(size).unwrap_or(usize::MAX)],
                );
                c.s2c_uc.fetch_add(
                    LinkProfile::tb5_rdma().wire_bytes(size.saturating_add(8)),
                    Relaxed,
                );
            }
            i += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_proto::Request;

    fn frames() -> Vec<u8> {
        let mut v = Vec::new();
        Request::Hello {
            caps: [7; CONN_CAPS_SIZE],
        }
        .encode(&mut v);
        Request::DeviceCount.encode(&mut v);
        Request::GraphRecompute {
            device: 0,
            uid: None,
        }
        .encode(&mut v);
        Request::GetAlignment { device: 0 }.encode(&mut v);
        v
    }

    /// 8.0.0's own commands are counted under their names; those with a response (GET_TENSOR_2D,
    /// COMM_INIT) are round trips; a 12-byte GRAPH_RECOMPUTE is one frame.
    #[test]
    fn counts_the_8_0_commands() {
        let t = rpc_proto::RpcTensor::default();
        let region = rpc_proto::Region2d {
            offset: 0,
            size: 4,
            n_copies: 2,
            stride: 8,
        };
        let mut v = Vec::new();
        for r in [
            Request::SetTensor2d {
                tensor: t,
                region,
                data: &[1; 8],
            },
            Request::GetTensor2d { tensor: t, region },
            Request::CommInit(rpc_proto::CommInit {
                device: 0,
                rank: 1,
                world: 2,
                port: 52111,
                host: rpc_proto::CommInit::host_field("127.0.0.1").unwrap(),
            }),
            Request::CommAllreduce {
                device: 0,
                tensor: t,
            },
            Request::GraphRecompute {
                device: 0,
                uid: Some(24),
            },
            Request::CommFree { device: 0 },
        ] {
            r.encode(&mut v);
        }
        for chunk in [1usize, 7, 4096] {
            let c = Counters::default();
            let mut p = RequestParser::new(true);
            let mut data = v.clone();
            for piece in data.chunks_mut(chunk) {
                p.feed(piece, &c);
            }
            let s = c.snapshot();
            assert_eq!(data, v, "nothing but HELLO caps is edited");
            assert_eq!(
                s.round_trips, 2,
                "GET_TENSOR_2D and COMM_INIT wait for a reply"
            );
            assert_eq!(s.count(Command::GraphRecompute), 1);
            assert_eq!(
                s.cmd_bytes[usize::from(Command::GraphRecompute.as_u8())],
                21
            );
            assert_eq!(
                s.cmd_bytes[usize::from(Command::SetTensor2d.as_u8())],
                9 + 328 + 8
            );
            assert_eq!(s.cmd_count[UNKNOWN], 0);
            assert_eq!(
                s.commands_summary(1.0),
                "GRAPH_RECOMPUTEx1 SET_TENSOR_2Dx1 GET_TENSOR_2Dx1 COMM_INITx1 COMM_ALLREDUCEx1 COMM_FREEx1"
            );
        }
        // RPC_CMD_NONE of 8.0 (23) and above: unknown.
        let c = Counters::default();
        let mut f = vec![23u8, 0, 0, 0, 0, 0, 0, 0, 0];
        RequestParser::new(false).feed(&mut f, &c);
        assert_eq!(c.snapshot().cmd_count[UNKNOWN], 1);
    }

    #[test]
    fn counts_and_zeroes_caps_for_any_chunking() {
        let whole = frames();
        for chunk in [1usize, 2, 3, 5, 8, 9, 10, 64, 4096] {
            let c = Counters::default();
            let mut p = RequestParser::new(true);
            let mut data = whole.clone();
            for piece in data.chunks_mut(chunk) {
                p.feed(piece, &c);
            }
            let t = c.snapshot();
            assert_eq!(t.round_trips, 3, "chunk {chunk}"); // HELLO, DEVICE_COUNT, GET_ALIGNMENT
            assert_eq!(t.count(Command::GraphRecompute), 1);
            assert_eq!(t.c2s_msgs, 4);
            assert_eq!(t.c2s_bytes, whole.len() as u64);
            assert_eq!(&data[9..9 + CONN_CAPS_SIZE], &[0u8; CONN_CAPS_SIZE]);
            assert_eq!(&data[9 + CONN_CAPS_SIZE..], &whole[9 + CONN_CAPS_SIZE..]);
            assert_eq!(
                t.commands_summary(1.0),
                "GET_ALIGNMENTx1 HELLOx1 DEVICE_COUNTx1 GRAPH_RECOMPUTEx1"
            );
        }
    }

    /// One generated token of a stock client (9 SET_TENSOR, GRAPH_RECOMPUTE, GET_TENSOR and its
    /// 1 MiB response) framed by each RDMA flavor.
    #[test]
    fn wire_cost_of_a_token() {
        let c = Counters::default();
        let mut req = Vec::new();
        for _ in 0..9 {
            // SET_TENSOR: 296-byte tensor + 8-byte offset + 4 bytes of data
            req.push(Command::SetTensor.as_u8());
            req.extend_from_slice(&308u64.to_le_bytes());
            req.resize(req.len() + 308, 0);
        }
        Request::GraphRecompute {
            device: 0,
            uid: None,
        }
        .encode(&mut req);
        req.push(Command::GetTensor.as_u8());
        req.extend_from_slice(&312u64.to_le_bytes());
        req.resize(req.len() + 312, 0);
        let mut rsp = (1u64 << 20).to_le_bytes().to_vec();
        rsp.resize(8 + (1 << 20), 0);
        let mut p = RequestParser::new(false);
        for piece in req.chunks_mut(100) {
            p.feed(piece, &c);
        }
        let mut r = ResponseParser::default();
        for piece in rsp.chunks(4096) {
            r.feed(piece, &c);
        }
        let t = c.snapshot();
        let [rc, apple, lean_rc, lean_uc] = t.wire;
        // RC: 3 SENDs per request with a payload (11), 2 for the response (1 MiB = 4 chunks).
        assert_eq!(rc.sends, 11 * 3 + 1 + 4);
        // Apple: one stride per request; the response is 8 strides of 128 KiB - 8.
        assert_eq!(apple.sends, 11 + 9);
        assert_eq!(apple.packets, [20 * 128, 20 * 32]);
        // Lean RC: one burst for all 11 requests, the response in 5 frames of at most 256 KiB.
        assert_eq!(lean_rc.sends, 1 + 5);
        // Lean UC: the burst (3,385 bytes) is one frame; the response 258 frames (+2 credit-only).
        assert_eq!((lean_uc.sends, lean_uc.credit_sends), (1 + 258 + 2, 2));
        // At MTU 1024: 4 (burst) + 257 × 4 + 2 (last frame) + 2 (credits), against Apple's 2,560:
        // a large response (here 1 MiB of logits) dominates both.
        assert_eq!(lean_uc.packets[0], 4 + 257 * 4 + 2 + 2);
    }

    /// With `comm_rank0_port`, a rank 0's COMM_INIT leaves with the new port and everything else
    /// as it was, however the stream is cut; rank 1's (and every other frame) is untouched.
    #[test]
    fn moves_rank0_comm_init_to_another_port() {
        let init = |rank| {
            let mut v = Vec::new();
            Request::CommInit(rpc_proto::CommInit {
                device: 0,
                rank,
                world: 2,
                port: 51234,
                host: rpc_proto::CommInit::host_field("127.0.0.3").unwrap(),
            })
            .encode(&mut v);
            v
        };
        let stream = [frames(), init(0), init(1), frames()].concat();
        let mut want = stream.clone();
        let at = frames().len() + 9 + 12; // rank 0's port
        want[at..at + 4].copy_from_slice(&40999u32.to_le_bytes());
        for cut in [1, 3, 7, 13, 90, stream.len()] {
            let c = Counters::default();
            let mut p = RequestParser::new(false).comm_rank0_port(40999);
            let mut got = stream.clone();
            for piece in got.chunks_mut(cut) {
                p.feed(piece, &c);
            }
            assert_eq!(got, want, "cut every {cut} bytes");
            assert_eq!(c.snapshot().count(Command::CommInit), 2);
        }
        let mut same = stream.clone();
        RequestParser::new(false).feed(&mut same, &Counters::default());
        assert_eq!(same, stream, "no rewrite unless asked");
    }

    #[test]
    fn keeps_caps_when_asked() {
        let c = Counters::default();
        let mut data = frames();
        RequestParser::new(false).feed(&mut data, &c);
        assert_eq!(data, frames());
    }

    #[test]
    fn responses_and_garbage() {
        let c = Counters::default();
        let mut p = ResponseParser::default();
        let mut v = Vec::new();
        for n in [0u64, 4, 1 << 20] {
            v.extend_from_slice(&n.to_le_bytes());
            v.resize(v.len() + n as usize, 1);
        }
        for piece in v.chunks(7) {
            p.feed(piece, &c);
        }
        let t = c.snapshot();
        assert_eq!(t.s2c_msgs, 3);
        assert_eq!(
            t.s2c_uc,
            LinkProfile::tb5_rdma().wire_bytes(8) * 2 + 9 * crate::links::UC_STRIDE
        );
        // Garbage never panics.
        let mut rp = RequestParser::new(true);
        let mut junk = vec![0xffu8; 100];
        rp.feed(&mut junk, &c);
        p.feed(&[0xff; 100], &c);
        let later = c.snapshot();
        assert_eq!(later.since(&t).cmd_count[UNKNOWN], 1);
    }
}
