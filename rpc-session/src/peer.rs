//! What the session sees of a server-to-server link, without any I/O: [`Connector`] sets links
//! up for COMM_INIT and LINK_OPEN, a [`PeerLink`] moves bytes to and from the peer, and
//! [`allreduce_f32`] is 8.0's allreduce over one, with the stock wire's bf16 rule.
//!
//! The real connector and links are the server's (`rpc-server/src/comm.rs`: `CommPolicy`, which
//! vets every peer before a partial crosses; `rpc-server/src/link.rs`: the caps exchange, TCP
//! and the RDMA framings); tests pair two sessions in memory (`memory`).

use rpc_proto::{CommInit, COMM_BF16_MIN_ELEMENTS};

/// Sets up links for COMM_INIT.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// The link for `init`, or why there is none (then COMM_INIT answers 0).
    fn connect(&self, init: &CommInit) -> std::io::Result<Box<dyn PeerLink>>;
    /// The RPC port the client reached this server at (rank 0 of a link listens on it + 1000),
    /// for LINK_PROBE.
    fn port(&self) -> Option<u16> {
        None
    }
}

/// One established pairwise link.
pub trait PeerLink: Send {
    /// Sends `send` and receives exactly `recv.len()` bytes, in the rank's order.
    fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()>;
    /// Sends `data` only (a worker-to-worker copy's sending side, LINK_SEND).
    fn send(&mut self, data: &[u8]) -> std::io::Result<()>;
    /// Receives exactly `buf.len()` bytes only (LINK_RECV).
    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<()>;
    /// What the link runs on (`"TCP"`, `"RDMA/RC+lean"`, …).
    fn transport(&self) -> &'static str {
        "TCP"
    }
    /// RDMA SENDs posted and receives completed on the link (zero on TCP).
    fn rdma_counters(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// The links a session of `devices` devices may hold at once: one per device (COMM_INIT) and
/// the connection's [`LINK_SLOTS`](rpc_proto::LINK_SLOTS) (LINK_OPEN asks for slot `s` as
/// "device" `devices + s`, under the same policy otherwise).
pub fn link_targets(devices: usize) -> usize {
    devices.saturating_add(rpc_proto::LINK_SLOTS as usize)
}

/// Whether an F32 partial of `n` elements travels as bf16.
pub fn travels_as_bf16(n: u64) -> bool {
    n >= COMM_BF16_MIN_ELEMENTS
}

/// ggml's `fp32 → bf16`: round to nearest even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    let quiet_nan = (u >> 16) | 64;
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16;
    // A select, not a branch: the loop over a partial vectorizes.
    (if (u & 0x7fff_ffff) > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

/// `bf16 → f32`.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// One allreduce of an F32 partial (`own`, little-endian f32s) over `link`: `own += peer`, in
/// place, the peer's partial as received. `scratch` (reused between calls, grown only) holds what
/// is sent and what is received; returns the bytes that crossed the link each way. The loops are
/// written over whole elements so that the compiler vectorizes them.
pub fn allreduce_f32(
    link: &mut dyn PeerLink,
    own: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let n = own.len() / 4;
    let bf16 = travels_as_bf16(n as u64);
    let wire = if bf16 { 2 * n } else { 4 * n };
    if scratch.len() < 2 * wire {
        scratch.resize(2 * wire, 0);
    }
    let (send, recv) = scratch[..2 * wire].split_at_mut(wire);
    let own = &mut own[..4 * n];
    if bf16 {
        for (c, out) in own.chunks_exact(4).zip(send.chunks_exact_mut(2)) {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            out.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
        }
    } else {
        send.copy_from_slice(own);
    }
    link.exchange(send, recv)?;
    if bf16 {
        for (c, b) in own.chunks_exact_mut(4).zip(recv.chunks_exact(2)) {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            c.copy_from_slice(&(x + y).to_le_bytes());
        }
    } else {
        for (c, b) in own.chunks_exact_mut(4).zip(recv.chunks_exact(4)) {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            c.copy_from_slice(&(x + y).to_le_bytes());
        }
    }
    Ok(wire)
}

/// Two ends of an in-memory link (tests): each `exchange` hands the bytes to the other end.
#[cfg(test)]
pub(crate) mod memory {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use super::PeerLink;

    pub(crate) struct MemLink {
        pub(crate) tx: Sender<Vec<u8>>,
        pub(crate) rx: Receiver<Vec<u8>>,
        /// What `recv` took of a message and has not handed out yet.
        pub(crate) pending: Vec<u8>,
    }

    pub(crate) fn pair() -> (MemLink, MemLink) {
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        (
            MemLink {
                tx: a_tx,
                rx: a_rx,
                pending: Vec::new(),
            },
            MemLink {
                tx: b_tx,
                rx: b_rx,
                pending: Vec::new(),
            },
        )
    }

    impl PeerLink for MemLink {
        fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()> {
            self.tx
                .send(send.to_vec())
                .map_err(|_| std::io::Error::other("peer gone"))?;
            let got = self
                .rx
                .recv()
                .map_err(|_| std::io::Error::other("peer gone"))?;
            if got.len() != recv.len() {
                return Err(std::io::Error::other("length mismatch"));
            }
            recv.copy_from_slice(&got);
            Ok(())
        }

        fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
            self.tx
                .send(data.to_vec())
                .map_err(|_| std::io::Error::other("peer gone"))
        }

        fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
            // Messages are taken whole or in order, like a byte stream.
            let mut done = 0;
            while done < buf.len() {
                if self.pending.is_empty() {
                    self.pending = self
                        .rx
                        .recv()
                        .map_err(|_| std::io::Error::other("peer gone"))?;
                }
                let n = self.pending.len().min(buf.len() - done);
                buf[done..done + n].copy_from_slice(&self.pending[..n]);
                self.pending.drain(..n);
                done += n;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn bf16_rounds_to_nearest_even_like_ggml() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 is halfway too: ties to even (up).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(0x4049), 3.140625);
    }

    /// Small partials are summed exactly and both ranks agree; large ones cross as bf16 and
    /// each rank adds the peer's rounded partial to its own exact one (so they differ, as the
    /// stock ranks do).
    #[test]
    fn allreduce_small_exact_large_bf16() {
        for n in [4usize, 32767, 32768] {
            let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 1e-3).collect();
            let y: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 7e-4).collect();
            let (mut a, mut b) = memory::pair();
            let (mut xa, mut yb) = (f32s(&x), f32s(&y));
            let t = std::thread::spawn(move || {
                let mut s = Vec::new();
                let wire = allreduce_f32(&mut b, &mut yb, &mut s).unwrap();
                (yb, wire)
            });
            let mut s = Vec::new();
            allreduce_f32(&mut a, &mut xa, &mut s).unwrap();
            let (yb, wire) = t.join().unwrap();
            let (ra, rb) = (back(&xa), back(&yb));
            if n < 32768 {
                assert_eq!(wire, 4 * n);
                for i in 0..n {
                    assert_eq!(ra[i], x[i] + y[i]);
                    assert_eq!(ra[i].to_bits(), rb[i].to_bits());
                }
            } else {
                assert_eq!(wire, 2 * n);
                for i in [0, 1, n / 2, n - 1] {
                    assert_eq!(ra[i], x[i] + bf16_to_f32(f32_to_bf16(y[i])));
                    assert_eq!(rb[i], y[i] + bf16_to_f32(f32_to_bf16(x[i])));
                }
                assert!((0..n).any(|i| ra[i] != rb[i]));
            }
        }
    }
}
