//! 8.0's strided copies, SET_TENSOR_2D and GET_TENSOR_2D: `n_copies` chunks of `size` bytes at
//! tensor offsets `offset + i·stride`, packed on the wire; every bound of the stock server checked
//! before a byte moves. SET_TENSOR_2D's data is a streamed body (`body.rs`), written run by run
//! to the region checked here.

use rpc_proto::{Region2d, RpcTensor};

use super::tensor::UnknownBuffer;
use super::{Session, SessionError};
use rpc_ggml::Buffer;

impl Session {
    /// GET_TENSOR_2D: the chunks, packed.
    pub(super) fn get_tensor_2d(
        &self,
        tensor: &RpcTensor,
        region: Region2d,
    ) -> Result<Vec<u8>, SessionError> {
        let (buf, off) = self.resolve_region_2d("GET_TENSOR_2D", tensor, region)?;
        // size · n_copies may far exceed the region (stride 0 repeats one chunk): a reply larger
        // than the tensor (which no stock client asks for: it reads slices of rows, stride ≥
        // size) is refused, and the reply is charged to the budget before it is allocated.
        let len = region.wire_len().unwrap_or(u64::MAX);
        let tsize = self
            .resolve_tensor(tensor, UnknownBuffer::Reject)
            .map(|s| s.size())?;
        if len > tsize {
            return Err(SessionError::OutOfBounds {
                what: "GET_TENSOR_2D",
                detail: format!("a reply of {len} bytes from a {tsize}-byte tensor"),
            });
        }
        let _charge = self
            .budget
            .charge(self.held, len)
            .ok_or(SessionError::OutOfMemory("GET_TENSOR_2D reply"))?;
        let ulen =
            usize::try_from(len).map_err(|_| SessionError::OutOfMemory("GET_TENSOR_2D reply"))?;
        let mut out = Vec::new();
        out.try_reserve_exact(ulen)
            .map_err(|_| SessionError::OutOfMemory("GET_TENSOR_2D reply"))?;
        out.resize(ulen, 0);
        for (i, chunk) in out.chunks_mut(region.size as usize).enumerate() {
            buf.read(off + i as u64 * region.stride, chunk)
                .map_err(SessionError::access("GET_TENSOR_2D"))?;
        }
        Ok(out)
    }

    /// The region of a SET_TENSOR_2D / GET_TENSOR_2D, checked as the stock server checks it
    /// before a byte moves: size and count non-zero, the span `(n_copies − 1)·stride + size`
    /// without overflow, inside the tensor's buffer and inside the tensor itself.
    pub(super) fn resolve_region_2d(
        &self,
        what: &'static str,
        tensor: &RpcTensor,
        region: Region2d,
    ) -> Result<(&Buffer, u64), SessionError> {
        let oob = |detail: String| SessionError::OutOfBounds { what, detail };
        let span = region.span().ok_or_else(|| {
            oob(format!(
                "size={} n_copies={} stride={}: zero or overflowing",
                region.size, region.n_copies, region.stride
            ))
        })?;
        region
            .wire_len()
            .ok_or_else(|| oob("size × n_copies overflows".into()))?;
        usize::try_from(region.size).map_err(|_| oob("chunk too large".into()))?;
        let spec = self.resolve_tensor(tensor, UnknownBuffer::Reject)?;
        let tsize = spec.size();
        if region.offset > tsize || span > tsize - region.offset {
            return Err(oob(format!(
                "offset={} span={span} tensor size={tsize}",
                region.offset
            )));
        }
        self.resolve_region(what, tensor, region.offset, span)
    }
}
