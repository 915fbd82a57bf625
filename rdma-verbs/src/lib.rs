//! `rdma-verbs`: a small, run-time-loaded binding to RDMA verbs
//! (rdma-core `libibverbs` on Linux, `librdma` on macOS ≥ 26.2).
//!
//! Layers (modelled on rust-ibverbs' sys/safe split):
//! * `csrc/shim.c` — C compiled against the platform's own
//!   `<infiniband/verbs.h>`; `dlopen`s the library and `dlsym`s the exported
//!   entry points; the static-inline verbs (`ibv_post_send`, `ibv_post_recv`,
//!   `ibv_poll_cq`, `ibv_req_notify_cq`) work through `ctx->ops`.  When the
//!   header is missing at build time a stub is compiled instead.
//! * [`sys`] (private) — hand-written `extern "C"` declarations of the shim.
//! * the safe API below.  All `unsafe` of the project's RDMA code lives in
//!   this crate.
//!
//! Nothing links against libibverbs: a binary built with this crate runs on a
//! machine without rdma-core or without any RDMA device; [`available`] is
//! then false and every constructor returns [`VerbsError::LibraryMissing`]
//! (or [`VerbsError::NoSuchDevice`]), never panics.
//!
//! Object graph and drop order: every object holds an `Arc` to its parents
//! (`Qp` → `Pd`, send/recv `Cq`; `Mr` → `Pd`; `Cq` → `Context`, `CompChannel`;
//! `Pd` → `Context`), so parents are destroyed after their children whatever
//! order the caller drops things in.  The one order that matters beyond that
//! is **`Qp` before the `Mr`s it posts into or from** (Apple: "destroy the QP
//! first", llama.cpp PR #27908; everywhere: a region must stay registered
//! while a work request on it is outstanding).  [`OwnedQp`] owns a QP with
//! its send and receive regions and keeps that order by construction, so its
//! posting is safe; posting from borrowed regions ([`Qp::post_send`],
//! [`Qp::post_recv`]) is `unsafe` and leaves the order to the caller.  The
//! crate never moves a QP to ERR by itself.
//!
//! ```no_run
//! use rdma_verbs::*;
//! # fn main() -> Result<()> {
//! if !rdma_verbs::available() { return Ok(()); }          // TCP fallback
//! let m = find_gid_for_ip("10.77.0.1".parse().unwrap())?.expect("no device");
//! let ctx = Context::open(&m.device)?;
//! let pd = Pd::new(&ctx)?;
//! let cq = Cq::new(&ctx, 32, None)?;
//! let qp = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &cq, &cq, 4, 28))?;
//! let tx = Mr::new(&pd, AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE)?;
//! let rx = Mr::new(&pd, AlignedBuf::new(256 << 10)?, AccessFlags::LOCAL_WRITE)?;
//! let ep = OwnedQp::new(qp, tx, rx)?;
//! ep.qp().modify_to_init(&InitAttr { port: m.port, pkey_index: 0,
//!     access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ })?;
//! ep.post_recv(0, 0, 4096)?;
//! // ... exchange ep.qp().qp_num(), psn and m.gid with the peer, then
//! // ep.qp().modify_to_rtr(&RtrAttr::rc(...))?; ep.qp().modify_to_rts(&RtsAttr::rc(psn))?;
//! # Ok(()) }
//! ```

// The FFI layer: `unsafe` is its job; every block states why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

mod context;
mod cq;
mod error;
mod mr;
mod owned;
mod platform;
mod qp;
mod sys;
mod types;

use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

pub use context::{
    devices, find_gid_for_ip, find_gid_with, Context, DeviceInfo, GidEntry, GidMatch, GidSearch,
    Pd, PortChoice, PortInfo,
};
#[cfg(all(feature = "tokio", unix))]
pub use cq::AsyncCompChannel;
pub use cq::{CompChannel, Cq, CqEvent, WorkCompletion};
pub use error::{Result, VerbsError};
pub use mr::{AlignedBuf, Mr};
pub use owned::OwnedQp;
pub use qp::{AddressVector, InitAttr, Qp, QpCaps, QpInitAttr, RtrAttr, RtsAttr};
pub use types::{
    AccessFlags, Gid, GidType, LinkLayer, Mtu, PortState, QpState, QpType, SendFlags, WcOpcode,
    WcStatus,
};

/// Environment variable that overrides the library path passed to `dlopen`.
pub const LIBRARY_ENV: &str = "RDMA_VERBS_LIBRARY";

/// Environment variable that selects the [`SymbolSet`] on Linux: `apple` loads only Apple's.
pub const SYMBOLS_ENV: &str = "RDMA_VERBS_SYMBOLS";

/// Which verbs entry points [`load`] resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolSet {
    /// Every entry point this crate can use; those beyond [`SymbolSet::Apple`]'s are optional
    /// (completion channel, `ibv_query_qp`, the GID-entry API).
    Full,
    /// Only the 17 that upstream's Apple transport (`transport-apple.cpp`) calls: what a macOS
    /// `librdma.dylib` is known to have. Always on macOS; on Linux with
    /// `RDMA_VERBS_SYMBOLS=apple`, to run the Apple code path against a Linux provider (the
    /// soft-RoCE VM suite does). Without a completion channel, idle connections poll.
    Apple,
}

impl SymbolSet {
    /// The 17 entry points of [`SymbolSet::Apple`] (`ibv_post_send`, `ibv_post_recv` and
    /// `ibv_poll_cq` are inline in the header and need none).
    pub const APPLE: [&'static str; 17] = [
        "ibv_get_device_list",
        "ibv_free_device_list",
        "ibv_get_device_name",
        "ibv_open_device",
        "ibv_close_device",
        "ibv_query_device",
        "ibv_query_port",
        "ibv_query_gid",
        "ibv_alloc_pd",
        "ibv_dealloc_pd",
        "ibv_create_cq",
        "ibv_destroy_cq",
        "ibv_reg_mr",
        "ibv_dereg_mr",
        "ibv_create_qp",
        "ibv_modify_qp",
        "ibv_destroy_qp",
    ];
}

/// The symbol set of this process: [`SymbolSet::Apple`] on macOS or with
/// `RDMA_VERBS_SYMBOLS=apple`, else [`SymbolSet::Full`].
pub fn symbol_set() -> SymbolSet {
    let apple_env = std::env::var(SYMBOLS_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("apple"));
    if cfg!(target_os = "macos") || apple_env {
        SymbolSet::Apple
    } else {
        SymbolSet::Full
    }
}

/// How many entry points the loaded library provided (0 before [`load`] succeeded).
pub fn symbols_loaded() -> usize {
    // SAFETY: reads a counter of the shim, no arguments.
    usize::try_from(unsafe { sys::rv_symbols_loaded() }).unwrap_or(0)
}

static LOADED: OnceLock<Result<(), String>> = OnceLock::new();

/// Loads the verbs library once per process (thread-safe); later calls return
/// the cached outcome.  Library: `$RDMA_VERBS_LIBRARY` if set, else
/// `libibverbs.so.1` (Linux) / `/usr/lib/librdma.dylib` (macOS).
pub fn load() -> Result<()> {
    LOADED
        .get_or_init(|| {
            let path = std::env::var_os(LIBRARY_ENV)
                .filter(|p| !p.is_empty())
                .map(|p| {
                    CString::new(p.into_encoded_bytes())
                        .map_err(|_| "library path contains NUL".to_string())
                })
                .transpose()?;
            let mut err = [0 as c_char; 512];
            let p = path.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
            let apple = std::ffi::c_int::from(symbol_set() == SymbolSet::Apple);
            // SAFETY: `p` is NULL or a NUL-terminated string alive for the
            // call; `err` is a writable buffer of the stated length.  The
            // OnceLock guarantees rv_load runs at most once at a time.
            let rc = unsafe { sys::rv_load(p, apple, err.as_mut_ptr(), err.len()) };
            if rc == 0 {
                Ok(())
            } else {
                // SAFETY: the shim always NUL-terminates `err` within its length
                // (snprintf), and it was zero-initialised.
                let msg = unsafe { CStr::from_ptr(err.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                Err(if msg.is_empty() {
                    "dlopen failed".to_string()
                } else {
                    msg
                })
            }
        })
        .clone()
        .map_err(VerbsError::LibraryMissing)
}

/// True when the verbs library could be loaded (devices may still be absent).
pub fn available() -> bool {
    load().is_ok()
}

/// True when the crate was compiled against real verbs headers (false: stub).
pub fn built_with_verbs() -> bool {
    // SAFETY: pure function of the shim, no arguments.
    unsafe { sys::rv_built_with_verbs() != 0 }
}

/// True when the loaded library exports the GID-entry API
/// (`_ibv_query_gid_ex`, rdma-core ≥ v32), i.e. GID types come from verbs,
/// not from the sysfs fallback.
pub fn has_gid_ex() -> bool {
    // SAFETY: reads a flag of the shim, no arguments.
    load().is_ok() && unsafe { sys::rv_has_gid_ex() != 0 }
}

/// The OS page size (alignment used by [`AlignedBuf`]).
pub fn page_size() -> usize {
    // SAFETY: sysconf wrapper without arguments.
    let p = unsafe { sys::rv_page_size() };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The library `load` tries when `RDMA_VERBS_LIBRARY` is unset
/// (`libibverbs.so.1` on Linux, `/usr/lib/librdma.dylib` on macOS, "" elsewhere).
pub fn default_library() -> &'static str {
    platform::DEFAULT_LIBRARY
}

pub(crate) fn ensure_loaded() -> Result<()> {
    load()
}

#[cfg(test)]
mod tests;
