//! Errors of the verbs layer: one type for a missing library, a missing device, a failed verb
//! (errno) and a bad argument, so that no function of the crate panics.

use std::fmt;

/// Everything that can go wrong in this crate.  No function of the crate
/// panics on a missing library, missing device or failed verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerbsError {
    /// The verbs library could not be loaded (not installed, wrong OS
    /// version, or the crate was built without `infiniband/verbs.h`).
    LibraryMissing(String),
    /// No RDMA device with that name (or no device at all).
    NoSuchDevice(String),
    /// A verbs call failed with an errno value.
    Os { op: &'static str, errno: i32 },
    /// The library lacks an optional entry point needed for this call.
    Unsupported(&'static str),
    /// Bad argument detected before calling into the library
    /// (out-of-range offset, MR of another PD, oversize inline send, ...).
    InvalidArgument(String),
    /// A wait gave up.
    Timeout,
}

pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

impl VerbsError {
    /// True for the "no RDMA here at all" case (library absent / stub build).
    pub fn is_library_missing(&self) -> bool {
        matches!(self, VerbsError::LibraryMissing(_))
    }

    /// errno of an `Os` error.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Os { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::LibraryMissing(d) => write!(f, "RDMA verbs library unavailable: {d}"),
            VerbsError::NoSuchDevice(n) => write!(f, "no RDMA device {n:?}"),
            VerbsError::Os { op, errno } => {
                write!(
                    f,
                    "{op} failed: {} (errno {errno})",
                    std::io::Error::from_raw_os_error(*errno)
                )
            }
            VerbsError::Unsupported(what) => {
                write!(f, "not supported by this verbs library: {what}")
            }
            VerbsError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            VerbsError::Timeout => write!(f, "timed out"),
        }
    }
}

impl std::error::Error for VerbsError {}

impl From<VerbsError> for std::io::Error {
    fn from(e: VerbsError) -> Self {
        let kind = match &e {
            VerbsError::LibraryMissing(_) | VerbsError::Unsupported(_) => {
                std::io::ErrorKind::Unsupported
            }
            VerbsError::NoSuchDevice(_) => std::io::ErrorKind::NotFound,
            VerbsError::InvalidArgument(_) => std::io::ErrorKind::InvalidInput,
            VerbsError::Timeout => std::io::ErrorKind::TimedOut,
            VerbsError::Os { errno, .. } => std::io::Error::from_raw_os_error(*errno).kind(),
        };
        std::io::Error::new(kind, e)
    }
}

/// Maps a shim status code to a `Result`.
pub(crate) fn check(op: &'static str, rc: std::ffi::c_int) -> Result<()> {
    use crate::sys::*;
    match rc {
        0 => Ok(()),
        RV_ERR_NOLIB => Err(VerbsError::LibraryMissing("library not loaded".into())),
        RV_ERR_UNSUPPORTED => Err(VerbsError::LibraryMissing(
            "built without infiniband/verbs.h".into(),
        )),
        RV_ERR_NOSYM => Err(VerbsError::Unsupported(op)),
        RV_ERR_NULL => Err(VerbsError::Os {
            op,
            errno: 5, /* EIO: NULL without errno */
        }),
        e if e > 0 => Err(VerbsError::Os { op, errno: e }),
        e => Err(VerbsError::Os { op, errno: -e }),
    }
}
