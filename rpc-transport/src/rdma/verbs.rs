//! The few verbs operations a flavor needs from one connected queue pair, as a trait, so the
//! flavors run unchanged on real verbs (`rdma-verbs`) and on the in-process fake fabric.

use std::io;

/// Outcome of a work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    /// Receive completion (else send).
    pub recv: bool,
    /// Bytes received (receive completions).
    pub byte_len: u32,
    /// `None` on success, else the verbs status code.
    pub error: Option<u32>,
}

/// One queue pair with a registered send region and a registered receive region.
pub trait Verbs: Send {
    /// The registered memory SENDs are posted from.
    fn send_mem(&mut self) -> &mut [u8];
    /// The registered memory receives land in.
    fn recv_mem(&self) -> &[u8];
    /// Posts a signaled SEND of `send_mem()[offset..offset+len]` (copied into the WQE when
    /// `inline`).
    fn post_send(&mut self, wr_id: u64, offset: usize, len: usize, inline: bool) -> io::Result<()>;
    /// Posts a receive into `recv_mem()[offset..offset+len]`.
    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> io::Result<()>;
    /// Appends the available completions (send and receive) to `out`, without blocking.
    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()>;
    /// Largest inline SEND the QP was granted (0: none).
    fn max_inline(&self) -> usize;
    /// Arms completion notification on the QP's completion queues and returns the channel that
    /// gets an event at the next completion; `None` when there is no completion channel (the
    /// caller then polls on a timer). A completion already queued raises no event: poll once
    /// more after arming.
    fn arm(&mut self) -> io::Result<Option<rdma_verbs::CompChannel>> {
        Ok(None)
    }
}

pub(crate) fn wc_error(what: &str, wc: &Wc) -> io::Error {
    io::Error::other(format!(
        "RDMA {what} completion error: status={} wr_id={:#x}",
        wc.error.unwrap_or(0),
        wc.wr_id
    ))
}
