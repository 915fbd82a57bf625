//! Completion channels, completion queues and work completions.
use std::ffi::{c_int, c_void};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::error::{check, Result, VerbsError};
use crate::sys;
use crate::types::{WcOpcode, WcStatus};

pub(crate) struct ChannelInner {
    ptr: *mut c_void,
    fd: RawFd,
    _ctx: Context,
    /// CQs attached to this channel, to map an event back to its `Cq`.
    cqs: Mutex<Vec<(usize, Weak<CqInner>)>>,
}

// SAFETY: ibv_comp_channel is a kernel fd plus a context pointer; the library
// calls on it are thread-safe.  The raw pointer is never exposed.
unsafe impl Send for ChannelInner {}
// SAFETY: see Send; the CQ registry is behind a Mutex.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_create_comp_channel; every CQ on it holds
        // an Arc to this channel, so none is alive.
        let _ = unsafe { sys::rv_destroy_comp_channel(self.ptr) };
    }
}

/// Completion event channel.  Its fd is non-blocking and becomes readable
/// when an armed CQ ([`Cq::req_notify`]) gets a completion; use [`fd`]
/// with poll/epoll/`AsyncFd` (together with a liveness fd, like upstream's
/// TCP socket), or [`CompChannel::wait`].
///
/// [`fd`]: CompChannel::fd
#[derive(Clone)]
pub struct CompChannel(Arc<ChannelInner>);

impl CompChannel {
    pub fn new(ctx: &Context) -> Result<CompChannel> {
        let mut ch = ptr::null_mut();
        let mut fd: c_int = -1;
        // SAFETY: ctx valid; out-pointers valid.
        check("ibv_create_comp_channel", unsafe {
            sys::rv_create_comp_channel(ctx.0.ptr, &mut ch, &mut fd)
        })?;
        Ok(CompChannel(Arc::new(ChannelInner {
            ptr: ch,
            fd,
            _ctx: ctx.clone(),
            cqs: Mutex::new(Vec::new()),
        })))
    }

    /// The event fd (owned by the channel; do not close it).
    pub fn fd(&self) -> RawFd {
        self.0.fd
    }

    /// Reads one pending CQ event without blocking.  The event must be
    /// acknowledged (dropping it does); re-arm the CQ with `req_notify`.
    pub fn try_get_event(&self) -> Result<Option<CqEvent>> {
        let mut cq = ptr::null_mut();
        let mut cq_ctx = ptr::null_mut();
        // SAFETY: channel valid; out-pointers valid.  The fd is non-blocking,
        // so this cannot hang.
        let rc = unsafe { sys::rv_get_cq_event(self.0.ptr, &mut cq, &mut cq_ctx) };
        if rc > 0 && std::io::Error::from_raw_os_error(rc).kind() == std::io::ErrorKind::WouldBlock
        {
            return Ok(None);
        }
        check("ibv_get_cq_event", rc)?;
        let found = {
            let mut reg = self.0.cqs.lock().unwrap_or_else(|p| p.into_inner());
            reg.retain(|(_, w)| w.strong_count() > 0);
            reg.iter()
                .find(|(p, _)| *p == cq as usize)
                .and_then(|(_, w)| w.upgrade())
        };
        match found {
            Some(inner) => Ok(Some(CqEvent { cq: Some(inner) })),
            None => {
                // The Cq is being dropped: ibv_destroy_cq waits for this ack,
                // so the CQ object is still alive here.
                // SAFETY: cq was just returned by ibv_get_cq_event for a CQ
                // whose destruction cannot complete before this ack.
                unsafe { sys::rv_ack_cq_events(cq, 1) };
                Ok(None)
            }
        }
    }

    /// Waits up to `timeout` (None = forever) for a CQ event.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<CqEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(ev) = self.try_get_event()? {
                return Ok(Some(ev));
            }
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    (d - now).as_millis().clamp(1, i32::MAX as u128) as c_int
                }
            };
            let mut ready = 0;
            // SAFETY: plain poll(2) on our own fd.
            check("poll", unsafe {
                sys::rv_poll_fd(self.0.fd, ms, &mut ready)
            })?;
        }
    }
}

/// A CQ event read from a [`CompChannel`]; acknowledged on drop.
pub struct CqEvent {
    cq: Option<Arc<CqInner>>,
}

impl CqEvent {
    /// True if the event belongs to `cq`.
    pub fn is_for(&self, cq: &Cq) -> bool {
        self.cq.as_ref().is_some_and(|c| Arc::ptr_eq(c, &cq.0))
    }
    /// Acknowledges now (same as dropping).
    pub fn ack(self) {}
}

impl Drop for CqEvent {
    fn drop(&mut self) {
        if let Some(c) = self.cq.take() {
            // SAFETY: c keeps the CQ alive; one event was read for it.
            unsafe { sys::rv_ack_cq_events(c.ptr, 1) };
        }
    }
}

impl std::fmt::Debug for CqEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CqEvent({:p})",
            self.cq
                .as_ref()
                .map_or(ptr::null(), |c| c.ptr as *const c_void)
        )
    }
}

pub(crate) struct CqInner {
    pub(crate) ptr: *mut c_void,
    pub(crate) ctx: Context,
    _channel: Option<CompChannel>,
    cqe: i32,
}

// SAFETY: ibv_cq polling/arming is thread-safe in rdma-core providers (they
// lock); the pointer is never exposed.
unsafe impl Send for CqInner {}
// SAFETY: see Send.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_create_cq; QPs using it hold Arcs, and
        // every read CqEvent (which holds an Arc too) has been acked.
        let _ = unsafe { sys::rv_destroy_cq(self.ptr) };
    }
}

/// Completion queue.  Cheap to clone (shared).
#[derive(Clone)]
pub struct Cq(pub(crate) Arc<CqInner>);

/// Identity: two handles are equal when they refer to the same CQ.
impl PartialEq for Cq {
    fn eq(&self, other: &Cq) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Cq {}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cq({:p}, {} entries)", self.0.ptr, self.0.cqe)
    }
}

impl Cq {
    /// `ibv_create_cq` with at least `depth` entries, optionally on a
    /// completion channel.
    pub fn new(ctx: &Context, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        let cqe =
            c_int::try_from(depth).map_err(|_| VerbsError::InvalidArgument("cq depth".into()))?;
        if cqe < 1 {
            return Err(VerbsError::InvalidArgument("cq depth must be >= 1".into()));
        }
        let chp = channel.map_or(ptr::null_mut(), |c| c.0.ptr);
        let mut cq = ptr::null_mut();
        let mut actual = 0;
        // SAFETY: ctx and channel (if any) valid; out-pointers valid;
        // cq_context unused (NULL).
        check("ibv_create_cq", unsafe {
            sys::rv_create_cq(
                ctx.0.ptr,
                cqe,
                ptr::null_mut(),
                chp,
                0,
                &mut cq,
                &mut actual,
            )
        })?;
        let inner = Arc::new(CqInner {
            ptr: cq,
            ctx: ctx.clone(),
            _channel: channel.cloned(),
            cqe: actual,
        });
        if let Some(ch) = channel {
            let mut reg = ch.0.cqs.lock().unwrap_or_else(|p| p.into_inner());
            reg.retain(|(_, w)| w.strong_count() > 0);
            reg.push((cq as usize, Arc::downgrade(&inner)));
        }
        Ok(Cq(inner))
    }

    /// Entries actually allocated (≥ requested).
    pub fn capacity(&self) -> i32 {
        self.0.cqe
    }

    /// Polls up to `out.len()` completions; returns how many were written.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let max = c_int::try_from(out.len()).unwrap_or(c_int::MAX);
        let mut n = 0;
        // SAFETY: WorkCompletion is #[repr(transparent)] over rv_wc, `out`
        // has room for `max` of them; the CQ is valid.
        check("ibv_poll_cq", unsafe {
            sys::rv_poll_cq(
                self.0.ptr,
                out.as_mut_ptr().cast::<sys::rv_wc>(),
                max,
                &mut n,
            )
        })?;
        Ok(n.max(0) as usize)
    }

    /// Arms the CQ: the next completion raises one event on its channel.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: CQ valid.
        check("ibv_req_notify_cq", unsafe {
            sys::rv_req_notify_cq(self.0.ptr, solicited_only as c_int)
        })
    }

    /// Busy-polls for one completion until `timeout` (None: forever).
    /// Convenience for tests and simple stop-and-wait loops.
    pub fn poll_one_blocking(&self, timeout: Option<Duration>) -> Result<WorkCompletion> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut wc = [WorkCompletion::default()];
        let mut spins = 0u32;
        loop {
            if self.poll(&mut wc)? == 1 {
                return Ok(wc[0]);
            }
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(VerbsError::Timeout);
                }
                std::thread::yield_now();
            }
        }
    }

    pub fn context(&self) -> &Context {
        &self.0.ctx
    }
}

/// One work completion (flattened `ibv_wc`).
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion(sys::rv_wc);

impl WorkCompletion {
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    pub fn status(&self) -> WcStatus {
        WcStatus(self.0.status)
    }
    pub fn is_success(&self) -> bool {
        self.0.status == 0
    }
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }
    /// Bytes received (receive completions only).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    pub fn wc_flags(&self) -> u32 {
        self.0.wc_flags
    }
    pub fn imm_data(&self) -> u32 {
        self.0.imm_data
    }
    /// `Ok(self)` on success, else an error naming status and vendor error.
    pub fn ok(self) -> std::result::Result<WorkCompletion, String> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(format!(
                "wc error: wr_id={} status={} vendor_err=0x{:x}",
                self.wr_id(),
                self.status(),
                self.vendor_err()
            ))
        }
    }
}

impl std::fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("vendor_err", &self.vendor_err())
            .finish()
    }
}

/// A [`CompChannel`] registered with the tokio runtime: `wait` sleeps until the channel has a
/// completion event (for a CQ armed with [`Cq::req_notify`]) and consumes the pending events.
#[cfg(all(feature = "tokio", unix))]
pub struct AsyncCompChannel(tokio::io::unix::AsyncFd<ChannelFd>);

/// Keeps the channel (and so its fd) alive for as long as the registration.
#[cfg(all(feature = "tokio", unix))]
struct ChannelFd(CompChannel);

#[cfg(all(feature = "tokio", unix))]
impl std::os::fd::AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

#[cfg(all(feature = "tokio", unix))]
impl AsyncCompChannel {
    /// Registers the channel's fd for readability. Must be called on a tokio runtime.
    pub fn new(ch: &CompChannel) -> std::io::Result<AsyncCompChannel> {
        // SAFETY: the fd belongs to the channel and is closed only when the last clone of the
        // channel is dropped (ibv_destroy_comp_channel); `ChannelFd` holds a clone for the whole
        // life of the registration and always returns that same fd.
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(
                ChannelFd(ch.clone()),
                tokio::io::Interest::READABLE,
            )
        };
        fd.map(AsyncCompChannel).map_err(std::io::Error::from)
    }

    /// Waits until the channel is readable, then consumes (acknowledges) its pending events.
    pub async fn wait(&self) -> std::io::Result<()> {
        let mut guard = self.0.readable().await?;
        while self
            .0
            .get_ref()
            .0
            .try_get_event()
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .is_some()
        {}
        guard.clear_ready();
        Ok(())
    }
}
