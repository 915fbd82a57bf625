//! 8.0's collectives in the session: COMM_INIT joins the device's pairwise link (set up through
//! the session's [`Connector`](crate::peer::Connector)), COMM_ALLREDUCE sums a partial with the
//! peer's over it (`peer.rs`: [`allreduce_f32`](crate::peer::allreduce_f32)), COMM_FREE leaves it.

use rpc_proto::{CommInit, RpcTensor};

use super::limits::Charge;
use super::tensor::UnknownBuffer;
use super::{Session, SessionError};
use crate::peer::PeerLink;

/// A device's pairwise link and the memory its allreduces reuse: the partial and the wire's
/// scratch, grown to the largest allreduce so far and charged to the budget once per growth
/// (a charge per allreduce would cost a session process a round trip to its front each time).
pub(crate) struct Joined {
    link: Box<dyn PeerLink>,
    own: Vec<u8>,
    scratch: Vec<u8>,
    /// Charged for `own` and `scratch` (three partials' worth).
    charge: Option<Charge>,
    charged: u64,
    /// Allreduces done and bytes sent on the link (each way), for the log at COMM_FREE.
    allreduces: u64,
    sent: u64,
}

impl Joined {
    fn new(link: Box<dyn PeerLink>) -> Joined {
        Joined {
            link,
            own: Vec::new(),
            scratch: Vec::new(),
            charge: None,
            charged: 0,
            allreduces: 0,
            sent: 0,
        }
    }
}

impl Session {
    /// COMM_INIT: whether this server joined the device's pairwise communicator (stock rules:
    /// a valid device, world 2, rank 0 or 1; a device that has a peer already answers 1). A
    /// server that cannot set up the link answers 0 and the client reduces through itself
    /// (never a close: the stock client would abort).
    pub(super) fn comm_init(&mut self, init: &CommInit) -> bool {
        if self.device(init.device).is_err() || init.world != 2 || init.rank >= init.world {
            return false;
        }
        let d = init.device as usize;
        if self.links[d].is_some() {
            return true;
        }
        let Some(connector) = &self.connector else {
            tracing::info!(
                device = init.device,
                "COMM_INIT: no collectives here; the client reduces through itself"
            );
            return false;
        };
        match connector.connect(init) {
            Ok(link) => {
                tracing::info!(
                    device = init.device,
                    rank = init.rank,
                    transport = link.transport(),
                    "joined pairwise comm"
                );
                self.links[d] = Some(Joined::new(link));
                true
            }
            Err(e) => {
                tracing::warn!(
                    device = init.device,
                    rank = init.rank,
                    port = init.port,
                    "COMM_INIT: no link to the peer ({e}); answering 0, the client reduces through itself"
                );
                false
            }
        }
    }

    /// COMM_ALLREDUCE: `tensor += the peer's partial` over the device's link (`peer.rs`).
    pub(super) fn comm_allreduce(
        &mut self,
        device: u32,
        tensor: &RpcTensor,
    ) -> Result<(), SessionError> {
        self.device(device)?;
        let d = device as usize;
        if self.links[d].is_none() {
            return Err(SessionError::NoCommunicator(device));
        }
        let spec = self.resolve_tensor(tensor, UnknownBuffer::Reject)?;
        let len = spec.size();
        if len == 0 {
            return Ok(());
        }
        if spec.type_() != rpc_proto::ggml_type::F32 {
            return Err(SessionError::tensor(
                tensor,
                "COMM_ALLREDUCE of a non-F32 tensor (the stock client sends F32 partials only)",
            ));
        }
        let (_, off) = self.resolve_region("COMM_ALLREDUCE", tensor, 0, len)?;
        let ulen = usize::try_from(len).map_err(|_| SessionError::OutOfMemory("COMM_ALLREDUCE"))?;
        let mut joined = self.links[d]
            .take()
            .ok_or(SessionError::NoCommunicator(device))?;
        // Out of `links` while it works: back in unless the link failed.
        let r = self.allreduce_on(&mut joined, tensor.buffer.get(), off, ulen);
        match r {
            Err(SessionError::Comm(_)) => {}
            _ => self.links[d] = Some(joined),
        }
        r
    }

    /// One allreduce of `ulen` bytes at `off` of buffer `buf` (resolved) over `joined`'s link.
    fn allreduce_on(
        &mut self,
        joined: &mut Joined,
        buf: u64,
        off: u64,
        ulen: usize,
    ) -> Result<(), SessionError> {
        // The partial, the peer's and the bytes sent: three copies, charged like a body, once
        // per growth.
        let need = (ulen as u64).saturating_mul(3);
        if need > joined.charged {
            joined.charge = None;
            joined.charged = 0;
            joined.charge = Some(
                self.budget
                    .charge(self.held, need)
                    .ok_or(SessionError::OutOfMemory("COMM_ALLREDUCE"))?,
            );
            joined.charged = need;
        }
        // Host memory (the CPU backend): summed where it lies, no copy in or out.
        let in_place = match self.buffer_mut(buf)?.host_mut(off, ulen) {
            Some(mut view) => Some(crate::peer::allreduce_f32(
                joined.link.as_mut(),
                &mut view,
                &mut joined.scratch,
            )),
            None => None,
        };
        if let Some(r) = in_place {
            let wire = r.map_err(|e| SessionError::Comm(e.to_string()))? as u64;
            joined.allreduces += 1;
            joined.sent += wire;
            self.link_bytes.0 += wire;
            self.link_bytes.1 += wire;
            return Ok(());
        }
        if joined.own.len() < ulen {
            let more = ulen - joined.own.len();
            joined
                .own
                .try_reserve_exact(more)
                .map_err(|_| SessionError::OutOfMemory("COMM_ALLREDUCE"))?;
            joined.own.resize(ulen, 0);
        }
        let own = &mut joined.own[..ulen];
        self.buffer_mut(buf)?
            .read(off, own)
            .map_err(SessionError::access("COMM_ALLREDUCE"))?;
        let wire = crate::peer::allreduce_f32(joined.link.as_mut(), own, &mut joined.scratch)
            .map_err(|e| SessionError::Comm(e.to_string()))? as u64;
        joined.allreduces += 1;
        joined.sent += wire;
        self.link_bytes.0 += wire;
        self.link_bytes.1 += wire;
        self.buffer_mut(buf)?
            .write(off, own)
            .map_err(SessionError::access("COMM_ALLREDUCE"))?;
        Ok(())
    }

    /// COMM_FREE: the device leaves its link (fine without one); what crossed it is logged.
    pub(super) fn comm_free(&mut self, device: u32) {
        if let Some(link) = self.links[device as usize].take() {
            let (sends, recvs) = link.link.rdma_counters();
            tracing::info!(
                device,
                transport = link.link.transport(),
                allreduces = link.allreduces,
                bytes_each_way = link.sent,
                rdma_sends = sends,
                rdma_recvs = recvs,
                "left pairwise comm"
            );
        }
    }
}
