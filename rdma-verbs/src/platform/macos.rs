//! macOS / SDK librdma (RDMA over Thunderbolt, macOS >= 26.2).  Untested on
//! hardware; follows rdma-transports.md §4-§5.
use crate::types::GidType;

pub(crate) const DEFAULT_LIBRARY: &str = "/usr/lib/librdma.dylib";

/// No sysfs; Thunderbolt GIDs carry no RoCE type.
pub(crate) fn sysfs_gid_type(_dev: &str, _port: u8, _index: u32) -> Option<GidType> {
    None
}
