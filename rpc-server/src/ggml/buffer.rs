//! Backend buffers: device memory that tensors live in.

use std::sync::atomic::{AtomicBool, Ordering};

use super::sys;

/// An owned ggml backend buffer, freed on drop.
///
/// Sessions share buffers with their stored graphs through `Arc<Buffer>`, so memory a graph
/// points into can never be freed under it.
pub struct Buffer {
    raw: sys::ggml_backend_buffer_t,
    base: usize,
    size: usize,
    is_host: bool,
}

// SAFETY: a ggml buffer may be used from any thread. Writes through `&self` (set/clear/memset)
// happen only from the owning session, which processes its commands one at a time, so there is
// no concurrent access to the same buffer.
unsafe impl Send for Buffer {}
// SAFETY: see Send.
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn from_raw(raw: sys::ggml_backend_buffer_t) -> Option<Buffer> {
        if raw.is_null() {
            return None;
        }
        // SAFETY: raw is a live buffer just returned by ggml.
        let (base, size, is_host) = unsafe {
            (
                sys::ggml_backend_buffer_get_base(raw) as usize,
                sys::ggml_backend_buffer_get_size(raw),
                sys::ggml_backend_buffer_is_host(raw),
            )
        };
        if is_host && HUGE_PAGES.load(Ordering::Relaxed) {
            advise_huge_pages(base, size as usize);
        }
        Some(Buffer {
            raw,
            base,
            size,
            is_host,
        })
    }

    pub(crate) fn raw(&self) -> sys::ggml_backend_buffer_t {
        self.raw
    }

    /// Real base address of the buffer memory (host or device address).
    pub fn base(&self) -> usize {
        self.base
    }

    /// Usable size in bytes.
    pub fn size(&self) -> u64 {
        self.size as u64
    }

    /// Whether the memory is directly addressable by the CPU.
    pub fn is_host(&self) -> bool {
        self.is_host
    }

    /// Fills the whole buffer with `value`.
    pub fn clear(&self, value: u8) {
        // SAFETY: live buffer; see the Sync note on exclusive use.
        unsafe { sys::ggml_backend_buffer_clear(self.raw, value) };
    }

    fn check(&self, offset: u64, len: usize) -> Option<usize> {
        let off = usize::try_from(offset).ok()?;
        let end = off.checked_add(len)?;
        (end <= self.size).then_some(off)
    }

    /// Host memory `[offset, offset+len)` for writing, when the buffer is host memory and the
    /// region is inside it.
    #[allow(clippy::mut_from_ref)]
    pub fn host_slice_mut(&self, offset: u64, len: usize) -> Option<&mut [u8]> {
        if !self.is_host || self.base == 0 {
            return None;
        }
        let off = self.check(offset, len)?;
        // SAFETY: the region lies inside the live host allocation (checked above); the owning
        // session has exclusive use of the buffer while the slice is alive (see Sync note).
        Some(unsafe { std::slice::from_raw_parts_mut((self.base + off) as *mut u8, len) })
    }

    /// Host memory `[offset, offset+len)` for reading.
    pub fn host_slice(&self, offset: u64, len: usize) -> Option<&[u8]> {
        self.host_slice_mut(offset, len).map(|s| &*s)
    }

    /// Copies `data` to `[offset, offset+data.len())`. Returns false when out of bounds.
    pub fn write(&self, offset: u64, data: &[u8]) -> bool {
        if let Some(dst) = self.host_slice_mut(offset, data.len()) {
            dst.copy_from_slice(data);
            return true;
        }
        let Some(off) = self.check(offset, data.len()) else {
            return false;
        };
        if data.is_empty() {
            return true;
        }
        super::tensor::with_byte_tensor(self, off, data.len(), |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer.
            unsafe { sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, data.len()) }
        })
        .is_some()
    }

    /// Copies `[offset, offset+out.len())` into `out`. Returns false when out of bounds.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        if let Some(src) = self.host_slice(offset, out.len()) {
            out.copy_from_slice(src);
            return true;
        }
        let Some(off) = self.check(offset, out.len()) else {
            return false;
        };
        if out.is_empty() {
            return true;
        }
        let len = out.len();
        super::tensor::with_byte_tensor(self, off, len, |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer.
            unsafe { sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, len) }
        })
        .is_some()
    }

    /// Fills `[offset, offset+len)` with `value`. Returns false when out of bounds.
    pub fn memset(&self, offset: u64, len: u64, value: u8) -> bool {
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        if let Some(dst) = self.host_slice_mut(offset, len) {
            dst.fill(value);
            return true;
        }
        let Some(off) = self.check(offset, len) else {
            return false;
        };
        if len == 0 {
            return true;
        }
        super::tensor::with_byte_tensor(self, off, len, |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer.
            unsafe { sys::ggml_backend_tensor_memset(t, value, 0, len) }
        })
        .is_some()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: raw came from ggml_backend_buft_alloc_buffer and is freed exactly once; no
        // graph can still use it because graphs hold an Arc<Buffer>.
        unsafe { sys::ggml_backend_buffer_free(self.raw) };
    }
}

/// Whether host buffers ask the kernel for huge pages (see [`use_huge_pages`]).
static HUGE_PAGES: AtomicBool = AtomicBool::new(true);

/// Host (CPU) buffers of 2 MiB and more ask Linux for transparent huge pages
/// (`madvise(MADV_HUGEPAGE)` on their 2 MiB-aligned interior) unless turned off here
/// (`--no-huge-pages`). Every token reads all weights: with 4 KiB pages that is one TLB entry per
/// 4 KiB of model, and on a machine whose THP mode is `madvise` (Debian's default) nothing else
/// asks for larger ones. The README's "Generation speed" section measures the gain. No effect where THP is `always` or `never`, nor on other systems.
pub fn use_huge_pages(on: bool) {
    HUGE_PAGES.store(on, Ordering::Relaxed);
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(base: usize, size: usize) {
    const HUGE: usize = 2 << 20;
    let start = base.next_multiple_of(HUGE);
    let end = (base + size) & !(HUGE - 1);
    if end > start {
        // SAFETY: the range lies inside the live allocation; MADV_HUGEPAGE changes only how the
        // kernel backs it, never its contents or mapping.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_base: usize, _size: usize) {}
