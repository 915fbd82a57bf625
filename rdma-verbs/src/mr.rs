//! Page-aligned owned buffers and memory regions.
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use crate::context::{Pd, PdInner};
use crate::error::{check, Result, VerbsError};
use crate::sys;
use crate::types::AccessFlags;

/// Zeroed, page-aligned heap memory (what `posix_memalign(page)` gives upstream).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` bytes (> 0), aligned to the page size; the allocation is
    /// rounded up to whole pages.
    pub fn new(len: usize) -> Result<AlignedBuf> {
        Self::with_alignment(len, crate::page_size())
    }

    /// `len` bytes aligned to `align` (a power of two).
    pub fn with_alignment(len: usize, align: usize) -> Result<AlignedBuf> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument("AlignedBuf of 0 bytes".into()));
        }
        let size = len
            .checked_add(align - 1)
            .map(|s| s & !(align - 1))
            .ok_or_else(|| VerbsError::InvalidArgument("AlignedBuf too large".into()))?;
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| VerbsError::InvalidArgument(format!("AlignedBuf layout: {e}")))?;
        // SAFETY: layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(VerbsError::Os {
            op: "alloc",
            errno: 12, /* ENOMEM */
        })?;
        Ok(AlignedBuf { ptr, len, layout })
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes for the
        // lifetime of &self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in with_alignment with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// A registered memory region that owns its buffer.  The registration is
/// removed (`ibv_dereg_mr`) before the memory is freed.
///
/// Contract with the hardware (cannot be checked by the crate): while a
/// receive is posted on a range, the device may write it at any time, and
/// while a non-inline send is outstanding the device reads it.  Only access
/// a range (via [`Mr::as_slice`], [`Mr::read_at`], [`Mr::as_mut_slice`],
/// [`Mr::write_at`]) after its completion was polled, as every verbs program
/// must.
pub struct Mr {
    ptr: *mut c_void,
    lkey: u32,
    rkey: u32,
    // Dropped after the deregistration in Drop::drop.
    buf: AlignedBuf,
    pub(crate) pd: Arc<PdInner>,
}

// SAFETY: the MR handle may be used from any thread; buffer access follows
// the usual &/&mut rules (writes need &mut self).
unsafe impl Send for Mr {}
// SAFETY: &Mr only permits reads of the buffer and reading the keys; posting
// a work request on it is `unsafe` (Qp::post_send/post_recv) or goes through
// OwnedQp, which owns the Mr.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `buf` with `access` (`ibv_reg_mr`).  Apple's provider
    /// rejects LOCAL_WRITE-only regions: use
    /// `LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE` there.
    pub fn new(pd: &Pd, mut buf: AlignedBuf, access: AccessFlags) -> Result<Mr> {
        let mut mr = ptr::null_mut();
        let (mut lkey, mut rkey) = (0u32, 0u32);
        let addr = buf.as_mut_slice().as_mut_ptr().cast::<c_void>();
        // SAFETY: pd valid; addr/len describe memory owned by `buf`, which
        // the returned Mr keeps alive until after ibv_dereg_mr.
        check("ibv_reg_mr", unsafe {
            sys::rv_reg_mr(
                pd.0.ptr,
                addr,
                buf.len(),
                access.raw(),
                &mut mr,
                &mut lkey,
                &mut rkey,
            )
        })?;
        Ok(Mr {
            ptr: mr,
            lkey,
            rkey,
            buf,
            pd: pd.0.clone(),
        })
    }

    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// Copies `dst.len()` bytes from `offset`.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let r = self.range(offset, dst.len())?;
        dst.copy_from_slice(&self.buf.as_slice()[r]);
        Ok(())
    }

    /// Copies `src` to `offset`.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        let r = self.range(offset, src.len())?;
        self.buf.as_mut_slice()[r].copy_from_slice(src);
        Ok(())
    }

    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.buf.len() => Ok(offset..end),
            _ => Err(VerbsError::InvalidArgument(format!(
                "range {offset}+{len} outside MR of {} bytes",
                self.buf.len()
            ))),
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_reg_mr and is deregistered exactly once,
        // before `buf` is freed (fields drop after this body).
        let _ = unsafe { sys::rv_dereg_mr(self.ptr) };
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mr(lkey={:#x}, rkey={:#x}, {} bytes)",
            self.lkey,
            self.rkey,
            self.buf.len()
        )
    }
}
