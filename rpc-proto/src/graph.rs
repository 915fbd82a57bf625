//! GRAPH_COMPUTE payload (spec §7; 8.0 delta §B), borrowed zero-copy from the wire.
//!
//! ```text
//! 7.0.0: | u32 device |         | u32 n_nodes | u64 node_id[n_nodes] | u32 n_tensors | rpc_tensor[n_tensors] |
//! 8.0.0: | u32 device | u64 uid | u32 n_nodes | u64 node_id[n_nodes] | u32 n_tensors | rpc_tensor[n_tensors] |
//! ```

use zerocopy::byteorder::little_endian::U64;
use zerocopy::IntoBytes;

use crate::command::{Command, Major};
use crate::consts::FRAME_HEADER_SIZE;
use crate::error::DecodeError;
use crate::frame::{graph_payload_size, FrameHeader, Limits};
use crate::tensor::RpcTensor;
use crate::wire::{put_u32, put_u64, Reader};

/// A decoded GRAPH_COMPUTE payload; both arrays borrow the (unaligned) wire bytes.
///
/// Only the framing is checked here: ids, shapes and buffers are untrusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Graph<'a> {
    /// Device index the graph runs on.
    pub device: u32,
    /// 8.0.0: the client's graph uid (0: not to be stored); `None`: the 7.0.0 layout, which has
    /// no uid. The layout follows from it, so a graph encodes as it was decoded.
    pub uid: Option<u64>,
    /// Ids of the graph nodes, in execution order.
    pub node_ids: &'a [U64],
    /// Every tensor reachable from the nodes, sources before users.
    pub tensors: &'a [RpcTensor],
}

fn check_count(what: &'static str, got: u32, limit: u32) -> Result<usize, DecodeError> {
    if got > limit {
        return Err(DecodeError::TooLarge {
            what,
            got: u64::from(got),
            limit: u64::from(limit),
        });
    }
    usize::try_from(got).map_err(|_| DecodeError::TooLarge {
        what,
        got: u64::from(got),
        limit: usize::MAX as u64,
    })
}

impl<'a> Graph<'a> {
    /// Decode a GRAPH_COMPUTE payload of a `major` connection without copying.
    ///
    /// `n_nodes` and `n_tensors` are checked against `limits` before they are used,
    /// every length is computed with checked arithmetic, and bytes after the
    /// tensor array are rejected as [`DecodeError::Malformed`] (the stock server
    /// ignores them; the stock client never sends them).
    pub fn decode(
        major: Major,
        payload: &'a [u8],
        limits: &Limits,
    ) -> Result<Graph<'a>, DecodeError> {
        let mut r = Reader::new(payload, "GRAPH_COMPUTE header");
        let device = r.u32()?;
        let uid = match major {
            Major::V7 => None,
            Major::V8 => Some(r.u64()?),
        };
        let n_nodes = r.u32()?;
        let n_nodes = check_count("GRAPH_COMPUTE n_nodes", n_nodes, limits.max_graph_nodes)?;
        r.context("GRAPH_COMPUTE node ids");
        let node_ids = r.slice_of::<U64>(n_nodes)?;
        r.context("GRAPH_COMPUTE n_tensors");
        let n_tensors = r.u32()?;
        let n_tensors = check_count(
            "GRAPH_COMPUTE n_tensors",
            n_tensors,
            limits.max_graph_tensors,
        )?;
        r.context("GRAPH_COMPUTE tensors");
        let tensors = r.slice_of::<RpcTensor>(n_tensors)?;
        r.finish("trailing bytes after GRAPH_COMPUTE tensors")?;
        Ok(Graph {
            device,
            uid,
            node_ids,
            tensors,
        })
    }

    /// Node ids as plain integers.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = u64> + 'a {
        self.node_ids.iter().map(|id| id.get())
    }

    /// Size of the encoded payload in bytes.
    pub fn payload_len(&self) -> u64 {
        graph_payload_size(
            clamp_len(self.node_ids.len()),
            clamp_len(self.tensors.len()),
        )
        .map_or(u64::MAX, |n| n.saturating_add(uid_len(self.uid)))
    }

    /// Append the payload (without frame header) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (nodes, tensors) = clamp(self.node_ids, self.tensors);
        put_u32(out, self.device);
        if let Some(uid) = self.uid {
            put_u64(out, uid);
        }
        put_u32(out, len_u32(nodes.len()));
        out.extend_from_slice(nodes.as_bytes());
        put_u32(out, len_u32(tensors.len()));
        out.extend_from_slice(tensors.as_bytes());
    }
}

fn uid_len(uid: Option<u64>) -> u64 {
    if uid.is_some() {
        8
    } else {
        0
    }
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn clamp_len(n: usize) -> u64 {
    u64::from(len_u32(n))
}

/// The wire counts are `u32`: arrays longer than that (32+ GiB of ids) are cut so
/// that the frame stays self-consistent.
fn clamp<'s, A, B>(a: &'s [A], b: &'s [B]) -> (&'s [A], &'s [B]) {
    let max = u32::MAX as usize;
    (a.get(..max).unwrap_or(a), b.get(..max).unwrap_or(b))
}

/// Append a GRAPH_COMPUTE payload (without frame header) built from plain node ids; `uid` as
/// in [`Graph::uid`] (`None`: the 7.0.0 layout).
///
/// Arrays longer than `u32::MAX` elements are truncated to `u32::MAX`.
pub fn encode_graph(
    device: u32,
    uid: Option<u64>,
    node_ids: &[u64],
    tensors: &[RpcTensor],
    out: &mut Vec<u8>,
) {
    let (nodes, tensors) = clamp(node_ids, tensors);
    put_u32(out, device);
    if let Some(uid) = uid {
        put_u64(out, uid);
    }
    put_u32(out, len_u32(nodes.len()));
    out.reserve(nodes.len().saturating_mul(8));
    for id in nodes {
        out.extend_from_slice(&id.to_le_bytes());
    }
    put_u32(out, len_u32(tensors.len()));
    out.extend_from_slice(tensors.as_bytes());
}

/// Bytes of a 7.0.0 GRAPH_COMPUTE or GRAPH_RECOMPUTE payload before the place where 8.0.0 has
/// the uid: the `u32 device`.
pub const GRAPH_DEVICE_SIZE: usize = 4;

/// The frame header of a 7.0.0 GRAPH_COMPUTE or GRAPH_RECOMPUTE as 8.0.0's: the payload 8 bytes
/// larger, for the uid [`graph_device_with_uid`] puts in. `None` for a header of any other
/// command, or when the size overflows.
pub fn graph_header_with_uid(h: FrameHeader) -> Option<FrameHeader> {
    let graph = Major::V7.command(h.cmd).is_some_and(Command::runs_graph);
    let size = h.size.checked_add(8)?;
    graph.then_some(FrameHeader { cmd: h.cmd, size })
}

/// The first [`GRAPH_DEVICE_SIZE`] bytes of a 7.0.0 GRAPH_COMPUTE or GRAPH_RECOMPUTE payload
/// (its `u32 device`) as the start of 8.0.0's: the device, then `uid`. The rest of the 7.0.0
/// payload follows unchanged, under the header [`graph_header_with_uid`] gives. A relay that
/// streams a graph uses these two; [`graph_frame_with_uid`] does both to a whole frame.
pub fn graph_device_with_uid(
    device: [u8; GRAPH_DEVICE_SIZE],
    uid: u64,
) -> [u8; GRAPH_DEVICE_SIZE + 8] {
    let mut out = [0u8; GRAPH_DEVICE_SIZE + 8];
    out[..GRAPH_DEVICE_SIZE].copy_from_slice(&device);
    out[GRAPH_DEVICE_SIZE..].copy_from_slice(&uid.to_le_bytes());
    out
}

/// A 7.0.0 GRAPH_COMPUTE or GRAPH_RECOMPUTE request frame (header included) as 8.0.0's: `uid`
/// after the leading `u32 device`, the size 8 larger, every other byte as it was (a relay
/// between the majors does not judge the graph). `None` when `frame` is no frame of either
/// command or is shorter than its header and device.
pub fn graph_frame_with_uid(frame: &[u8], uid: u64) -> Option<Vec<u8>> {
    let (head, body) = frame.split_first_chunk::<FRAME_HEADER_SIZE>()?;
    let cmd = FrameHeader::decode(head).cmd;
    let size = body.len() as u64;
    let header = graph_header_with_uid(FrameHeader { cmd, size })?;
    let (device, rest) = body.split_first_chunk::<GRAPH_DEVICE_SIZE>()?;
    let mut out = Vec::with_capacity(frame.len().saturating_add(8));
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(&graph_device_with_uid(*device, uid));
    out.extend_from_slice(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_borrowed_unaligned() {
        // With one node the tensor array starts at offset 20: not 8-aligned.
        let t = crate::TensorBuilder::new(7, 0).name("n").build();
        let mut buf = Vec::new();
        encode_graph(3, None, &[7], &[t], &mut buf);
        let g = Graph::decode(Major::V7, &buf, &Limits::default()).unwrap();
        assert_eq!(g.device, 3);
        assert_eq!(g.uid, None);
        assert_eq!(g.nodes().collect::<Vec<_>>(), [7]);
        assert_eq!(g.tensors, &[t]);
        assert_eq!(g.payload_len(), buf.len() as u64);
    }

    #[test]
    fn v8_layout_carries_the_uid() {
        // 8.0 delta §B: 20 + 8n + 296m; a one-node graph's tensors start at 28 (unaligned).
        let t = crate::TensorBuilder::new(7, 0).name("n").build();
        let mut buf = Vec::new();
        encode_graph(1, Some(24), &[7], &[t], &mut buf);
        assert_eq!(buf.len(), 20 + 8 + 296);
        assert_eq!(&buf[4..12], &24u64.to_le_bytes());
        let g = Graph::decode(Major::V8, &buf, &Limits::default()).unwrap();
        assert_eq!((g.device, g.uid), (1, Some(24)));
        assert_eq!(g.tensors, &[t]);
        assert_eq!(g.payload_len(), buf.len() as u64);
        let mut again = Vec::new();
        g.encode(&mut again);
        assert_eq!(again, buf);
        // The same bytes read as 7.0 are a different (here: malformed) graph.
        assert!(Graph::decode(Major::V7, &buf, &Limits::default()).is_err());
    }

    #[test]
    fn uid_goes_after_the_device() {
        let limits = Limits::default();
        let t = crate::TensorBuilder::new(7, 0).name("n").build();
        // GRAPH_RECOMPUTE: 7.0 `| u32 device |`, 8.0 `| u32 device | u64 uid |` (spelled out
        // here; request.rs's encoder is above this module).
        let mut v7 = FrameHeader::new(Command::GraphRecompute, 4)
            .encode()
            .to_vec();
        v7.extend_from_slice(&3u32.to_le_bytes());
        let f = graph_frame_with_uid(&v7, 0x0102).unwrap();
        let mut v8 = FrameHeader::new(Command::GraphRecompute, 12)
            .encode()
            .to_vec();
        v8.extend_from_slice(&3u32.to_le_bytes());
        v8.extend_from_slice(&0x0102u64.to_le_bytes());
        assert_eq!(f, v8);
        // A 7.0 graph frame becomes the same graph with the uid in 8.0's layout.
        let mut payload = Vec::new();
        encode_graph(2, None, &[7], &[t], &mut payload);
        let mut frame = FrameHeader::new(Command::GraphCompute, payload.len() as u64)
            .encode()
            .to_vec();
        frame.extend_from_slice(&payload);
        let f = graph_frame_with_uid(&frame, 24).unwrap();
        let h = FrameHeader::decode(f[..9].try_into().unwrap());
        assert_eq!(h.size, payload.len() as u64 + 8);
        let g = Graph::decode(Major::V8, &f[9..], &limits).unwrap();
        assert_eq!((g.device, g.uid, g.tensors), (2, Some(24), &[t][..]));
        // The streamed path's two pieces, the header and the payload's start, make the same.
        let h7 = FrameHeader::decode(frame[..9].try_into().unwrap());
        let h8 = graph_header_with_uid(h7).unwrap();
        assert_eq!(h8, h);
        let mut pieces = h8.encode().to_vec();
        pieces.extend_from_slice(&graph_device_with_uid(frame[9..13].try_into().unwrap(), 24));
        pieces.extend_from_slice(&frame[13..]);
        assert_eq!(pieces, f);
        assert_eq!(
            graph_header_with_uid(FrameHeader::new(Command::SetTensor, 8)),
            None
        );
        let huge = FrameHeader::new(Command::GraphCompute, u64::MAX);
        assert_eq!(graph_header_with_uid(huge), None);
        // Anything else, or too short to hold the device: none.
        assert_eq!(graph_frame_with_uid(&frame[..12], 1), None);
        assert_eq!(graph_frame_with_uid(&[15, 0, 0, 0, 0, 0, 0, 0, 0], 1), None);
        assert_eq!(graph_frame_with_uid(&[], 1), None);
    }
}
