//! Our extension for worker-to-worker copies (`rpc-shim --one-endpoint` over our servers, see
//! docs/one-endpoint.md): LINK_OPEN opens a link in one of the connection's
//! [`LINK_SLOTS`](rpc_proto::LINK_SLOTS) slots, set up exactly as COMM_INIT's (the same
//! [`Connector`](crate::peer::Connector) and policy: rank 0 only on this server's port + 1000,
//! rank 1 only to an allowed comm peer that answers a well-formed caps block); LINK_SEND sends
//! a tensor's bytes over it, LINK_RECV takes them into a tensor, LINK_CLOSE closes it.
//!
//! One LINK_SEND is one message on the link: a [`LINK_HEADER_SIZE`] header (magic, status,
//! byte count) and, when the status is 1, the bytes. A sender that cannot read its tensor
//! still sends the header (status 0), so the receiver fails at once instead of at its deadline.
//! Both sides know the count from their commands; a header that disagrees fails the link.
//! Commands run in order on each connection, so the bytes leave after the sender's earlier
//! commands (the graph that computed them) and land before the receiver's later ones; the shim
//! issues a copy's LINK_SEND and LINK_RECV in the client's order on every worker, which keeps
//! the rendezvous deadlock-free (the earliest copy not yet done always has both ends at it).

use rpc_proto::{CommInit, RpcTensor, LINK_HEADER_SIZE, LINK_MAGIC, LINK_SLOTS, LINK_VERSION};

use super::limits::Charge;
use super::tensor::UnknownBuffer;
use super::{Session, SessionError};
use crate::peer::PeerLink;

/// The connection's worker-to-worker links and the staging memory their copies reuse (grown
/// to the largest copy so far, charged to the budget once per growth).
#[derive(Default)]
pub(crate) struct Slots {
    links: Vec<Option<Box<dyn PeerLink>>>,
    staging: Vec<u8>,
    charge: Option<Charge>,
    charged: u64,
}

impl Slots {
    fn slot(&mut self, slot: u32) -> Option<&mut Option<Box<dyn PeerLink>>> {
        if slot >= LINK_SLOTS {
            return None;
        }
        if self.links.is_empty() {
            self.links = (0..LINK_SLOTS).map(|_| None).collect();
        }
        self.links.get_mut(slot as usize)
    }
}

fn header(ok: bool, size: u64) -> [u8; LINK_HEADER_SIZE] {
    let mut h = [0u8; LINK_HEADER_SIZE];
    h[..4].copy_from_slice(&LINK_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&u32::from(ok).to_le_bytes());
    h[8..].copy_from_slice(&size.to_le_bytes());
    h
}

fn comm(what: &str, e: std::io::Error) -> SessionError {
    SessionError::Comm(format!("{what}: {e}"))
}

impl Session {
    /// LINK_PROBE: our extension's version and the port this connection reached (0: unknown).
    pub(super) fn link_probe(&self) -> rpc_proto::Response {
        rpc_proto::Response::LinkProbe {
            version: LINK_VERSION,
            port: self
                .connector
                .as_ref()
                .and_then(|c| c.port())
                .map_or(0, u32::from),
        }
    }

    /// LINK_OPEN: whether the slot's link is open (a link already there is closed first). Any
    /// refusal or failure answers 0, as COMM_INIT does.
    pub(super) fn link_open(&mut self, slot: u32, init: &CommInit) -> bool {
        let devices = self.config.devices.len();
        let Some(place) = self.slots.slot(slot) else {
            return false;
        };
        *place = None;
        if init.world != 2 || init.rank >= 2 {
            return false;
        }
        let Some(connector) = &self.connector else {
            return false;
        };
        let as_device = CommInit {
            device: u32::try_from(devices)
                .unwrap_or(u32::MAX)
                .saturating_add(slot),
            ..*init
        };
        match connector.connect(&as_device) {
            Ok(link) => {
                tracing::info!(
                    slot,
                    rank = init.rank,
                    transport = link.transport(),
                    "LINK_OPEN: worker-to-worker link open"
                );
                if let Some(place) = self.slots.slot(slot) {
                    *place = Some(link);
                }
                true
            }
            Err(e) => {
                tracing::warn!(
                    slot,
                    rank = init.rank,
                    port = init.port,
                    "LINK_OPEN: no link ({e})"
                );
                false
            }
        }
    }

    /// LINK_CLOSE: the slot's link, if any, is closed.
    pub(super) fn link_close(&mut self, slot: u32) {
        if let Some(place) = self.slots.slot(slot) {
            *place = None;
        }
    }

    /// The slot's link, taken out while a copy uses it (put back unless the copy failed).
    fn take_link(
        &mut self,
        what: &'static str,
        slot: u32,
    ) -> Result<Box<dyn PeerLink>, SessionError> {
        self.slots
            .slot(slot)
            .and_then(Option::take)
            .ok_or_else(|| SessionError::Comm(format!("{what}: no link in slot {slot}")))
    }

    fn put_link(&mut self, slot: u32, link: Box<dyn PeerLink>) {
        if let Some(place) = self.slots.slot(slot) {
            *place = Some(link);
        }
    }

    /// Grows the staging memory to `len` bytes, charged to the budget.
    fn staging(&mut self, what: &'static str, len: usize) -> Result<(), SessionError> {
        let need = len as u64;
        if need > self.slots.charged {
            self.slots.charge = None;
            self.slots.charged = 0;
            self.slots.charge = Some(
                self.budget
                    .charge(self.held, need)
                    .ok_or(SessionError::OutOfMemory(what))?,
            );
            self.slots.charged = need;
        }
        if self.slots.staging.len() < len {
            let more = len - self.slots.staging.len();
            self.slots
                .staging
                .try_reserve_exact(more)
                .map_err(|_| SessionError::OutOfMemory(what))?;
            self.slots.staging.resize(len, 0);
        }
        Ok(())
    }

    /// LINK_SEND: `size` bytes of `tensor` (its whole data) over the slot's link.
    pub(super) fn link_send(
        &mut self,
        slot: u32,
        tensor: &RpcTensor,
        size: u64,
    ) -> Result<(), SessionError> {
        let mut link = self.take_link("LINK_SEND", slot)?;
        match self.read_for_send(tensor, size) {
            Ok(len) => {
                let r = link.send(&self.slots.staging[..len]);
                r.map_err(|e| comm("LINK_SEND", e))?;
                self.link_bytes.0 += size;
                self.put_link(slot, link);
                Ok(())
            }
            Err(e) => {
                // The peer is told at once; the link stays usable.
                let r = link.send(&header(false, size));
                if r.is_ok() {
                    self.put_link(slot, link);
                }
                Err(e)
            }
        }
    }

    /// Stages the header and `tensor`'s `size` bytes; the message's length.
    fn read_for_send(&mut self, tensor: &RpcTensor, size: u64) -> Result<usize, SessionError> {
        let spec = self.resolve_tensor(tensor, UnknownBuffer::Reject)?;
        let len = spec.size();
        if len != size {
            return Err(SessionError::tensor(
                tensor,
                format!("LINK_SEND of {size} bytes from a tensor of {len}"),
            ));
        }
        let (_, off) = self.resolve_region("LINK_SEND", tensor, 0, size)?;
        let ulen = usize::try_from(size).map_err(|_| SessionError::OutOfMemory("LINK_SEND"))?;
        let total = ulen
            .checked_add(LINK_HEADER_SIZE)
            .ok_or(SessionError::OutOfMemory("LINK_SEND"))?;
        self.staging("LINK_SEND", total)?;
        let mut staging = std::mem::take(&mut self.slots.staging);
        staging[..LINK_HEADER_SIZE].copy_from_slice(&header(true, size));
        let r = self.buffer(tensor.buffer.get()).and_then(|e| {
            e.buffer
                .read(off, &mut staging[LINK_HEADER_SIZE..total])
                .map_err(SessionError::access("LINK_SEND"))
        });
        self.slots.staging = staging;
        r.map(|()| total)
    }

    /// LINK_RECV: `size` bytes from the slot's link into `tensor` from its start (the region
    /// must lie in the tensor's buffer, as SET_TENSOR's must).
    pub(super) fn link_recv(
        &mut self,
        slot: u32,
        tensor: &RpcTensor,
        size: u64,
    ) -> Result<(), SessionError> {
        // Checked before a byte is read or a byte of memory staged: a bad destination fails
        // the link (the peer's bytes would have nowhere to go).
        let (_, off) = self.resolve_region("LINK_RECV", tensor, 0, size)?;
        let ulen = usize::try_from(size).map_err(|_| SessionError::OutOfMemory("LINK_RECV"))?;
        let mut link = self.take_link("LINK_RECV", slot)?;
        let mut h = [0u8; LINK_HEADER_SIZE];
        link.recv(&mut h).map_err(|e| comm("LINK_RECV", e))?;
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let status = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        let count = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        if magic != LINK_MAGIC || status > 1 {
            return Err(SessionError::Comm(
                "LINK_RECV: not a LINK_SEND's header".into(),
            ));
        }
        if count != size {
            return Err(SessionError::Comm(format!(
                "LINK_RECV of {size} bytes met a LINK_SEND of {count}"
            )));
        }
        if status == 0 {
            self.put_link(slot, link);
            return Err(SessionError::Comm(
                "LINK_RECV: the peer's LINK_SEND failed".into(),
            ));
        }
        let buf = tensor.buffer.get();
        // Host memory: the bytes land where they belong, no copy.
        let direct = self
            .buffer_mut(buf)?
            .host_mut(off, ulen)
            .map(|mut view| link.recv(&mut view));
        match direct {
            Some(r) => r.map_err(|e| comm("LINK_RECV", e))?,
            None => {
                self.staging("LINK_RECV", ulen)?;
                let mut staging = std::mem::take(&mut self.slots.staging);
                let r = link.recv(&mut staging[..ulen]);
                let w = r.map_err(|e| comm("LINK_RECV", e)).and_then(|()| {
                    self.buffer_mut(buf)?
                        .write(off, &staging[..ulen])
                        .map_err(SessionError::access("LINK_RECV"))
                });
                self.slots.staging = staging;
                w?;
            }
        }
        self.link_bytes.1 += size;
        self.put_link(slot, link);
        Ok(())
    }
}
