//! Plain value types shared by the safe API.
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::ops::{BitOr, BitOrAssign};

use crate::sys;

/// A 16-byte GID (for RoCE / Thunderbolt: an IPv6 address, IPv4 addresses
/// mapped as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID a RoCE / Thunderbolt device publishes for `ip`
    /// (IPv4 → IPv4-mapped IPv6, IPv6 as is).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }
    /// The IP address this GID stands for (IPv4 for mapped GIDs).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = self.to_ipv6();
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}
impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// RoCE flavour of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand (or "RoCE v1" on old kernels that did not distinguish).
    Ib,
    RoceV1,
    RoceV2,
    /// The library could not tell (no `ibv_query_gid_ex`, no sysfs), e.g. macOS.
    Unknown,
}

impl GidType {
    pub(crate) fn from_raw(v: u32) -> GidType {
        match v {
            sys::RV_GID_TYPE_IB => GidType::Ib,
            sys::RV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            sys::RV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            _ => GidType::Unknown,
        }
    }
    /// Preference when several entries hold the same address: v2 > v1 > rest.
    pub(crate) fn rank(self) -> u8 {
        match self {
            GidType::RoceV2 => 0,
            GidType::RoceV1 => 1,
            GidType::Unknown => 2,
            GidType::Ib => 3,
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidType::Ib => "IB",
            GidType::RoceV1 => "RoCEv1",
            GidType::RoceV2 => "RoCEv2",
            GidType::Unknown => "unknown",
        })
    }
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Some(match b {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// Port state (`enum ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Other(u32),
}

impl PortState {
    pub(crate) fn from_raw(v: u32) -> PortState {
        match v {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            o => PortState::Other(o),
        }
    }
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    Unspecified,
    InfiniBand,
    Ethernet,
    /// Apple's SDK value 100 (`IBV_LINK_LAYER_THUNDERBOLT`).
    Thunderbolt,
    Other(u8),
}

impl LinkLayer {
    pub(crate) fn from_raw(v: u8) -> LinkLayer {
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            100 => LinkLayer::Thunderbolt,
            o => LinkLayer::Other(o),
        }
    }
}

/// Memory-region / QP access flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AccessFlags(u32);

impl AccessFlags {
    pub const EMPTY: AccessFlags = AccessFlags(0);
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(sys::RV_ACCESS_LOCAL_WRITE);
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(sys::RV_ACCESS_REMOTE_WRITE);
    pub const REMOTE_READ: AccessFlags = AccessFlags(sys::RV_ACCESS_REMOTE_READ);
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(sys::RV_ACCESS_REMOTE_ATOMIC);
    pub fn contains(self, o: AccessFlags) -> bool {
        self.0 & o.0 == o.0
    }
    pub(crate) fn raw(self) -> u32 {
        self.0
    }
}
impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, o: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | o.0)
    }
}
impl BitOrAssign for AccessFlags {
    fn bitor_assign(&mut self, o: AccessFlags) {
        self.0 |= o.0
    }
}

/// Flags of a posted SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(u32);

impl SendFlags {
    pub const NONE: SendFlags = SendFlags(0);
    /// Generate a send completion.
    pub const SIGNALED: SendFlags = SendFlags(sys::RV_SEND_SIGNALED);
    /// Copy the payload into the WQE at post time (`len <= max_inline`).
    pub const INLINE: SendFlags = SendFlags(sys::RV_SEND_INLINE);
    pub const SOLICITED: SendFlags = SendFlags(sys::RV_SEND_SOLICITED);
    pub fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
    pub(crate) fn raw(self) -> u32 {
        self.0
    }
}
impl BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, o: SendFlags) -> SendFlags {
        SendFlags(self.0 | o.0)
    }
}
impl BitOrAssign for SendFlags {
    fn bitor_assign(&mut self, o: SendFlags) {
        self.0 |= o.0
    }
}

/// Queue pair transport type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (Linux flavor).
    Rc,
    /// Unreliable connected (the only type Apple's Thunderbolt RDMA offers).
    Uc,
}

impl QpType {
    pub(crate) fn raw(self) -> u32 {
        match self {
            QpType::Rc => sys::RV_QPT_RC,
            QpType::Uc => sys::RV_QPT_UC,
        }
    }
}

/// Queue pair state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
    Unknown,
}

impl QpState {
    pub(crate) fn from_raw(v: u32) -> QpState {
        match v {
            sys::RV_QPS_RESET => QpState::Reset,
            sys::RV_QPS_INIT => QpState::Init,
            sys::RV_QPS_RTR => QpState::Rtr,
            sys::RV_QPS_RTS => QpState::Rts,
            sys::RV_QPS_SQD => QpState::Sqd,
            sys::RV_QPS_SQE => QpState::Sqe,
            sys::RV_QPS_ERR => QpState::Err,
            _ => QpState::Unknown,
        }
    }
    pub(crate) fn raw(self) -> u32 {
        match self {
            QpState::Reset => sys::RV_QPS_RESET,
            QpState::Init => sys::RV_QPS_INIT,
            QpState::Rtr => sys::RV_QPS_RTR,
            QpState::Rts => sys::RV_QPS_RTS,
            QpState::Sqd => sys::RV_QPS_SQD,
            QpState::Sqe => sys::RV_QPS_SQE,
            QpState::Err => sys::RV_QPS_ERR,
            QpState::Unknown => sys::RV_QPS_UNKNOWN,
        }
    }
}

/// Completion status (`enum ibv_wc_status`; IB spec values).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcStatus(pub u32);

impl WcStatus {
    pub const SUCCESS: WcStatus = WcStatus(0);
    pub const LOC_LEN_ERR: WcStatus = WcStatus(1);
    pub const LOC_QP_OP_ERR: WcStatus = WcStatus(2);
    pub const LOC_PROT_ERR: WcStatus = WcStatus(4);
    pub const WR_FLUSH_ERR: WcStatus = WcStatus(5);
    pub const REM_ACCESS_ERR: WcStatus = WcStatus(10);
    pub const RETRY_EXC_ERR: WcStatus = WcStatus(12);
    pub const RNR_RETRY_EXC_ERR: WcStatus = WcStatus(13);

    pub fn is_success(self) -> bool {
        self.0 == 0
    }
    /// Name as in rdma-core's `ibv_wc_status_str`.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 24] = [
            "success",
            "local length error",
            "local QP operation error",
            "local EE context operation error",
            "local protection error",
            "Work Request Flushed Error",
            "memory management operation error",
            "bad response error",
            "local access error",
            "remote invalid request error",
            "remote access error",
            "remote operation error",
            "transport retry counter exceeded",
            "RNR retry counter exceeded",
            "local RDD violation error",
            "remote invalid RD request",
            "aborted error",
            "invalid EE context number",
            "invalid EE context state",
            "fatal error",
            "response timeout error",
            "general error",
            "TM error",
            "TM software rendezvous",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("unknown")
    }
}

impl fmt::Debug for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WcStatus({} {:?})", self.0, self.name())
    }
}
impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Completion opcode (`enum ibv_wc_opcode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
    RecvRdmaWithImm,
    Other(u32),
}

impl WcOpcode {
    pub(crate) fn from_raw(v: u32) -> WcOpcode {
        match v {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            o => WcOpcode::Other(o),
        }
    }
}
