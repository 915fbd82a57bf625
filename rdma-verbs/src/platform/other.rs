//! Platforms without verbs support: the stub shim is compiled.
use crate::types::GidType;

pub(crate) const DEFAULT_LIBRARY: &str = "";

pub(crate) fn sysfs_gid_type(_dev: &str, _port: u8, _index: u32) -> Option<GidType> {
    None
}
