//! Queue pairs (RC and UC), state transitions and posting.
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use crate::context::{Pd, PdInner};
use crate::cq::Cq;
use crate::error::{check, Result, VerbsError};
use crate::mr::Mr;
use crate::sys;
use crate::types::{AccessFlags, Gid, Mtu, QpState, QpType, SendFlags};

/// Creation parameters (`ibv_qp_init_attr`).
#[derive(Clone, Copy)]
pub struct QpInitAttr<'a> {
    pub qp_type: QpType,
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Requested; the granted value is in [`Qp::caps`].
    pub max_inline_data: u32,
    /// Signal every send regardless of `SendFlags::SIGNALED`.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// One SGE per WR, no inline data, selective signalling.
    pub fn new(
        qp_type: QpType,
        send_cq: &'a Cq,
        recv_cq: &'a Cq,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Self {
        QpInitAttr {
            qp_type,
            send_cq,
            recv_cq,
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            sq_sig_all: false,
        }
    }
}

/// Capabilities granted by the provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl From<sys::rv_qp_cap> for QpCaps {
    fn from(c: sys::rv_qp_cap) -> Self {
        QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        }
    }
}

/// RESET → INIT: mask `STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitAttr {
    pub port: u8,
    pub pkey_index: u16,
    /// `qp_access_flags`; both upstream flavors use
    /// `LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE`.
    pub access: AccessFlags,
}

impl InitAttr {
    /// What both upstream flavors use: pkey 0, `LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE`.
    pub fn upstream(port: u8) -> InitAttr {
        InitAttr {
            port,
            pkey_index: 0,
            access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        }
    }
}

/// Address vector (`ibv_ah_attr` incl. GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressVector {
    pub is_global: bool,
    pub dgid: Gid,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub port: u8,
}

impl AddressVector {
    /// GRH-routed (RoCE / Thunderbolt): `is_global 1, hop_limit 1, dlid`,
    /// `sl 0, src_path_bits 0`.  Linux upstream uses `dlid 0`, Apple the
    /// peer's LID.
    pub fn global(dgid: Gid, sgid_index: u8, port: u8, dlid: u16) -> AddressVector {
        AddressVector {
            is_global: true,
            dgid,
            sgid_index,
            hop_limit: 1,
            traffic_class: 0,
            flow_label: 0,
            dlid,
            sl: 0,
            src_path_bits: 0,
            port,
        }
    }
}

/// INIT → RTR.  Mask: `STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN`, plus
/// `MAX_DEST_RD_ATOMIC` / `MIN_RNR_TIMER` when set (RC only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    pub path_mtu: Mtu,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub av: AddressVector,
    pub max_dest_rd_atomic: Option<u8>,
    pub min_rnr_timer: Option<u8>,
}

impl RtrAttr {
    /// Upstream Linux RC flavor (rdma-transports.md §3.4):
    /// `max_dest_rd_atomic 1, min_rnr_timer 1`.
    pub fn rc(path_mtu: Mtu, dest_qpn: u32, rq_psn: u32, av: AddressVector) -> RtrAttr {
        RtrAttr {
            path_mtu,
            dest_qpn,
            rq_psn,
            av,
            max_dest_rd_atomic: Some(1),
            min_rnr_timer: Some(1),
        }
    }
    /// Upstream Apple UC flavor (§4.5): no RC-only attributes.
    pub fn uc(path_mtu: Mtu, dest_qpn: u32, rq_psn: u32, av: AddressVector) -> RtrAttr {
        RtrAttr {
            path_mtu,
            dest_qpn,
            rq_psn,
            av,
            max_dest_rd_atomic: None,
            min_rnr_timer: None,
        }
    }
}

/// RTR → RTS.  Mask: `STATE | SQ_PSN`, plus each RC attribute that is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    pub sq_psn: u32,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    pub max_rd_atomic: Option<u8>,
}

impl RtsAttr {
    /// Upstream Linux RC flavor (§3.4): `timeout 14, retry_cnt 7,
    /// rnr_retry 7, max_rd_atomic 1`.
    pub fn rc(sq_psn: u32) -> RtsAttr {
        RtsAttr {
            sq_psn,
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(1),
        }
    }
    /// Upstream Apple UC flavor (§4.5): `sq_psn` only.
    pub fn uc(sq_psn: u32) -> RtsAttr {
        RtsAttr {
            sq_psn,
            timeout: None,
            retry_cnt: None,
            rnr_retry: None,
            max_rd_atomic: None,
        }
    }
}

/// A queue pair.  Holds its PD and CQs alive.  Drop it **before** the MRs
/// it posts into or from (Apple teardown rule; see the crate docs); posting
/// from borrowed [`Mr`]s is therefore `unsafe` ([`Qp::post_send`],
/// [`Qp::post_recv`]), and [`crate::OwnedQp`] owns a QP with its MRs so that
/// posting is safe.
pub struct Qp {
    ptr: *mut c_void,
    qp_num: u32,
    qp_type: QpType,
    caps: QpCaps,
    pd: Arc<PdInner>,
    _send_cq: Cq,
    _recv_cq: Cq,
}

// SAFETY: posting and modifying a QP is thread-safe in rdma-core providers
// (they lock the send/recv queues); the pointer is never exposed.
unsafe impl Send for Qp {}
// SAFETY: see Send.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: ptr came from ibv_create_qp and is destroyed exactly once;
        // the QP is not moved to ERR first (Apple rule).  PD and CQs are
        // still alive (held by self).
        let _ = unsafe { sys::rv_destroy_qp(self.ptr) };
    }
}

impl Qp {
    /// `ibv_create_qp`.  The CQs must belong to the PD's context.  On Apple
    /// `EBUSY` means the per-device QP budget (10) is exhausted.
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        let ctx = &pd.context().0;
        if !Arc::ptr_eq(ctx, &init.send_cq.context().0)
            || !Arc::ptr_eq(ctx, &init.recv_cq.context().0)
        {
            return Err(VerbsError::InvalidArgument(
                "CQ and PD belong to different contexts".into(),
            ));
        }
        let raw = sys::rv_qp_init {
            qp_type: init.qp_type.raw(),
            max_send_wr: init.max_send_wr,
            max_recv_wr: init.max_recv_wr,
            max_send_sge: init.max_send_sge,
            max_recv_sge: init.max_recv_sge,
            max_inline_data: init.max_inline_data,
            sq_sig_all: init.sq_sig_all as u32,
        };
        let mut qp = ptr::null_mut();
        let mut qp_num = 0u32;
        let mut cap = sys::rv_qp_cap::default();
        // SAFETY: pd and both CQs are valid and of one context; all
        // pointers point to live locals.
        check("ibv_create_qp", unsafe {
            sys::rv_create_qp(
                pd.0.ptr,
                init.send_cq.0.ptr,
                init.recv_cq.0.ptr,
                &raw,
                &mut qp,
                &mut qp_num,
                &mut cap,
            )
        })?;
        Ok(Qp {
            ptr: qp,
            qp_num,
            qp_type: init.qp_type,
            caps: cap.into(),
            pd: pd.0.clone(),
            _send_cq: init.send_cq.clone(),
            _recv_cq: init.recv_cq.clone(),
        })
    }

    /// The protection domain the QP was created in.
    pub(crate) fn pd(&self) -> &Arc<PdInner> {
        &self.pd
    }

    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Capabilities granted at creation.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
    /// Granted inline size (what upstream compares each piece against).
    pub fn max_inline(&self) -> u32 {
        self.caps.max_inline_data
    }

    /// Current state and capabilities (`ibv_query_qp(STATE | CAP)`).
    pub fn query(&self) -> Result<(QpState, QpCaps)> {
        let mut state = 0u32;
        let mut cap = sys::rv_qp_cap::default();
        // SAFETY: qp valid; out-pointers valid.
        check("ibv_query_qp", unsafe {
            sys::rv_query_qp(self.ptr, &mut state, &mut cap)
        })?;
        Ok((QpState::from_raw(state), cap.into()))
    }

    pub fn state(&self) -> Result<QpState> {
        Ok(self.query()?.0)
    }

    fn modify(&self, op: &'static str, a: &sys::rv_qp_attr, mask: u32) -> Result<()> {
        // SAFETY: qp valid; `a` is a fully initialised shim struct.
        check(op, unsafe { sys::rv_modify_qp(self.ptr, a, mask) })
    }

    /// RESET → INIT.
    pub fn modify_to_init(&self, attr: &InitAttr) -> Result<()> {
        let a = sys::rv_qp_attr {
            qp_state: QpState::Init.raw(),
            pkey_index: attr.pkey_index,
            port_num: attr.port,
            qp_access_flags: attr.access.raw(),
            ..Default::default()
        };
        self.modify(
            "modify_qp(INIT)",
            &a,
            sys::RV_QP_STATE | sys::RV_QP_PKEY_INDEX | sys::RV_QP_PORT | sys::RV_QP_ACCESS_FLAGS,
        )
    }

    /// INIT → RTR.
    pub fn modify_to_rtr(&self, attr: &RtrAttr) -> Result<()> {
        let av = &attr.av;
        let mut a = sys::rv_qp_attr {
            qp_state: QpState::Rtr.raw(),
            path_mtu: attr.path_mtu.raw(),
            dest_qp_num: attr.dest_qpn,
            rq_psn: attr.rq_psn,
            ah_is_global: av.is_global as u8,
            ah_dlid: av.dlid,
            ah_sl: av.sl,
            ah_src_path_bits: av.src_path_bits,
            ah_port_num: av.port,
            grh_hop_limit: av.hop_limit,
            grh_sgid_index: av.sgid_index,
            grh_traffic_class: av.traffic_class,
            grh_flow_label: av.flow_label,
            grh_dgid: av.dgid.0,
            ..Default::default()
        };
        let mut mask = sys::RV_QP_STATE
            | sys::RV_QP_AV
            | sys::RV_QP_PATH_MTU
            | sys::RV_QP_DEST_QPN
            | sys::RV_QP_RQ_PSN;
        if let Some(v) = attr.max_dest_rd_atomic {
            a.max_dest_rd_atomic = v;
            mask |= sys::RV_QP_MAX_DEST_RD_ATOMIC;
        }
        if let Some(v) = attr.min_rnr_timer {
            a.min_rnr_timer = v;
            mask |= sys::RV_QP_MIN_RNR_TIMER;
        }
        self.modify("modify_qp(RTR)", &a, mask)
    }

    /// RTR → RTS.
    pub fn modify_to_rts(&self, attr: &RtsAttr) -> Result<()> {
        let mut a = sys::rv_qp_attr {
            qp_state: QpState::Rts.raw(),
            sq_psn: attr.sq_psn,
            ..Default::default()
        };
        let mut mask = sys::RV_QP_STATE | sys::RV_QP_SQ_PSN;
        if let Some(v) = attr.timeout {
            a.timeout = v;
            mask |= sys::RV_QP_TIMEOUT;
        }
        if let Some(v) = attr.retry_cnt {
            a.retry_cnt = v;
            mask |= sys::RV_QP_RETRY_CNT;
        }
        if let Some(v) = attr.rnr_retry {
            a.rnr_retry = v;
            mask |= sys::RV_QP_RNR_RETRY;
        }
        if let Some(v) = attr.max_rd_atomic {
            a.max_rd_atomic = v;
            mask |= sys::RV_QP_MAX_QP_RD_ATOMIC;
        }
        self.modify("modify_qp(RTS)", &a, mask)
    }

    /// Any state → ERR (flushes outstanding WRs).  **Never on Apple**: its
    /// provider then fails every region unmap; just drop the QP there.
    pub fn modify_to_error(&self) -> Result<()> {
        let a = sys::rv_qp_attr {
            qp_state: QpState::Err.raw(),
            ..Default::default()
        };
        self.modify("modify_qp(ERR)", &a, sys::RV_QP_STATE)
    }

    /// Any state → RESET.
    pub fn modify_to_reset(&self) -> Result<()> {
        let a = sys::rv_qp_attr {
            qp_state: QpState::Reset.raw(),
            ..Default::default()
        };
        self.modify("modify_qp(RESET)", &a, sys::RV_QP_STATE)
    }

    /// Posts one two-sided SEND of `mr[offset..offset+len]`.  With
    /// `SendFlags::INLINE`, `len` must be ≤ [`Qp::max_inline`] and the bytes
    /// are copied at post time.  [`crate::OwnedQp::post_send`] is the safe
    /// form.
    ///
    /// # Safety
    ///
    /// Unless the send is inline, the device reads the range at some time
    /// before the work request completes: `mr` must stay registered (not be
    /// dropped) until the completion of this work request has been polled, or
    /// until this QP has been destroyed or moved to RESET.  The borrow of `mr`
    /// ends with the call and cannot promise that.  Bounds and the PD are
    /// checked (an error, not undefined behaviour).
    ///
    /// ```compile_fail,E0133
    /// // Posting from a borrowed region needs `unsafe`.
    /// fn send(qp: &rdma_verbs::Qp, mr: &rdma_verbs::Mr) {
    ///     let _ = qp.post_send(0, mr, 0, 64, rdma_verbs::SendFlags::SIGNALED);
    /// }
    /// ```
    pub unsafe fn post_send(
        &self,
        wr_id: u64,
        mr: &Mr,
        offset: usize,
        len: usize,
        flags: SendFlags,
    ) -> Result<()> {
        if !Arc::ptr_eq(&mr.pd, &self.pd) {
            return Err(VerbsError::InvalidArgument(
                "MR belongs to another PD".into(),
            ));
        }
        let r = mr.range(offset, len)?;
        let len32 =
            u32::try_from(len).map_err(|_| VerbsError::InvalidArgument("send > 4 GiB".into()))?;
        if flags.contains(SendFlags::INLINE) && len32 > self.caps.max_inline_data {
            return Err(VerbsError::InvalidArgument(format!(
                "inline send of {len} bytes > granted max_inline {}",
                self.caps.max_inline_data
            )));
        }
        let addr = mr.addr() + r.start as u64;
        // SAFETY: qp valid; addr/len lie inside the registered region of
        // `mr` (checked above), whose lkey is passed; the region outlives the
        // WR by this function's contract (see # Safety).
        check("ibv_post_send", unsafe {
            sys::rv_post_send(self.ptr, wr_id, addr, len32, mr.lkey(), flags.raw())
        })
    }

    /// Posts one SEND whose payload is copied inline from `data` at post
    /// time (no MR needed).  `data.len()` must be ≤ [`Qp::max_inline`].
    pub fn post_send_inline(&self, wr_id: u64, data: &[u8], flags: SendFlags) -> Result<()> {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if len > self.caps.max_inline_data {
            return Err(VerbsError::InvalidArgument(format!(
                "inline send of {} bytes > granted max_inline {}",
                data.len(),
                self.caps.max_inline_data
            )));
        }
        // SAFETY: qp valid; with IBV_SEND_INLINE the provider copies `data`
        // into the WQE before ibv_post_send returns, so the borrow suffices;
        // lkey is ignored for inline data.
        check("ibv_post_send", unsafe {
            sys::rv_post_send(
                self.ptr,
                wr_id,
                data.as_ptr() as u64,
                len,
                0,
                (flags | SendFlags::INLINE).raw(),
            )
        })
    }

    /// Posts one receive into `mr[offset..offset+len]`.  Apple's provider
    /// rejects receives before RTS.  [`crate::OwnedQp::post_recv`] is the
    /// safe form.
    ///
    /// # Safety
    ///
    /// The device may write the range at any time until the work request
    /// completes: `mr` must stay registered (not be dropped) until the
    /// completion of this work request has been polled, or until this QP has
    /// been destroyed or moved to RESET.  The borrow of `mr` ends with the
    /// call and cannot promise that.  Bounds and the PD are checked (an
    /// error, not undefined behaviour).
    ///
    /// ```compile_fail,E0133
    /// // Posting into a borrowed region needs `unsafe`.
    /// fn recv(qp: &rdma_verbs::Qp, mr: &rdma_verbs::Mr) {
    ///     let _ = qp.post_recv(0, mr, 0, 64);
    /// }
    /// ```
    pub unsafe fn post_recv(&self, wr_id: u64, mr: &Mr, offset: usize, len: usize) -> Result<()> {
        if !Arc::ptr_eq(&mr.pd, &self.pd) {
            return Err(VerbsError::InvalidArgument(
                "MR belongs to another PD".into(),
            ));
        }
        let r = mr.range(offset, len)?;
        let len32 =
            u32::try_from(len).map_err(|_| VerbsError::InvalidArgument("recv > 4 GiB".into()))?;
        let addr = mr.addr() + r.start as u64;
        // SAFETY: qp valid; the range lies inside the registered region of
        // `mr` (checked above) and its lkey is passed; the region outlives
        // the WR by this function's contract (see # Safety).
        check("ibv_post_recv", unsafe {
            sys::rv_post_recv(self.ptr, wr_id, addr, len32, mr.lkey())
        })
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qp_num", &self.qp_num)
            .field("type", &self.qp_type)
            .field("caps", &self.caps)
            .finish()
    }
}
