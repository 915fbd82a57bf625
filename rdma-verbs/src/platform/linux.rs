//! Linux / rdma-core.
use crate::types::GidType;

/// Library `dlopen`ed when `RDMA_VERBS_LIBRARY` is not set (informational;
/// the shim holds the actual list).
pub(crate) const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

/// GID type from sysfs, for libraries without `_ibv_query_gid_ex`
/// (rdma-core < v32): `/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>`
/// holds "RoCE v2" or "IB/RoCE v1".
pub(crate) fn sysfs_gid_type(dev: &str, port: u8, index: u32) -> Option<GidType> {
    let p = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{index}");
    let s = std::fs::read_to_string(p).ok()?;
    Some(parse_sysfs_gid_type(&s))
}

pub(crate) fn parse_sysfs_gid_type(s: &str) -> GidType {
    let t = s.trim();
    if t.eq_ignore_ascii_case("RoCE v2") {
        GidType::RoceV2
    } else if t.eq_ignore_ascii_case("IB/RoCE v1") || t.eq_ignore_ascii_case("RoCE v1") {
        GidType::RoceV1
    } else if t.eq_ignore_ascii_case("IB") {
        GidType::Ib
    } else {
        GidType::Unknown
    }
}
