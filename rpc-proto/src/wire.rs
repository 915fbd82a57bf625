//! Primitive little-endian reading and writing.
//!
//! [`Reader`] is a bounds-checked cursor over a borrowed slice: every read
//! returns `Result` instead of panicking. [`put_u32`] and friends append to a `Vec<u8>`.

use zerocopy::FromBytes;

use crate::consts::RPC_TENSOR_SIZE;
use crate::error::DecodeError;
use crate::tensor::RpcTensor;

/// A cursor over an untrusted payload. Reads never panic.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    /// Names the message in `TooShort` / `Malformed` errors.
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    /// Bytes not yet consumed.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Take the next `n` bytes, or fail with `TooShort` without consuming anything.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        match self.buf.split_at_checked(n) {
            Some((head, tail)) => {
                self.buf = tail;
                Ok(head)
            }
            None => Err(DecodeError::TooShort {
                what: self.what,
                need: n as u64,
                got: self.buf.len() as u64,
            }),
        }
    }

    /// Take the next `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let [b] = self.array::<1>()?;
        Ok(b)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn tensor(&mut self) -> Result<RpcTensor, DecodeError> {
        let bytes = self.take(RPC_TENSOR_SIZE)?;
        RpcTensor::read_from_bytes(bytes).map_err(|_| DecodeError::Malformed(self.what))
    }

    /// Borrow `count` consecutive `T`s (each `size_of::<T>()` bytes) from the wire.
    ///
    /// The byte length is computed with checked arithmetic and compared with what is
    /// left before anything is touched.
    pub(crate) fn slice_of<T>(&mut self, count: usize) -> Result<&'a [T], DecodeError>
    where
        T: FromBytes + zerocopy::Immutable + zerocopy::KnownLayout + zerocopy::Unaligned,
    {
        let Some(len) = count.checked_mul(core::mem::size_of::<T>()) else {
            return Err(DecodeError::TooShort {
                what: self.what,
                need: u64::MAX,
                got: self.buf.len() as u64,
            });
        };
        let bytes = self.take(len)?;
        <[T]>::ref_from_bytes(bytes).map_err(|_| DecodeError::Malformed(self.what))
    }

    /// All remaining bytes.
    pub(crate) fn rest(self) -> &'a [u8] {
        self.buf
    }

    /// Rename what is being decoded, for the errors of the following reads.
    pub(crate) fn context(&mut self, what: &'static str) {
        self.what = what;
    }

    /// Succeed only if every byte was consumed; otherwise `Malformed(trailing)`.
    pub(crate) fn finish(self, trailing: &'static str) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed(trailing))
        }
    }
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_tensor(out: &mut Vec<u8>, t: &RpcTensor) {
    out.extend_from_slice(zerocopy::IntoBytes::as_bytes(t));
}

/// Append a `u64` placeholder and return its position, for [`patch_len`].
pub(crate) fn reserve_len(out: &mut Vec<u8>) -> usize {
    let pos = out.len();
    put_u64(out, 0);
    pos
}

/// Write into the placeholder at `pos` the number of bytes appended after it.
pub(crate) fn patch_len(out: &mut [u8], pos: usize) {
    let start = pos.saturating_add(8);
    let len = out.len().saturating_sub(start) as u64;
    if let Some(slot) = out.get_mut(pos..start) {
        slot.copy_from_slice(&len.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_never_overreads() {
        let data = [1u8, 0, 0, 0, 2];
        let mut r = Reader::new(&data, "t");
        assert_eq!(r.u32(), Ok(1));
        assert_eq!(
            r.u32(),
            Err(DecodeError::TooShort {
                what: "t",
                need: 4,
                got: 1
            })
        );
        assert_eq!(r.remaining(), 1);
        assert_eq!(r.u8(), Ok(2));
        assert!(r.finish("x").is_ok());
    }

    #[test]
    fn slice_of_overflowing_count() {
        let data = [0u8; 16];
        let mut r = Reader::new(&data, "t");
        assert!(r.slice_of::<crate::U64>(usize::MAX).is_err());
        assert_eq!(r.slice_of::<crate::U64>(2).map(|s| s.len()), Ok(2));
    }
}
