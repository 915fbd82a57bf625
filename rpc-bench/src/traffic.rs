//! Protocol-aware traffic counting for the relay.
//!
//! The relay sees two byte streams. Client → server carries request frames
//! `| cmd u8 | size u64 LE | payload |`; the command byte says whether a response follows
//! (spec §5.1), so every command with a response is one blocking network round trip of the stock
//! client. Server → client carries responses `| size u64 LE | payload |`. The parsers here are
//! incremental (any chunking), never panic, and count frames, bytes and round trips; the request
//! parser also zeroes the HELLO transport caps so an RDMA-capable client stays on TCP through the
//! relay (the relay can only carry bytes).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rpc_proto::{Command, CONN_CAPS_SIZE};

use crate::links::LinkProfile;

/// Number of command slots (command bytes 0..=17, plus one for unknown bytes).
pub const CMD_SLOTS: usize = 19;
const UNKNOWN: usize = CMD_SLOTS - 1;

/// Live counters shared by all connections of a relay.
#[derive(Debug, Default)]
pub struct Counters {
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
        t
    }

    /// Counts a new client connection.
    pub fn connection(&self) {
        self.connections.fetch_add(1, Relaxed);
    }
}

impl Traffic {
    /// `self - earlier`, saturating (counters only grow).
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        let mut t = Traffic {
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            c2s_bytes: self.c2s_bytes.saturating_sub(earlier.c2s_bytes),
            s2c_bytes: self.s2c_bytes.saturating_sub(earlier.s2c_bytes),
            c2s_msgs: self.c2s_msgs.saturating_sub(earlier.c2s_msgs),
            s2c_msgs: self.s2c_msgs.saturating_sub(earlier.s2c_msgs),
            c2s_uc: self.c2s_uc.saturating_sub(earlier.c2s_uc),
            s2c_uc: self.s2c_uc.saturating_sub(earlier.s2c_uc),
            connections: self.connections.saturating_sub(earlier.connections),
            ..Traffic::default()
        };
        for i in 0..CMD_SLOTS {
            t.cmd_count[i] = self.cmd_count[i].saturating_sub(earlier.cmd_count[i]);
            t.cmd_bytes[i] = self.cmd_bytes[i].saturating_sub(earlier.cmd_bytes[i]);
        }
        t
    }

    /// `self + other`.
    pub fn plus(&self, other: &Traffic) -> Traffic {
        let mut t = Traffic {
            round_trips: self.round_trips + other.round_trips,
            c2s_bytes: self.c2s_bytes + other.c2s_bytes,
            s2c_bytes: self.s2c_bytes + other.s2c_bytes,
            c2s_msgs: self.c2s_msgs + other.c2s_msgs,
            s2c_msgs: self.s2c_msgs + other.s2c_msgs,
            c2s_uc: self.c2s_uc + other.c2s_uc,
            s2c_uc: self.s2c_uc + other.s2c_uc,
            connections: self.connections + other.connections,
            ..Traffic::default()
        };
        for i in 0..CMD_SLOTS {
            t.cmd_count[i] = self.cmd_count[i] + other.cmd_count[i];
            t.cmd_bytes[i] = self.cmd_bytes[i] + other.cmd_bytes[i];
        }
        t
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
        self.cmd_count[usize::from(cmd.as_u8())]
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
                Command::from_u8(i as u8).map_or("UNKNOWN", Command::name)
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

/// Incremental parser of the client → server stream.
#[derive(Debug)]
pub struct RequestParser {
    state: ReqState,
    zero_hello_caps: bool,
}

#[derive(Debug)]
enum ReqState {
    Header { have: usize, buf: [u8; 9] },
    Payload { remaining: u64, hello_left: usize },
}

impl RequestParser {
    /// A parser at a frame boundary. With `zero_hello_caps`, the 24 caps bytes of a HELLO
    /// request are overwritten with zeros in the forwarded data.
    pub fn new(zero_hello_caps: bool) -> RequestParser {
        RequestParser {
            state: ReqState::Header {
                have: 0,
                buf: [0; 9],
            },
            zero_hello_caps,
        }
    }

    /// Parses (and possibly edits) one chunk of the stream, counting into `c`.
    pub fn feed(&mut self, data: &mut [u8], c: &Counters) {
        c.c2s_bytes.fetch_add(data.len() as u64, Relaxed);
        let mut i = 0;
        while i < data.len() {
            match &mut self.state {
                ReqState::Header { have, buf } => {
                    let take = (9 - *have).min(data.len() - i);
                    buf[*have..*have + take].copy_from_slice(&data[i..i + take]);
                    *have += take;
                    i += take;
                    if *have == 9 {
                        let cmd = buf[0];
                        let mut sz = [0u8; 8];
                        sz.copy_from_slice(&buf[1..9]);
                        let size = u64::from_le_bytes(sz);
                        let slot = if usize::from(cmd) < UNKNOWN {
                            usize::from(cmd)
                        } else {
                            UNKNOWN
                        };
                        c.cmd_count[slot].fetch_add(1, Relaxed);
                        c.cmd_bytes[slot].fetch_add(size.saturating_add(9), Relaxed);
                        c.c2s_msgs.fetch_add(1, Relaxed);
                        let msg = size.saturating_add(9);
                        c.c2s_uc
                            .fetch_add(LinkProfile::tb5_rdma().wire_bytes(msg), Relaxed);
                        let command = Command::from_u8(cmd);
                        if command.is_some_and(Command::has_response) {
                            c.round_trips.fetch_add(1, Relaxed);
                        }
                        let hello_left = if self.zero_hello_caps
                            && command == Some(Command::Hello)
                            && size == CONN_CAPS_SIZE as u64
                        {
                            CONN_CAPS_SIZE
                        } else {
                            0
                        };
                        self.state = if size == 0 {
                            ReqState::Header {
                                have: 0,
                                buf: [0; 9],
                            }
                        } else {
                            ReqState::Payload {
                                remaining: size,
                                hello_left,
                            }
                        };
                    }
                }
                ReqState::Payload {
                    remaining,
                    hello_left,
                } => {
                    let avail = (data.len() - i) as u64;
                    let take = (*remaining).min(avail) as usize;
                    if *hello_left > 0 {
                        let z = take.min(*hello_left);
                        data[i..i + z].fill(0);
                        *hello_left -= z;
                    }
                    i += take;
                    *remaining -= take as u64;
                    if *remaining == 0 {
                        self.state = ReqState::Header {
                            have: 0,
                            buf: [0; 9],
                        };
                    }
                }
            }
        }
    }
}

/// Incremental parser of the server → client stream (`| size u64 | payload |` messages).
#[derive(Debug, Default)]
pub struct ResponseParser {
    have: usize,
    buf: [u8; 8],
    remaining: u64,
}

impl ResponseParser {
    /// Parses one chunk, counting into `c`.
    pub fn feed(&mut self, data: &[u8], c: &Counters) {
        c.s2c_bytes.fetch_add(data.len() as u64, Relaxed);
        let mut i = 0;
        while i < data.len() {
            if self.remaining > 0 {
                let take = self.remaining.min((data.len() - i) as u64);
                self.remaining -= take;
                i += take as usize;
                continue;
            }
            let take = (8 - self.have).min(data.len() - i);
            self.buf[self.have..self.have + take].copy_from_slice(&data[i..i + take]);
            self.have += take;
            i += take;
            if self.have == 8 {
                self.have = 0;
                let size = u64::from_le_bytes(self.buf);
                self.remaining = size;
                c.s2c_msgs.fetch_add(1, Relaxed);
                c.s2c_uc.fetch_add(
                    LinkProfile::tb5_rdma().wire_bytes(size.saturating_add(8)),
                    Relaxed,
                );
            }
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
        Request::GraphRecompute { device: 0 }.encode(&mut v);
        Request::GetAlignment { device: 0 }.encode(&mut v);
        v
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
