//! Backend buffers: device memory that tensors live in.
//!
//! Who may touch a buffer's bytes, and how, is decided by types, not by convention:
//!
//! - [`Buffer`] is the one owner of a ggml buffer (a session keeps it in its map of buffers). It
//!   is not `Clone`; writing to it ([`Buffer::write`], [`Buffer::memset`], [`Buffer::clear`],
//!   [`Buffer::host_mut`]) takes `&mut Buffer`, so safe code cannot hold two writable views of
//!   one buffer at once, nor a writable and a readable one.
//! - [`BufferRef`] is what tensors and graphs hold ([`TensorSpec`](super::TensorSpec),
//!   [`Graph`](super::Graph)): it keeps the memory alive (a graph's buffer is never freed under
//!   it) and names it for ggml, but can only *read* the bytes, never hand out a writable view.
//! - ggml itself writes buffer memory through raw pointers when a graph is computed (and in a
//!   few other calls: copies, `init_tensor`). Every such call, and every view of the bytes
//!   handed to Rust code ([`HostMut`], [`HostRef`]), holds the buffer's access flag: exclusively
//!   for writes and for every call into ggml, shared for reads of host memory. A graph computed
//!   while a view of one of its buffers is alive is refused ([`Access::Busy`]), so no Rust slice
//!   ever sees its bytes change under it. The flag is only ever *tried* (never waited on): a
//!   session runs one command at a time and never finds it taken.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::sys;

/// Why a buffer's bytes could not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The region is not inside the buffer.
    OutOfBounds,
    /// Something else holds the buffer's access flag (a view, or a computation of ggml).
    Busy,
}

/// The ggml buffer shared by its [`Buffer`] and the [`BufferRef`]s made from it; freed when the
/// last of them goes.
struct Memory {
    raw: sys::ggml_backend_buffer_t,
    base: usize,
    size: usize,
    is_host: bool,
    /// 0: free; [`EXCLUSIVE`]: one holder that may write (or call into ggml); n: n readers.
    flag: AtomicUsize,
}

const EXCLUSIVE: usize = usize::MAX;

// SAFETY: a ggml backend buffer is not tied to the thread that made it: any thread may use and
// free it (ggml's backends set their device context in each buffer call). `Memory` hands its raw
// handle only to the ggml layer, which calls into ggml on it only while holding the exclusive
// flag (see Sync).
unsafe impl Send for Memory {}
// SAFETY: through `&Memory` one reads the immutable fields and takes or gives back `flag`, an
// atomic. The bytes are read only under the flag (shared), and written, or passed to any ggml
// call that may touch them, only under the flag held exclusively; so two threads sharing a
// `Memory` never access its bytes in conflicting ways.
unsafe impl Sync for Memory {}

impl Memory {
    fn try_exclusive(&self) -> Result<Exclusive<'_>, Access> {
        self.flag
            .compare_exchange(0, EXCLUSIVE, Ordering::Acquire, Ordering::Relaxed)
            .map(|_| Exclusive(self))
            .map_err(|_| Access::Busy)
    }

    fn try_shared(&self) -> Result<Shared<'_>, Access> {
        let mut cur = self.flag.load(Ordering::Relaxed);
        loop {
            if cur >= EXCLUSIVE - 1 {
                return Err(Access::Busy);
            }
            match self.flag.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Shared(self)),
                Err(now) => cur = now,
            }
        }
    }

    /// `[offset, offset+len)` as an offset into the buffer, when it lies inside it.
    fn check(&self, offset: u64, len: usize) -> Result<usize, Access> {
        let off = usize::try_from(offset).map_err(|_| Access::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(Access::OutOfBounds)?;
        if end <= self.size {
            Ok(off)
        } else {
            Err(Access::OutOfBounds)
        }
    }

    /// Whether the bytes are CPU-addressable through `base`.
    fn host(&self) -> bool {
        self.is_host && self.base != 0
    }

    /// Copies `[offset, offset+out.len())` into `out`, under the flag.
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Access> {
        if self.host() {
            let view = HostRef::new(self, offset, out.len())?;
            out.copy_from_slice(&view);
            return Ok(());
        }
        let off = self.check(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let _held = self.try_exclusive()?;
        let len = out.len();
        super::context::with_byte_tensor(self.raw, self.base, off, len, |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer,
            // whose flag we hold exclusively; out is a live, writable slice of len bytes.
            unsafe { sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, len) }
        })
        .ok_or(Access::OutOfBounds)
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: raw came from ggml_backend_buft_alloc_buffer and is freed exactly once, when
        // the last owner (Buffer or BufferRef) goes; nothing can use it afterwards.
        unsafe { sys::ggml_backend_buffer_free(self.raw) };
    }
}

/// The flag of a [`Memory`] held exclusively; given back on drop.
pub(crate) struct Exclusive<'a>(&'a Memory);

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.0.flag.store(0, Ordering::Release);
    }
}

/// The flag of a [`Memory`] held by one of its readers; given back on drop.
struct Shared<'a>(&'a Memory);

impl Drop for Shared<'_> {
    fn drop(&mut self) {
        self.0.flag.fetch_sub(1, Ordering::Release);
    }
}

/// A writable view of host memory of a [`Buffer`], from [`Buffer::host_mut`]. While it lives
/// the buffer cannot be used otherwise: not through the `Buffer` (borrowed mutably), not by a
/// graph computation (refused, [`Access::Busy`]).
pub struct HostMut<'a> {
    bytes: &'a mut [u8],
    _held: Exclusive<'a>,
}

impl std::ops::Deref for HostMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl std::ops::DerefMut for HostMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

/// A read-only view of host memory of a buffer, from [`Buffer::host`] or [`BufferRef::host`].
/// While it lives nothing writes the buffer: writes need `&mut Buffer` (or, for a
/// [`BufferRef`]'s view, the flag it holds), and a graph computation is refused.
pub struct HostRef<'a> {
    bytes: &'a [u8],
    _held: Shared<'a>,
}

impl<'a> HostRef<'a> {
    fn new(mem: &'a Memory, offset: u64, len: usize) -> Result<HostRef<'a>, Access> {
        debug_assert!(mem.host());
        let off = mem.check(offset, len)?;
        let held = mem.try_shared()?;
        // SAFETY: the region lies inside the live host allocation (checked above; base is
        // non-null), and the shared flag we hold until this view is dropped keeps every writer
        // (Rust or ggml) out.
        let bytes = unsafe { std::slice::from_raw_parts((mem.base + off) as *const u8, len) };
        Ok(HostRef { bytes, _held: held })
    }
}

impl std::ops::Deref for HostRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

/// An owned ggml backend buffer, freed when it and every [`BufferRef`] made from it are gone.
///
/// Writable access takes `&mut self`, so two writable views of one buffer cannot coexist (the
/// crate-private type cannot be named by a doctest; this is what rustc answers):
///
/// ```text
/// let a = buffer.host_mut(0, 4).unwrap();
/// let c = buffer.host_mut(2, 4).unwrap(); // error[E0499]: cannot borrow `buffer` as mutable
/// drop((a, c));                           // more than once at a time
/// ```
pub struct Buffer {
    mem: Arc<Memory>,
}

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
            advise_huge_pages(base, size);
        }
        Some(Buffer {
            mem: Arc::new(Memory {
                raw,
                base,
                size,
                is_host,
                flag: AtomicUsize::new(0),
            }),
        })
    }

    /// A handle for tensors and graphs: keeps the memory alive, cannot write it.
    pub fn share(&self) -> BufferRef {
        BufferRef {
            mem: self.mem.clone(),
        }
    }

    /// Whether `r` names this buffer.
    pub fn is(&self, r: &BufferRef) -> bool {
        Arc::ptr_eq(&self.mem, &r.mem)
    }

    /// Usable size in bytes.
    pub fn size(&self) -> u64 {
        self.mem.size as u64
    }

    /// Whether the bytes are host memory (reachable through [`Buffer::host_mut`]).
    pub fn is_host(&self) -> bool {
        self.mem.host()
    }

    /// Host memory `[offset, offset+len)` for writing; `None` when the buffer is not host
    /// memory, the region is not inside it, or a graph still holds it.
    pub fn host_mut(&mut self, offset: u64, len: usize) -> Option<HostMut<'_>> {
        let mem = &*self.mem;
        if !mem.host() {
            return None;
        }
        let off = mem.check(offset, len).ok()?;
        let held = mem.try_exclusive().ok()?;
        // SAFETY: the region lies inside the live host allocation (checked above; base is
        // non-null). No other view of it exists: `&mut self` excludes this owner's other views,
        // and the exclusive flag, held until the view is dropped, excludes every BufferRef's
        // reads and every ggml call on the buffer (graph computations, copies).
        let bytes = unsafe { std::slice::from_raw_parts_mut((mem.base + off) as *mut u8, len) };
        Some(HostMut { bytes, _held: held })
    }

    /// Host memory `[offset, offset+len)` for reading; `None` when the buffer is not host
    /// memory, the region is not inside it, or a graph computation holds it.
    pub fn host(&self, offset: u64, len: usize) -> Option<HostRef<'_>> {
        if !self.mem.host() {
            return None;
        }
        HostRef::new(&self.mem, offset, len).ok()
    }

    /// Fills the whole buffer with `value`.
    pub fn clear(&mut self, value: u8) -> Result<(), Access> {
        let _held = self.mem.try_exclusive()?;
        // SAFETY: live buffer whose flag we hold exclusively: nothing else reads or writes it.
        unsafe { sys::ggml_backend_buffer_clear(self.mem.raw, value) };
        Ok(())
    }

    /// Copies `data` to `[offset, offset+data.len())`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Access> {
        if let Some(mut dst) = self.host_mut(offset, data.len()) {
            dst.copy_from_slice(data);
            return Ok(());
        }
        let mem = &*self.mem;
        let off = mem.check(offset, data.len())?;
        let _held = mem.try_exclusive()?;
        if data.is_empty() {
            return Ok(());
        }
        super::context::with_byte_tensor(mem.raw, mem.base, off, data.len(), |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer,
            // whose flag we hold exclusively; data is a live slice of data.len() bytes.
            unsafe { sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, data.len()) }
        })
        .ok_or(Access::OutOfBounds)
    }

    /// Copies `[offset, offset+out.len())` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Access> {
        self.mem.read(offset, out)
    }

    /// Fills `[offset, offset+len)` with `value`.
    pub fn memset(&mut self, offset: u64, len: u64, value: u8) -> Result<(), Access> {
        let len = usize::try_from(len).map_err(|_| Access::OutOfBounds)?;
        if let Some(mut dst) = self.host_mut(offset, len) {
            dst.fill(value);
            return Ok(());
        }
        let mem = &*self.mem;
        let off = mem.check(offset, len)?;
        let _held = mem.try_exclusive()?;
        if len == 0 {
            return Ok(());
        }
        super::context::with_byte_tensor(mem.raw, mem.base, off, len, |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer,
            // whose flag we hold exclusively.
            unsafe { sys::ggml_backend_tensor_memset(t, value, 0, len) }
        })
        .ok_or(Access::OutOfBounds)
    }
}

/// A buffer as tensors and graphs hold it: keeps its memory alive and names it for ggml; its
/// bytes can be read (under the buffer's flag), never written through it.
#[derive(Clone)]
pub struct BufferRef {
    mem: Arc<Memory>,
}

impl PartialEq for BufferRef {
    /// The same buffer.
    fn eq(&self, other: &BufferRef) -> bool {
        Arc::ptr_eq(&self.mem, &other.mem)
    }
}

impl Eq for BufferRef {}

impl BufferRef {
    /// Usable size in bytes.
    pub fn size(&self) -> u64 {
        self.mem.size as u64
    }

    /// Host memory `[offset, offset+len)` for reading; `None` when the buffer is not host
    /// memory, the region is not inside it, or its owner or a graph holds it for writing.
    pub fn host(&self, offset: u64, len: usize) -> Option<HostRef<'_>> {
        if !self.mem.host() {
            return None;
        }
        HostRef::new(&self.mem, offset, len).ok()
    }

    /// Copies `[offset, offset+out.len())` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Access> {
        self.mem.read(offset, out)
    }

    /// For the ggml layer: the raw handle and the real base address, to point tensors into the
    /// buffer. ggml may only be given them for a call made under [`BufferRef::lock`].
    pub(super) fn raw_parts(&self) -> (sys::ggml_backend_buffer_t, usize) {
        (self.mem.raw, self.mem.base)
    }

    /// An identity for de-duplicating (stable while this handle lives).
    pub(super) fn key(&self) -> usize {
        Arc::as_ptr(&self.mem) as usize
    }
}

/// The flags of a set of distinct buffers, all held exclusively: what every ggml call that may
/// touch their bytes (a graph computation, a copy, `init_tensor`) runs under.
pub(crate) struct Locked<'a> {
    _held: Vec<Exclusive<'a>>,
}

impl Locked<'_> {
    /// Copies `[offset, offset+out.len())` of `buf`, one of the locked buffers, into `out`:
    /// what the checks on a graph's index tensors read under the flags its computation then
    /// runs under, so that nothing writes the values between their check and their use.
    /// [`Access::Busy`] when `buf` is not one of the locked buffers.
    pub(crate) fn read(&self, buf: &BufferRef, offset: u64, out: &mut [u8]) -> Result<(), Access> {
        let mem = &*buf.mem;
        if !self._held.iter().any(|e| std::ptr::eq(e.0, mem)) {
            return Err(Access::Busy);
        }
        let off = mem.check(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let len = out.len();
        if mem.host() {
            // SAFETY: the region lies inside the live host allocation (checked above; base is
            // non-null), and we hold the buffer's flag exclusively: no view of it and no ggml
            // call on it exists while we read.
            let bytes = unsafe { std::slice::from_raw_parts((mem.base + off) as *const u8, len) };
            out.copy_from_slice(bytes);
            return Ok(());
        }
        super::context::with_byte_tensor(mem.raw, mem.base, off, len, |t| {
            // SAFETY: t is a byte tensor exactly covering the checked region of this buffer,
            // whose flag we hold exclusively; out is a live, writable slice of len bytes.
            unsafe { sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, len) }
        })
        .ok_or(Access::OutOfBounds)
    }
}

/// Takes the flag of every buffer in `buffers` (distinct, as [`dedup`] leaves them)
/// exclusively, or none of them ([`Access::Busy`]) when one is held.
pub(crate) fn lock(buffers: &[BufferRef]) -> Result<Locked<'_>, Access> {
    let mut held = Vec::with_capacity(buffers.len());
    for b in buffers {
        held.push(b.mem.try_exclusive()?);
    }
    Ok(Locked { _held: held })
}

/// `buffers` with each buffer once.
pub(crate) fn dedup(buffers: impl IntoIterator<Item = BufferRef>) -> Vec<BufferRef> {
    let mut seen = std::collections::HashSet::new();
    buffers
        .into_iter()
        .filter(|b| seen.insert(b.key()))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer of the CPU's buffer type (host memory), without the device layer above this one.
    fn host_buffer(size: usize) -> Buffer {
        // SAFETY: the CPU buffer type is a static object; NULL is handled by from_raw.
        let raw = unsafe {
            sys::ggml_backend_buft_alloc_buffer(sys::ggml_backend_cpu_buffer_type(), size)
        };
        let b = Buffer::from_raw(raw).expect("allocation");
        assert!(b.mem.host(), "the CPU buffer is host memory");
        b
    }

    /// The buffer types the server moves between threads and across `.await`s.
    #[test]
    fn the_handles_and_views_cross_threads() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<Buffer>();
        send::<BufferRef>();
        sync::<BufferRef>();
        send::<HostMut<'static>>();
        send::<HostRef<'static>>();
    }

    #[test]
    fn writes_reads_and_bounds() {
        let mut b = host_buffer(64);
        b.write(8, &[1, 2, 3, 4]).unwrap();
        b.memset(12, 4, 9).unwrap();
        let mut out = [0u8; 8];
        b.read(8, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 9, 9, 9, 9]);
        assert_eq!(&b.host(8, 8).unwrap()[..], &out);
        b.host_mut(0, 2).unwrap().copy_from_slice(&[7, 7]);
        let r = b.share();
        r.read(0, &mut out[..2]).unwrap();
        assert_eq!(out[..2], [7, 7]);
        // Regions that do not fit.
        assert_eq!(b.write(62, &[0; 4]), Err(Access::OutOfBounds));
        assert_eq!(b.memset(u64::MAX, 1, 0), Err(Access::OutOfBounds));
        assert_eq!(r.read(61, &mut [0; 4]), Err(Access::OutOfBounds));
        assert!(b.host_mut(60, 5).is_none());
        assert!(r.host(u64::MAX, 1).is_none());
        b.clear(0).unwrap();
        assert!(r.host(0, 64).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn a_writable_view_excludes_every_other_access() {
        let mut b = host_buffer(64);
        let r = b.share();
        let mut view = b.host_mut(0, 16).unwrap();
        view.fill(5);
        // Through a BufferRef (what graphs hold): no read, no lock for a computation.
        assert!(r.host(32, 4).is_none());
        assert_eq!(r.read(32, &mut [0; 4]), Err(Access::Busy));
        assert!(lock(std::slice::from_ref(&r)).is_err());
        drop(view);
        assert_eq!(&r.host(0, 2).unwrap()[..], &[5, 5]);
        assert!(lock(std::slice::from_ref(&r)).is_ok());
    }

    #[test]
    fn read_views_share_and_exclude_writers() {
        let mut b = host_buffer(64);
        let r = b.share();
        {
            let v1 = r.host(0, 8).unwrap();
            let v2 = r.host(4, 8).unwrap();
            assert_eq!(v1[4..], v2[..4]);
            assert!(lock(std::slice::from_ref(&r)).is_err());
        }
        // The flag is free again once the views are gone.
        b.write(0, &[1]).unwrap();
        let held = lock(std::slice::from_ref(&r)).unwrap();
        assert_eq!(b.write(0, &[2]), Err(Access::Busy));
        assert!(b.host(0, 1).is_none());
        assert_eq!(b.clear(0), Err(Access::Busy));
        drop(held);
        b.write(0, &[2]).unwrap();
    }

    #[test]
    fn the_memory_outlives_its_owner_while_a_graph_holds_it() {
        let mut b = host_buffer(32);
        b.write(0, &[42]).unwrap();
        let r = b.share();
        let r2 = r.clone();
        assert!(b.is(&r) && r == r2);
        assert!(!host_buffer(32).is(&r));
        drop(b);
        let mut out = [0u8];
        r2.read(0, &mut out).unwrap();
        assert_eq!(out, [42]);
        assert_eq!(dedup([r, r2]).len(), 1);
    }
}
