//! A queue pair that owns the memory regions it posts from and into ([`OwnedQp`]), so posting is
//! safe: no region can be deregistered while a work request on it may still be outstanding.
use crate::error::{Result, VerbsError};
use crate::mr::Mr;
use crate::qp::Qp;
use crate::types::SendFlags;
use std::sync::Arc;

/// A queue pair together with its send region and its receive region.
///
/// Posting through [`Qp::post_send`] / [`Qp::post_recv`] is `unsafe`: the region must stay
/// registered until the work request completes or the QP is destroyed, which the borrow of a
/// `&Mr` for the duration of the call cannot promise. Here the regions cannot go away first:
///
/// * the type owns both [`Mr`]s and hands out only `&Mr` and `&mut [u8]` of the send buffer,
///   never `&mut Mr` or the `Mr` itself, so a caller can neither drop, move out nor swap a
///   region while the QP lives;
/// * the QP is the first field, so dropping an `OwnedQp` destroys the QP (`ibv_destroy_qp`:
///   the device forgets every outstanding work request) before either region is deregistered
///   (the Apple rule, llama.cpp PR #27908, holds by construction instead of by the caller's
///   field order);
/// * both regions are checked at construction to belong to the QP's protection domain.
///
/// What stays with the caller is the ordinary verbs discipline about *contents*: the bytes of a
/// range with an outstanding receive change when the device writes them, and the bytes of a
/// range with an outstanding non-inline send are read by the device at some time before its
/// completion; read a received range after its completion and rewrite a sent range after its
/// completion. Breaking that gives wrong bytes, never a write to freed or foreign memory.
///
/// `Send`/`Sync` follow from the fields ([`Qp`] and [`Mr`] are both): posting from several
/// threads relies on the provider locking its queues, as [`Qp`] documents.
pub struct OwnedQp {
    // Field order is drop order: the QP is destroyed before the regions are deregistered.
    qp: Qp,
    send: Mr,
    recv: Mr,
}

impl OwnedQp {
    /// Takes ownership of `qp` and the regions it will send from and receive into. Both
    /// regions must belong to the QP's protection domain.
    pub fn new(qp: Qp, send: Mr, recv: Mr) -> Result<OwnedQp> {
        for (what, mr) in [("send", &send), ("recv", &recv)] {
            if !Arc::ptr_eq(&mr.pd, qp.pd()) {
                return Err(VerbsError::InvalidArgument(format!(
                    "{what} MR belongs to another PD than the QP"
                )));
            }
        }
        Ok(OwnedQp { qp, send, recv })
    }

    /// The queue pair (state transitions, number, capabilities).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The region SENDs are posted from (read-only: keys, length, contents).
    pub fn send_mr(&self) -> &Mr {
        &self.send
    }

    /// The send buffer, to fill before [`OwnedQp::post_send`].
    pub fn send_mem_mut(&mut self) -> &mut [u8] {
        self.send.as_mut_slice()
    }

    /// The region receives land in (read-only: keys, length, contents).
    pub fn recv_mr(&self) -> &Mr {
        &self.recv
    }

    /// Posts one SEND of `send_mr()[offset..offset+len]` ([`Qp::post_send`]'s checks and flags).
    pub fn post_send(&self, wr_id: u64, offset: usize, len: usize, flags: SendFlags) -> Result<()> {
        // SAFETY: `self.send` is owned by self and cannot be dropped, moved out or replaced while
        // self lives (only `&Mr` and `&mut [u8]` of it are handed out); self drops `qp` before
        // `send`, so the region stays registered until the QP is destroyed, which ends every
        // outstanding work request.
        unsafe { self.qp.post_send(wr_id, &self.send, offset, len, flags) }
    }

    /// Posts one SEND whose payload is copied inline from `data` ([`Qp::post_send_inline`]).
    pub fn post_send_inline(&self, wr_id: u64, data: &[u8], flags: SendFlags) -> Result<()> {
        self.qp.post_send_inline(wr_id, data, flags)
    }

    /// Posts one receive into `recv_mr()[offset..offset+len]` ([`Qp::post_recv`]'s checks).
    pub fn post_recv(&self, wr_id: u64, offset: usize, len: usize) -> Result<()> {
        // SAFETY: as in post_send, for `self.recv`: owned, never handed out mutably or by value,
        // and deregistered only after the QP is destroyed.
        unsafe { self.qp.post_recv(wr_id, &self.recv, offset, len) }
    }
}

impl std::fmt::Debug for OwnedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedQp")
            .field("qp", &self.qp)
            .field("send", &self.send)
            .field("recv", &self.recv)
            .finish()
    }
}
