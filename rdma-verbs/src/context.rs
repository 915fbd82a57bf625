//! Devices, contexts, protection domains and the IP → (device, port, GID) probe.
use std::ffi::{c_int, c_void, CStr};
use std::net::IpAddr;
use std::ptr;
use std::sync::Arc;

use crate::error::{check, Result, VerbsError};
use crate::types::{Gid, GidType, LinkLayer, Mtu, PortState};
use crate::{ensure_loaded, platform, sys};

/// RAII over `ibv_get_device_list`.
struct DeviceList {
    list: *mut c_void,
    num: c_int,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        ensure_loaded()?;
        let mut list = ptr::null_mut();
        let mut num = 0;
        // SAFETY: out-pointers are valid locals; the library is loaded.
        check("ibv_get_device_list", unsafe {
            sys::rv_device_list(&mut list, &mut num)
        })?;
        Ok(DeviceList {
            list,
            num: if list.is_null() { 0 } else { num.max(0) },
        })
    }

    fn names(&self) -> Vec<String> {
        (0..self.num)
            .map(|i| {
                // SAFETY: i < num and the list is alive (freed in Drop only).
                let p = unsafe { sys::rv_device_name(self.list, i) };
                if p.is_null() {
                    String::new()
                } else {
                    // SAFETY: ibv_get_device_name returns a NUL-terminated
                    // string owned by the device, alive while the list is.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            })
            .collect()
    }

    fn open(&self, i: c_int, name: &str) -> Result<Context> {
        let mut ctx = ptr::null_mut();
        // SAFETY: i < num, list alive, out-pointer valid.
        check("ibv_open_device", unsafe {
            sys::rv_open_device(self.list, i, &mut ctx)
        })?;
        // The context stays valid after the list is freed (rdma-core
        // reference-counts the device).
        Ok(Context(Arc::new(ContextInner {
            ptr: ctx,
            name: name.to_string(),
        })))
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: list came from rv_device_list (or is NULL, which the shim ignores).
        unsafe { sys::rv_free_device_list(self.list) }
    }
}

pub(crate) struct ContextInner {
    pub(crate) ptr: *mut c_void,
    name: String,
}

// SAFETY: an ibv_context may be used from any thread; rdma-core and the
// providers serialise internally.  The raw pointer is never handed out.
unsafe impl Send for ContextInner {}
// SAFETY: see Send; all methods take &self and the library is thread-safe.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_open_device; every child object holds an
        // Arc to this context, so none is alive any more.
        let _ = unsafe { sys::rv_close_device(self.ptr) };
    }
}

/// An open device (`ibv_context`).  Cheap to clone (shared).
#[derive(Clone)]
pub struct Context(pub(crate) Arc<ContextInner>);

/// Device limits and identity (`ibv_query_device`, abridged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    /// Node GUID as a host-order number.
    pub node_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub phys_port_cnt: u8,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_sge: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_mr: i32,
    pub max_pd: i32,
    pub max_mr_size: u64,
}

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub port: u8,
    pub index: u32,
    pub gid: Gid,
    pub gid_type: GidType,
}

/// Port attributes (`ibv_query_port`), plus the valid GID entries when
/// obtained through [`devices`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub port: u8,
    pub state: PortState,
    pub max_mtu: Option<Mtu>,
    pub active_mtu: Option<Mtu>,
    pub lid: u16,
    pub sm_lid: u16,
    pub link_layer: LinkLayer,
    pub gid_tbl_len: i32,
    pub active_width: u8,
    pub active_speed: u8,
    pub port_cap_flags: u32,
    /// Valid (non-zero) GID entries of this port; empty from `Context::query_port`.
    pub gids: Vec<GidEntry>,
}

/// A device and everything `devices()` could learn about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    /// `None` when the device could not be opened/queried (see `error`).
    pub attr: Option<DeviceAttr>,
    pub ports: Vec<PortInfo>,
    /// Why the device could not be fully described (it is still listed).
    pub error: Option<VerbsError>,
}

/// Lists every RDMA device with ports and GID tables.  `Ok(vec![])` when the
/// library is present but the kernel has no RDMA (or no device);
/// `Err(LibraryMissing)` without the library.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    let names = list.names();
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let mut info = DeviceInfo {
            name: name.clone(),
            attr: None,
            ports: Vec::new(),
            error: None,
        };
        let r = (|| -> Result<()> {
            let ctx = list.open(i as c_int, name)?;
            let attr = ctx.query_device()?;
            let mut table = ctx.all_gids(&attr)?;
            for p in 1..=attr.phys_port_cnt {
                let mut pi = ctx.query_port(p)?;
                pi.gids = table.iter().filter(|e| e.port == p).copied().collect();
                table.retain(|e| e.port != p);
                info.ports.push(pi);
            }
            info.attr = Some(attr);
            Ok(())
        })();
        if let Err(e) = r {
            info.error = Some(e);
        }
        out.push(info);
    }
    Ok(out)
}

impl Context {
    /// Opens the device called `name` (e.g. `rxe0`, `mlx5_0`, `rdma_en2`).
    pub fn open(name: &str) -> Result<Context> {
        let list = DeviceList::get()?;
        let names = list.names();
        match names.iter().position(|n| n == name) {
            Some(i) => list.open(i as c_int, name),
            None => Err(VerbsError::NoSuchDevice(name.to_string())),
        }
    }

    /// Names of all devices (empty without RDMA).
    pub fn device_names() -> Result<Vec<String>> {
        Ok(DeviceList::get()?.names())
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: all-integer C struct; zeroed is a valid value.
        let mut a: sys::rv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx pointer valid for the lifetime of self; out-pointer valid.
        check("ibv_query_device", unsafe {
            sys::rv_query_device(self.0.ptr, &mut a)
        })?;
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            phys_port_cnt: a.phys_port_cnt,
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_sge: a.max_sge,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_pd: a.max_pd,
            max_mr_size: a.max_mr_size,
        })
    }

    /// Port attributes (`gids` left empty; see [`Context::gid_table`]).
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        let mut a = sys::rv_port_attr::default();
        // SAFETY: ctx valid; out-pointer valid.
        check("ibv_query_port", unsafe {
            sys::rv_query_port(self.0.ptr, port, &mut a)
        })?;
        Ok(PortInfo {
            port,
            state: PortState::from_raw(a.state),
            max_mtu: Mtu::from_raw(a.max_mtu),
            active_mtu: Mtu::from_raw(a.active_mtu),
            lid: a.lid,
            sm_lid: a.sm_lid,
            link_layer: LinkLayer::from_raw(a.link_layer),
            gid_tbl_len: a.gid_tbl_len,
            active_width: a.active_width,
            active_speed: a.active_speed,
            port_cap_flags: a.port_cap_flags,
            gids: Vec::new(),
        })
    }

    /// Raw GID at `index` (`ibv_query_gid`; zero GID for an empty slot).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let idx =
            c_int::try_from(index).map_err(|_| VerbsError::InvalidArgument("gid index".into()))?;
        let mut g = [0u8; 16];
        // SAFETY: ctx valid; g is a 16-byte buffer as the shim requires.
        check("ibv_query_gid", unsafe {
            sys::rv_query_gid(self.0.ptr, port, idx, g.as_mut_ptr())
        })?;
        Ok(Gid(g))
    }

    /// One GID entry with its type (`ibv_query_gid_ex`, else
    /// `ibv_query_gid` + sysfs type).
    pub fn gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        let idx =
            c_int::try_from(index).map_err(|_| VerbsError::InvalidArgument("gid index".into()))?;
        let mut e = sys::rv_gid_entry::default();
        // SAFETY: ctx valid; out-pointer valid.
        match check("ibv_query_gid_ex", unsafe {
            sys::rv_query_gid_ex(self.0.ptr, port, idx, &mut e)
        }) {
            Ok(()) => Ok(GidEntry {
                port,
                index,
                gid: Gid(e.gid),
                gid_type: GidType::from_raw(e.gid_type),
            }),
            Err(VerbsError::Unsupported(_)) => {
                let gid = self.query_gid(port, index)?;
                let gid_type =
                    platform::sysfs_gid_type(self.name(), port, index).unwrap_or(GidType::Unknown);
                Ok(GidEntry {
                    port,
                    index,
                    gid,
                    gid_type,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Valid GID entries of `port`.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let attr = self.query_device()?;
        Ok(self
            .all_gids(&attr)?
            .into_iter()
            .filter(|e| e.port == port)
            .collect())
    }

    /// Valid GID entries of every port: `_ibv_query_gid_table` when exported,
    /// else a per-index scan skipping empty (zero) slots.
    fn all_gids(&self, attr: &DeviceAttr) -> Result<Vec<GidEntry>> {
        let mut lens = Vec::new();
        for p in 1..=attr.phys_port_cnt {
            lens.push((p, self.query_port(p)?.gid_tbl_len.max(0) as usize));
        }
        let total: usize = lens.iter().map(|l| l.1).sum::<usize>().max(1);
        let mut buf = vec![sys::rv_gid_entry::default(); total];
        let mut n = 0usize;
        // SAFETY: ctx valid; buf holds `total` entries; n is a valid out-pointer.
        let rc = unsafe { sys::rv_query_gid_table(self.0.ptr, buf.as_mut_ptr(), total, &mut n) };
        match check("ibv_query_gid_table", rc) {
            Ok(()) => Ok(buf[..n.min(total)]
                .iter()
                .filter(|e| e.port_num <= u8::MAX as u32)
                .map(|e| GidEntry {
                    port: e.port_num as u8,
                    index: e.gid_index,
                    gid: Gid(e.gid),
                    gid_type: GidType::from_raw(e.gid_type),
                })
                .collect()),
            Err(VerbsError::Unsupported(_)) => {
                let mut out = Vec::new();
                for (p, len) in lens {
                    for i in 0..len as u32 {
                        match self.gid_entry(p, i) {
                            Ok(e) if !e.gid.is_zero() => out.push(e),
                            _ => {}
                        }
                    }
                }
                Ok(out)
            }
            Err(e) => Err(e),
        }
    }
}

/// Which ports [`find_gid_with`] scans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortChoice {
    /// Only this port (upstream Linux flavor: port 1).
    Fixed(u8),
    /// The first port in state ACTIVE (upstream Apple flavor).
    FirstActive,
    /// Every port; among equally good entries the lowest port wins.
    Any,
}

/// Parameters of [`find_gid_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidSearch {
    /// Only this device (upstream: `GGML_RDMA_DEV`).
    pub device: Option<String>,
    pub ports: PortChoice,
    /// Use this GID index instead of matching the address (upstream:
    /// `GGML_RDMA_GID`); the first device/port that has it wins.
    pub gid_index: Option<u32>,
}

impl Default for GidSearch {
    fn default() -> Self {
        GidSearch {
            device: None,
            ports: PortChoice::Any,
            gid_index: None,
        }
    }
}

/// Result of the IP → (device, port, GID index) probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidMatch {
    pub device: String,
    pub port: u8,
    pub gid_index: u32,
    pub gid: Gid,
    pub gid_type: GidType,
    pub port_state: PortState,
    /// The port's active MTU (what both upstream flavors use as path MTU).
    pub active_mtu: Mtu,
    pub lid: u16,
    pub link_layer: LinkLayer,
}

/// Finds the device/port/GID entry whose GID equals `ip` (IPv4 as
/// `::ffff:a.b.c.d`), scanning all ports and preferring RoCE v2 over v1 like
/// upstream's probe.  The first device (in `ibv_get_device_list` order) with
/// a match wins.  `Ok(None)`: no match / no device; `Err(LibraryMissing)`:
/// no verbs library.
pub fn find_gid_for_ip(ip: IpAddr) -> Result<Option<GidMatch>> {
    find_gid_with(ip, &GidSearch::default())
}

/// [`find_gid_for_ip`] with device/port/index constraints.  Devices that fail
/// to open or query are skipped.
pub fn find_gid_with(ip: IpAddr, search: &GidSearch) -> Result<Option<GidMatch>> {
    let target = Gid::from_ip(ip);
    let list = DeviceList::get()?;
    for (i, name) in list.names().iter().enumerate() {
        if search.device.as_deref().is_some_and(|d| d != name) {
            continue;
        }
        let Ok(ctx) = list.open(i as c_int, name) else {
            continue;
        };
        if let Ok(Some(m)) = probe_device(&ctx, target, search) {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

fn probe_device(ctx: &Context, target: Gid, search: &GidSearch) -> Result<Option<GidMatch>> {
    let attr = ctx.query_device()?;
    let mut ports = Vec::new();
    for p in 1..=attr.phys_port_cnt {
        let Ok(pi) = ctx.query_port(p) else { continue };
        match search.ports {
            PortChoice::Fixed(f) if f != p => continue,
            PortChoice::FirstActive if pi.state != PortState::Active => continue,
            _ => {}
        }
        ports.push(pi);
        if search.ports == PortChoice::FirstActive {
            break;
        }
    }
    if let PortChoice::Fixed(f) = search.ports {
        if f == 0 || f > attr.phys_port_cnt {
            return Ok(None);
        }
    }
    let make = |pi: &PortInfo, e: GidEntry| GidMatch {
        device: ctx.name().to_string(),
        port: pi.port,
        gid_index: e.index,
        gid: e.gid,
        gid_type: e.gid_type,
        port_state: pi.state,
        active_mtu: pi.active_mtu.unwrap_or(Mtu::Mtu1024),
        lid: pi.lid,
        link_layer: pi.link_layer,
    };
    if let Some(idx) = search.gid_index {
        for pi in &ports {
            if let Ok(e) = ctx.gid_entry(pi.port, idx) {
                return Ok(Some(make(pi, e)));
            }
        }
        return Ok(None);
    }
    let table = ctx.all_gids(&attr)?;
    let mut best: Option<(u8, u8, &PortInfo, GidEntry)> = None;
    for pi in &ports {
        for e in table
            .iter()
            .filter(|e| e.port == pi.port && e.gid == target)
        {
            let key = (e.gid_type.rank(), pi.port);
            if best.as_ref().is_none_or(|b| key < (b.0, b.1)) {
                best = Some((key.0, key.1, pi, *e));
            }
        }
    }
    Ok(best.map(|(_, _, pi, e)| make(pi, e)))
}

pub(crate) struct PdInner {
    pub(crate) ptr: *mut c_void,
    pub(crate) ctx: Context,
}

// SAFETY: ibv_pd is usable from any thread (library-internal locking); the
// pointer is never exposed.
unsafe impl Send for PdInner {}
// SAFETY: see Send.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_alloc_pd; every QP and MR of this PD holds
        // an Arc to it, so none is alive any more.
        let _ = unsafe { sys::rv_dealloc_pd(self.ptr) };
    }
}

/// Protection domain.  Cheap to clone (shared).
#[derive(Clone)]
pub struct Pd(pub(crate) Arc<PdInner>);

impl Pd {
    /// `ibv_alloc_pd`.  On Apple a NULL PD means the port is down / the
    /// Thunderbolt link is unhealthy (rdma-transports.md §5.3).
    pub fn new(ctx: &Context) -> Result<Pd> {
        let mut pd = ptr::null_mut();
        // SAFETY: ctx valid; out-pointer valid.
        check("ibv_alloc_pd", unsafe {
            sys::rv_alloc_pd(ctx.0.ptr, &mut pd)
        })?;
        Ok(Pd(Arc::new(PdInner {
            ptr: pd,
            ctx: ctx.clone(),
        })))
    }

    pub fn context(&self) -> &Context {
        &self.0.ctx
    }
}
