//! Request frame header (`u8 cmd | u64 size`) and the checks done before a payload is read.

use crate::command::{Command, Major, PayloadSize};
use crate::consts::{FRAME_HEADER_SIZE, GRAPH_HEADER_SIZE, RPC_TENSOR_SIZE};
use crate::error::DecodeError;

/// The 9-byte header in front of every request: command byte and payload size.
///
/// The command is kept raw so that unknown commands can still be reported;
/// [`check_frame`] turns it into a [`Command`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// Raw command byte.
    pub cmd: u8,
    /// Payload size in bytes (`req_size`), excluding these 9 header bytes.
    pub size: u64,
}

impl FrameHeader {
    /// A header for `cmd` with a payload of `size` bytes.
    pub const fn new(cmd: Command, size: u64) -> Self {
        FrameHeader {
            cmd: cmd as u8,
            size,
        }
    }

    /// Parse the 9 header bytes. Never fails: validation is [`check_frame`]'s job.
    pub fn decode(b: &[u8; FRAME_HEADER_SIZE]) -> FrameHeader {
        let [cmd, s0, s1, s2, s3, s4, s5, s6, s7] = *b;
        FrameHeader {
            cmd,
            size: u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]),
        }
    }

    /// The 9 header bytes (a `const fn`: a frame without payload can be a constant).
    pub const fn encode(&self) -> [u8; FRAME_HEADER_SIZE] {
        let [s0, s1, s2, s3, s4, s5, s6, s7] = self.size.to_le_bytes();
        [self.cmd, s0, s1, s2, s3, s4, s5, s6, s7]
    }
}

/// Appends a request frame with any command byte: `cmd`, `u64` LE size = `payload.len()`, then
/// `payload`. For tests and fuzzers that send what no client would (a byte that is no command, a
/// payload of the wrong size); a client encodes [`Request`](crate::Request)s.
pub fn encode_raw(cmd: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.reserve(FRAME_HEADER_SIZE.saturating_add(payload.len()));
    out.extend_from_slice(
        &FrameHeader {
            cmd,
            size: payload.len() as u64,
        }
        .encode(),
    );
    out.extend_from_slice(payload);
}

/// A request frame cut where upstream's client cuts it: one `send_data()` call per part, the
/// command byte, the `u64` size, and the payload (left out when empty). TCP concatenates the parts;
/// upstream's Linux RDMA receiver needs each one as its own SEND(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts<'a> {
    parts: [&'a [u8]; 3],
    len: usize,
}

impl<'a> Parts<'a> {
    /// The parts of a whole encoded frame (`| cmd | size | payload |`). Never panics: a frame
    /// shorter than its header is cut as far as it goes.
    pub fn of_frame(frame: &'a [u8]) -> Parts<'a> {
        let (head, payload) = frame.split_at(frame.len().min(FRAME_HEADER_SIZE));
        let (cmd, size) = head.split_at(head.len().min(1));
        Parts {
            parts: [cmd, size, payload],
            len: if payload.is_empty() { 2 } else { 3 },
        }
    }

    /// The parts, in order.
    pub fn as_slice(&self) -> &[&'a [u8]] {
        self.parts.get(..self.len).unwrap_or(&self.parts)
    }
}

/// Resource limits enforced before anything is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Largest accepted payload of a variable-size request (SET_TENSOR, GRAPH_COMPUTE).
    pub max_request_size: u64,
    /// Largest accepted `n_nodes` in GRAPH_COMPUTE.
    pub max_graph_nodes: u32,
    /// Largest accepted `n_tensors` in GRAPH_COMPUTE.
    pub max_graph_tensors: u32,
}

impl Default for Limits {
    /// 8 GiB requests, 2^20 graph nodes, 2^20 graph tensors.
    ///
    /// A whole gemma-3-270M graph has 726 nodes / 1007 tensors (spec §15.3).
    fn default() -> Self {
        Limits {
            max_request_size: 8 << 30,
            max_graph_nodes: 1 << 20,
            max_graph_tensors: 1 << 20,
        }
    }
}

impl Limits {
    /// Largest payload accepted for `cmd` in `major`.
    ///
    /// For GRAPH_COMPUTE this is also capped by the largest graph the node and
    /// tensor limits allow (about 318 MB with the defaults), so a hostile size
    /// is refused before the payload buffer is allocated.
    pub fn max_payload(&self, major: Major, cmd: Command) -> u64 {
        match cmd.request_size(major) {
            PayloadSize::Exact(n) => n,
            PayloadSize::AtLeast(head) if cmd == Command::GraphCompute => {
                let graph_max = graph_payload_size(
                    u64::from(self.max_graph_nodes),
                    u64::from(self.max_graph_tensors),
                )
                .and_then(|n| n.checked_add(head - GRAPH_HEADER_SIZE as u64))
                .unwrap_or(u64::MAX);
                self.max_request_size.min(graph_max)
            }
            PayloadSize::AtLeast(_) => self.max_request_size,
        }
    }
}

/// Payload size of a 7.0.0 graph (GRAPH_COMPUTE, [`Graph`](crate::Graph)) with `n_nodes` nodes
/// and `n_tensors` tensors (`12 + 8·n_nodes + 296·n_tensors`; 8.0.0 adds 8 for the uid), or
/// `None` on `u64` overflow. Here, below `graph.rs`, because [`Limits::max_payload`] bounds a
/// GRAPH_COMPUTE frame by it before its payload is read.
pub fn graph_payload_size(n_nodes: u64, n_tensors: u64) -> Option<u64> {
    let nodes = n_nodes.checked_mul(8)?;
    let tensors = n_tensors.checked_mul(RPC_TENSOR_SIZE as u64)?;
    (GRAPH_HEADER_SIZE as u64)
        .checked_add(nodes)?
        .checked_add(tensors)
}

fn payload_what(cmd: Command) -> &'static str {
    match cmd {
        Command::SetTensor => "SET_TENSOR payload",
        Command::GraphCompute => "GRAPH_COMPUTE payload",
        Command::SetTensor2d => "SET_TENSOR_2D payload",
        _ => "payload",
    }
}

/// Check that a payload of `size` bytes is acceptable for `cmd` in `major` (spec §5.1, 8.0 §B):
/// fixed-size commands need the exact size, variable ones their fixed part
/// ([`Command::request_size`]) and no more than [`Limits::max_payload`].
pub fn check_payload_size(
    major: Major,
    cmd: Command,
    size: u64,
    limits: &Limits,
) -> Result<(), DecodeError> {
    match cmd.request_size(major) {
        PayloadSize::Exact(expected) if size != expected => Err(DecodeError::BadSize {
            cmd,
            got: size,
            expected,
        }),
        PayloadSize::Exact(_) => Ok(()),
        PayloadSize::AtLeast(need) if size < need => Err(DecodeError::TooShort {
            what: payload_what(cmd),
            need,
            got: size,
        }),
        PayloadSize::AtLeast(_) => {
            let limit = limits.max_payload(major, cmd);
            if size > limit {
                Err(DecodeError::TooLarge {
                    what: payload_what(cmd),
                    got: size,
                    limit,
                })
            } else {
                Ok(())
            }
        }
    }
}

/// Validate a frame header of a `major` connection before its payload is read or allocated.
///
/// Rejects what is not a command of that major ([`Major::command`]) and sizes that
/// [`check_payload_size`] refuses. On success the caller may allocate `h.size` bytes.
pub fn check_frame(major: Major, h: &FrameHeader, limits: &Limits) -> Result<Command, DecodeError> {
    let cmd = major
        .command(h.cmd)
        .ok_or(DecodeError::UnknownCommand(h.cmd))?;
    check_payload_size(major, cmd, h.size, limits)?;
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_payload_size_formula() {
        assert_eq!(graph_payload_size(0, 0), Some(12));
        assert_eq!(graph_payload_size(726, 1007), Some(303_892));
        assert_eq!(graph_payload_size(u64::MAX, 0), None);
    }
}
