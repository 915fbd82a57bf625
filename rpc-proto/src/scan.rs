//! Incremental scanner of either byte stream of a connection: finds frame boundaries in chunks of
//! any size (requests `| cmd u8 | size u64 | payload |`, responses `| size u64 | payload |`)
//! without buffering payloads, so a relay can forward every byte untouched and still know where
//! each frame starts. Shared by rpc-shim's relay and rpc-bench's traffic counter.
//!
//! The scanner validates nothing (a relay forwards what it gets; checks such as
//! [`crate::check_frame`] are the caller's), allocates nothing and never panics.

use crate::consts::{FRAME_HEADER_SIZE, RESPONSE_HEADER_SIZE};
use crate::frame::FrameHeader;

/// What a [`Scanner::step`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scanned {
    /// A request frame header completed.
    Request(FrameHeader),
    /// A response header completed: its payload size.
    Response(u64),
    /// Payload bytes of the current frame: `len` bytes (the step's whole consumption) starting
    /// `offset` bytes into the payload.
    Payload {
        /// Where in the payload the bytes start.
        offset: u64,
        /// How many.
        len: usize,
    },
}

/// An incremental frame scanner of one direction of a connection.
#[derive(Debug, Clone)]
pub struct Scanner {
    head: [u8; FRAME_HEADER_SIZE],
    head_len: usize,
    have: usize,
    /// Payload bytes of the current frame: seen, still to come.
    seen: u64,
    remaining: u64,
}

impl Scanner {
    /// A scanner of the client → server stream, at a frame boundary.
    pub fn requests() -> Scanner {
        Scanner::new(FRAME_HEADER_SIZE)
    }

    /// A scanner of the server → client stream, at a response boundary.
    pub fn responses() -> Scanner {
        Scanner::new(RESPONSE_HEADER_SIZE)
    }

    fn new(head_len: usize) -> Scanner {
        Scanner {
            head: [0; FRAME_HEADER_SIZE],
            head_len,
            have: 0,
            seen: 0,
            remaining: 0,
        }
    }

    /// Scans a prefix of `data`: returns how many bytes it consumed and what they completed
    /// (`None`: part of a header). Call again with the rest; consumes at least one byte of a
    /// non-empty `data`.
    pub fn step(&mut self, data: &[u8]) -> (usize, Option<Scanned>) {
        if self.remaining > 0 {
            let len = usize::try_from(self.remaining).map_or(data.len(), |r| r.min(data.len()));
            let offset = self.seen;
            self.seen = self.seen.saturating_add(len as u64);
            self.remaining -= len as u64;
            return (len, Some(Scanned::Payload { offset, len }));
        }
        let want = self.head_len.saturating_sub(self.have);
        let take = want.min(data.len());
        if let (Some(dst), Some(src)) = (
            self.head.get_mut(self.have..self.have + take),
            data.get(..take),
        ) {
            dst.copy_from_slice(src);
        }
        self.have += take;
        if self.have < self.head_len {
            return (take, None);
        }
        self.have = 0;
        self.seen = 0;
        let ev = if self.head_len == FRAME_HEADER_SIZE {
            let h = FrameHeader::decode(&self.head);
            self.remaining = h.size;
            Scanned::Request(h)
        } else {
            let mut size = [0u8; RESPONSE_HEADER_SIZE];
            size.copy_from_slice(self.head.get(..RESPONSE_HEADER_SIZE).unwrap_or(&[0; 8]));
            self.remaining = u64::from_le_bytes(size);
            Scanned::Response(self.remaining)
        };
        (take, Some(ev))
    }

    /// Payload bytes of the current frame still to come (0 at a frame boundary or in a header).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Whether the scanner stands between two frames.
    pub fn at_boundary(&self) -> bool {
        self.have == 0 && self.remaining == 0
    }
}

/// Length of the whole request frame at the start of `buf` when `buf` holds all of it.
pub fn complete_request(buf: &[u8]) -> Option<u64> {
    let mut s = Scanner::requests();
    match s.step(buf) {
        (n, Some(Scanned::Request(h))) if (buf.len() - n) as u64 >= h.size => {
            Some(h.size.saturating_add(n as u64))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(s: &mut Scanner, data: &[u8], chunk: usize) -> Vec<Scanned> {
        let mut out = Vec::new();
        for piece in data.chunks(chunk) {
            let mut i = 0;
            while i < piece.len() {
                let (n, ev) = s.step(&piece[i..]);
                assert!(n > 0);
                i += n;
                match (ev, out.last_mut()) {
                    // Merge payload pieces for comparison across chunkings.
                    (
                        Some(Scanned::Payload { len, .. }),
                        Some(Scanned::Payload { len: total, .. }),
                    ) => *total += len,
                    (Some(e), _) => out.push(e),
                    (None, _) => {}
                }
            }
        }
        out
    }

    #[test]
    fn requests_in_any_chunking() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&FrameHeader { cmd: 15, size: 0 }.encode());
        wire.extend_from_slice(&FrameHeader { cmd: 1, size: 4 }.encode());
        wire.extend_from_slice(&[9; 4]);
        for chunk in [1, 2, 5, 9, 10, 64] {
            let mut s = Scanner::requests();
            let got = scan(&mut s, &wire, chunk);
            assert_eq!(
                got,
                [
                    Scanned::Request(FrameHeader { cmd: 15, size: 0 }),
                    Scanned::Request(FrameHeader { cmd: 1, size: 4 }),
                    Scanned::Payload { offset: 0, len: 4 },
                ],
                "chunk {chunk}"
            );
            assert!(s.at_boundary());
        }
    }

    #[test]
    fn responses_and_huge_sizes_never_panic() {
        let mut s = Scanner::responses();
        let mut wire = 3u64.to_le_bytes().to_vec();
        wire.extend_from_slice(&[1, 2, 3]);
        wire.extend_from_slice(&u64::MAX.to_le_bytes());
        wire.extend_from_slice(&[0; 100]);
        let got = scan(&mut s, &wire, 7);
        assert_eq!(got[0], Scanned::Response(3));
        assert_eq!(got[2], Scanned::Response(u64::MAX));
        assert_eq!(s.remaining(), u64::MAX - 100);
        assert_eq!(
            s.step(&[]),
            (
                0,
                Some(Scanned::Payload {
                    offset: 100,
                    len: 0
                })
            )
        );
    }

    #[test]
    fn complete_frames() {
        let mut f = FrameHeader { cmd: 1, size: 4 }.encode().to_vec();
        assert_eq!(complete_request(&f), None);
        f.extend_from_slice(&[0; 4]);
        assert_eq!(complete_request(&f), Some(13));
        assert_eq!(complete_request(&f[..5]), None);
    }
}
