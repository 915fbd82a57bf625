//! Turning wire tensors (`rpc_tensor`) into validated [`TensorSpec`]s.
//!
//! Addresses on the wire are virtual: each buffer gets a random base address per connection,
//! so a `data` field can only ever name memory of a buffer this connection allocated.

use rpc_proto::RpcTensor;

use super::{Session, SessionError};
use rpc_ggml::{ops, type_info, Buffer, BufferRef, TensorSpec};

/// How to treat a tensor whose buffer handle this connection does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnknownBuffer {
    /// Reject it (data commands, graphs).
    Reject,
    /// Treat the tensor as unallocated (GET_ALLOC_SIZE, where the stock client may name buffers
    /// of its other connections).
    Ignore,
}

/// `ggml_nbytes` with checked arithmetic: the extent in bytes of a tensor with these strides.
pub fn nbytes(type_: u32, ne: &[u32; 4], nb: &[u64; 4]) -> Option<u64> {
    let info = type_info(type_)?;
    if ne.contains(&0) {
        return Some(0);
    }
    let mut total: u128 = if info.blck_size == 1 {
        info.type_size as u128
    } else {
        (ne[0] as u128) * (nb[0] as u128) / (info.blck_size as u128)
    };
    let start = if info.blck_size == 1 { 0 } else { 1 };
    for i in start..4 {
        total += (ne[i] as u128 - 1) * nb[i] as u128;
    }
    u64::try_from(total).ok()
}

impl Session {
    /// Validates a wire tensor: known type, whole blocks per row, extent inside its buffer.
    pub(crate) fn resolve_tensor(
        &self,
        t: &RpcTensor,
        unknown: UnknownBuffer,
    ) -> Result<TensorSpec, SessionError> {
        let type_ = t.r#type.get();
        let info = type_info(type_)
            .ok_or_else(|| SessionError::tensor(t, format!("invalid type {type_}")))?;
        let ne = t.ne.map(|x| x.get());
        let nb = t.nb.map(|x| x.get() as u64);
        if !(ne[0] as u64).is_multiple_of(info.blck_size) {
            return Err(SessionError::tensor(
                t,
                format!(
                    "ne[0]={} is not a multiple of the block size {}",
                    ne[0], info.blck_size
                ),
            ));
        }
        // ggml_new_tensor_impl's GGML_ASSERT(INT64_MAX / ne[i] > current_nelements), exactly.
        let mut nel = ne[0] as i64;
        for &n in &ne[1..] {
            if n > 1 {
                if i64::MAX / n as i64 <= nel {
                    return Err(SessionError::tensor(
                        t,
                        format!("element count of {ne:?} overflows int64"),
                    ));
                }
                nel *= n as i64;
            }
        }
        let op = t.op.get();
        if op >= ops::COUNT {
            return Err(SessionError::tensor(t, format!("invalid op {op}")));
        }
        if matches!(
            op,
            ops::CUSTOM | ops::MAP_CUSTOM1 | ops::MAP_CUSTOM2 | ops::MAP_CUSTOM3
        ) {
            return Err(SessionError::tensor(
                t,
                "custom ops carry code pointers and are refused",
            ));
        }
        let size =
            nbytes(type_, &ne, &nb).ok_or_else(|| SessionError::tensor(t, "size overflows"))?;
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
        let buffer: Option<(BufferRef, u64)> = match buffer {
            Some(e) => {
                let off = data
                    .checked_sub(e.vbase)
                    .filter(|off| {
                        off.checked_add(size)
                            .is_some_and(|end| end <= e.buffer.size())
                    })
                    .ok_or_else(|| {
                        SessionError::tensor(
                            t,
                            format!(
                                "data {data:#x}+{size} outside its buffer [{:#x}, +{})",
                                e.vbase,
                                e.buffer.size()
                            ),
                        )
                    })?;
                Some((e.buffer.share(), off))
            }
            None => {
                if data != 0 && unknown == UnknownBuffer::Reject {
                    return Err(SessionError::tensor(t, "data pointer without a buffer"));
                }
                None
            }
        };
        let mut name = t.name;
        name[63] = 0;
        Ok(TensorSpec {
            type_,
            ne,
            nb,
            op,
            op_params: t.op_params.map(|x| x.get()),
            flags: t.flags.get(),
            buffer,
            view_offs: t.view_offs.get(),
            name,
        })
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
        debug_assert!(spec.buffer.is_some());
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
