//! Turning wire tensors (`rpc_tensor`) into checked [`TensorSpec`]s: rpc-ggml checks the tensor
//! itself; here its virtual address becomes a buffer of this connection and an offset.
//!
//! Addresses on the wire are virtual: each buffer gets a random base address per connection,
//! so a `data` field can only ever name memory of a buffer this connection allocated.

use rpc_proto::RpcTensor;

use super::{Session, SessionError};
use rpc_ggml::{Buffer, TensorDesc, TensorSpec};

/// How to treat a tensor whose buffer handle this connection does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownBuffer {
    /// Reject it (data commands, graphs).
    Reject,
    /// Treat the tensor as unallocated (GET_ALLOC_SIZE, where the stock client may name buffers
    /// of its other connections).
    Ignore,
}

impl Session {
    /// Validates a wire tensor: the checks of [`TensorSpec::new`] (known type, whole blocks per
    /// row, ...), then this connection's part: its virtual address names a buffer of this
    /// connection (or none, as `unknown` says), and [`TensorSpec::in_buffer`] puts its extent
    /// inside that buffer.
    pub(crate) fn resolve_tensor(
        &self,
        t: &RpcTensor,
        unknown: UnknownBuffer,
    ) -> Result<TensorSpec, SessionError> {
        let spec = TensorSpec::new(TensorDesc {
            type_: t.r#type.get(),
            ne: t.ne.map(|x| x.get()),
            nb: t.nb.map(|x| x.get() as u64),
            op: t.op.get(),
            op_params: t.op_params.map(|x| x.get()),
            flags: t.flags.get(),
            view_offs: t.view_offs.get(),
            name: t.name,
        })
        .map_err(|e| SessionError::tensor(t, e.to_string()))?;
        let handle = t.buffer.get();
        let data = t.data.get();
        let buffer = match (handle, self.buffers.get(&handle)) {
            (0, _) => None,
            (_, Some(e)) => Some(e),
            (h, None) => match unknown {
                UnknownBuffer::Reject => return Err(SessionError::UnknownBuffer(h)),
                UnknownBuffer::Ignore => None,
            },
        };
        match buffer {
            Some(e) => {
                let size = spec.size();
                let outside = || {
                    SessionError::tensor(
                        t,
                        format!(
                            "data {data:#x}+{size} outside its buffer [{:#x}, +{})",
                            e.vbase,
                            e.buffer.size()
                        ),
                    )
                };
                let off = data.checked_sub(e.vbase).ok_or_else(outside)?;
                spec.in_buffer(e.buffer.share(), off).map_err(|_| outside())
            }
            None => {
                if data != 0 && unknown == UnknownBuffer::Reject {
                    return Err(SessionError::tensor(t, "data pointer without a buffer"));
                }
                Ok(spec)
            }
        }
    }

    /// Resolves a tensor that must live in one of this connection's buffers, and the absolute
    /// region `[data + offset, data + offset + len)` of an access to it, which must lie inside
    /// that buffer. Returns the buffer and the region's offset inside it.
    pub(crate) fn resolve_region(
        &self,
        what: &'static str,
        t: &RpcTensor,
        offset: u64,
        len: u64,
    ) -> Result<(&Buffer, u64), SessionError> {
        let handle = t.buffer.get();
        let e = self
            .buffers
            .get(&handle)
            .ok_or(SessionError::UnknownBuffer(handle))?;
        let data = t.data.get();
        let oob = || SessionError::OutOfBounds {
            what,
            detail: format!(
                "data={data:#x} offset={offset} len={len} buffer=[{:#x}, +{})",
                e.vbase,
                e.buffer.size()
            ),
        };
        let start = data
            .checked_sub(e.vbase)
            .and_then(|d| d.checked_add(offset))
            .ok_or_else(oob)?;
        let end = start.checked_add(len).ok_or_else(oob)?;
        if end > e.buffer.size() {
            return Err(oob());
        }
        // The tensor itself must also be a valid tensor of this buffer.
        let spec = self.resolve_tensor(t, UnknownBuffer::Reject)?;
        debug_assert!(spec.buffer().is_some());
        Ok((&e.buffer, start))
    }

    /// [`Session::resolve_region`] for writing: the buffer borrowed mutably.
    pub(crate) fn resolve_region_mut(
        &mut self,
        what: &'static str,
        t: &RpcTensor,
        offset: u64,
        len: u64,
    ) -> Result<(&mut Buffer, u64), SessionError> {
        let (_, off) = self.resolve_region(what, t, offset, len)?;
        Ok((self.buffer_mut(t.buffer.get())?, off))
    }
}
