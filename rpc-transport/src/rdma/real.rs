//! Real verbs (`rdma-verbs`): device selection from the TCP socket's local address, queue-pair
//! setup and activation exactly as upstream's two flavors do it, and the [`Verbs`] adapter.

use std::io;
use std::net::IpAddr;

use rdma_verbs as rv;

use super::caps::{Caps, Flavor};
use super::lean::{Geometry, LeanLink};
use super::rc::{RcLink, RC_RX_DEPTH, RC_RX_SIZE, RC_TX_SIZE};
use super::uc::{UcLink, UC_NBUF, UC_RING_SIZE};
use super::verbs::{Verbs, Wc};

/// Why RDMA cannot engage (the connection then stays on TCP).
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("RDMA library not available: {0}")]
    Library(String),
    #[error("no RDMA device has a GID for local address {0}")]
    NoDevice(IpAddr),
    #[error("RDMA port not active on {0}")]
    PortDown(String),
    #[error("{what}: {err}")]
    Verbs {
        what: &'static str,
        err: rv::VerbsError,
    },
    #[error("posting receives: {0}")]
    PostRecv(io::Error),
    #[error("the lean framing needs a queue pair prepared for it (prepare_with(.., lean = true))")]
    NotPreparedForLean,
}

fn verr(what: &'static str) -> impl FnOnce(rv::VerbsError) -> RdmaError {
    move |err| RdmaError::Verbs { what, err }
}

fn io_err(e: rv::VerbsError) -> io::Error {
    io::Error::other(e.to_string())
}

// The lean framing fits in the memory and work-request budgets of the upstream flavors' queue
// pairs (RC: the send region grows to 4 slots when prepared for lean).
const _: () =
    assert!(Geometry::UC.rx_size() <= UC_RING_SIZE && Geometry::UC.tx_size() <= UC_RING_SIZE);
const _: () =
    assert!(Geometry::UC.rx_slots <= UC_NBUF * 32 && Geometry::UC.tx_slots <= UC_NBUF * 32);
const _: () = assert!(
    Geometry::RC.rx_size() <= RC_RX_SIZE
        && Geometry::RC.rx_slots <= RC_RX_DEPTH + 4
        && Geometry::RC.tx_slots <= 4
);

/// Tags receive work requests so completions on a shared CQ can be told apart.
const RECV_TAG: u64 = 1 << 63;

/// One connected queue pair with its registered memory. [`rv::OwnedQp`] owns the QP with both
/// regions and destroys the QP before the memory it may still write into (upstream PR #27908),
/// which is what makes its posting safe.
pub struct RealQp {
    ep: rv::OwnedQp,
    send_cq: rv::Cq,
    recv_cq: Option<rv::Cq>,
    /// Completion events of both CQs (idle connections sleep on its fd instead of polling).
    channel: Option<rv::CompChannel>,
    _pd: rv::Pd,
    _ctx: rv::Context,
    max_inline: usize,
    wcs: Vec<rv::WorkCompletion>,
}

impl RealQp {
    fn qp(&self) -> &rv::Qp {
        self.ep.qp()
    }

    fn drain(cq: &rv::Cq, wcs: &mut [rv::WorkCompletion], out: &mut Vec<Wc>) -> io::Result<()> {
        loop {
            let n = cq.poll(wcs).map_err(io_err)?;
            for wc in &wcs[..n] {
                let id = wc.wr_id();
                out.push(Wc {
                    wr_id: id & !RECV_TAG,
                    recv: id & RECV_TAG != 0,
                    byte_len: wc.byte_len(),
                    error: (!wc.is_success()).then(|| wc.status().0),
                });
            }
            if n < wcs.len() {
                return Ok(());
            }
        }
    }
}

impl Verbs for RealQp {
    fn send_mem(&mut self) -> &mut [u8] {
        self.ep.send_mem_mut()
    }

    fn recv_mem(&self) -> &[u8] {
        self.ep.recv_mr().as_slice()
    }

    fn post_send(&mut self, wr_id: u64, offset: usize, len: usize, inline: bool) -> io::Result<()> {
        if inline && len <= self.max_inline {
            let data = self
                .ep
                .send_mr()
                .as_slice()
                .get(offset..offset + len)
                .ok_or_else(|| io::Error::other("send range"))?;
            return self
                .ep
                .post_send_inline(wr_id, data, rv::SendFlags::SIGNALED | rv::SendFlags::INLINE)
                .map_err(io_err);
        }
        self.ep
            .post_send(wr_id, offset, len, rv::SendFlags::SIGNALED)
            .map_err(io_err)
    }

    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> io::Result<()> {
        self.ep
            .post_recv(wr_id | RECV_TAG, offset, len)
            .map_err(io_err)
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()> {
        Self::drain(&self.send_cq, &mut self.wcs, out)?;
        if let Some(rcq) = &self.recv_cq {
            Self::drain(rcq, &mut self.wcs, out)?;
        }
        Ok(())
    }

    fn max_inline(&self) -> usize {
        self.max_inline
    }

    fn arm(&mut self) -> io::Result<Option<rv::CompChannel>> {
        let Some(ch) = &self.channel else {
            return Ok(None);
        };
        self.send_cq.req_notify(false).map_err(io_err)?;
        if let Some(rcq) = &self.recv_cq {
            rcq.req_notify(false).map_err(io_err)?;
        }
        Ok(Some(ch.clone()))
    }
}

/// A queue pair set up for one connection, before the peer's caps are applied.
pub struct Prepared {
    pub flavor: Flavor,
    pub device: String,
    pub gid_index: u32,
    pub mtu: u32,
    qp: RealQp,
    port: u8,
    active_mtu: rv::Mtu,
    caps: Caps,
    /// Memory sized for the lean framing too (the caps carry the lean marker).
    lean: bool,
}

/// Options for device selection.
#[derive(Debug, Clone, Default)]
pub struct RdmaOptions {
    /// Only this device (upstream: `GGML_RDMA_DEV`).
    pub device: Option<String>,
    /// Use this GID index instead of matching the address (upstream: `GGML_RDMA_GID`).
    pub gid_index: Option<u32>,
}

/// Finds the device whose GID is `local_ip` and creates the flavor's queue pair and memory.
pub fn prepare(
    local_ip: IpAddr,
    flavor: Flavor,
    opts: &RdmaOptions,
) -> Result<Prepared, RdmaError> {
    prepare_with(local_ip, flavor, opts, false)
}

/// [`prepare`], optionally for the lean framing as well: the memory then fits both the flavor's
/// upstream framing and the lean one, and [`Prepared::caps`] carry the lean marker. Either
/// activation can follow, depending on the peer's answer.
pub fn prepare_with(
    local_ip: IpAddr,
    flavor: Flavor,
    opts: &RdmaOptions,
    lean: bool,
) -> Result<Prepared, RdmaError> {
    rv::load().map_err(|e| RdmaError::Library(e.to_string()))?;
    let search = rv::GidSearch {
        device: opts.device.clone(),
        gid_index: opts.gid_index,
        ..Default::default()
    };
    let m = rv::find_gid_with(local_ip, &search)
        .map_err(verr("GID lookup"))?
        .ok_or(RdmaError::NoDevice(local_ip))?;
    if m.port_state != rv::PortState::Active {
        return Err(RdmaError::PortDown(m.device.clone()));
    }
    let ctx = rv::Context::open(&m.device).map_err(verr("ibv_open_device"))?;
    let pd = rv::Pd::new(&ctx).map_err(verr("ibv_alloc_pd"))?;
    if m.gid_index > u8::MAX as u32 {
        return Err(RdmaError::NoDevice(local_ip));
    }
    // Optional: without a channel an idle connection polls on a 1 ms timer instead. Not with
    // Apple's symbol set (macOS, or RDMA_VERBS_SYMBOLS=apple): Apple's provider is only known to
    // work polled, as upstream uses it, and its library may lack the channel's entry points.
    let channel = if rv::symbol_set() == rv::SymbolSet::Full
        && std::env::var_os("RPC_RDMA_NO_EVENTS").is_none()
    {
        match rv::CompChannel::new(&ctx) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(
                    "no completion channel on {} ({e}); idle connections will poll",
                    m.device
                );
                None
            }
        }
    } else {
        None
    };
    let (qp, send_mr, recv_mr, send_cq, recv_cq) = match flavor {
        Flavor::LinuxRc => {
            let send_cq = rv::Cq::new(&ctx, 16, channel.as_ref()).map_err(verr("ibv_create_cq"))?;
            let recv_cq = rv::Cq::new(&ctx, RC_RX_DEPTH as u32 + 4, channel.as_ref())
                .map_err(verr("ibv_create_cq"))?;
            let mut init = rv::QpInitAttr::new(
                rv::QpType::Rc,
                &send_cq,
                &recv_cq,
                4,
                RC_RX_DEPTH as u32 + 4,
            );
            init.max_inline_data = 256;
            let qp = rv::Qp::new(&pd, &init).map_err(verr("ibv_create_qp"))?;
            let tx_size = if lean {
                RC_TX_SIZE.max(Geometry::RC.tx_size())
            } else {
                RC_TX_SIZE
            };
            let send_mr = rv::Mr::new(
                &pd,
                rv::AlignedBuf::new(tx_size).map_err(verr("alloc"))?,
                rv::AccessFlags::LOCAL_WRITE,
            )
            .map_err(verr("ibv_reg_mr"))?;
            let recv_mr = rv::Mr::new(
                &pd,
                rv::AlignedBuf::new(RC_RX_SIZE).map_err(verr("alloc"))?,
                rv::AccessFlags::LOCAL_WRITE | rv::AccessFlags::REMOTE_WRITE,
            )
            .map_err(verr("ibv_reg_mr"))?;
            (qp, send_mr, recv_mr, send_cq, Some(recv_cq))
        }
        Flavor::AppleUc => {
            let wr = (UC_NBUF * 32) as u32;
            let cq =
                rv::Cq::new(&ctx, 2 * wr + 1, channel.as_ref()).map_err(verr("ibv_create_cq"))?;
            let mut init = rv::QpInitAttr::new(rv::QpType::Uc, &cq, &cq, wr, wr);
            init.max_inline_data = 0;
            let qp = rv::Qp::new(&pd, &init).map_err(verr("ibv_create_qp"))?;
            let access = rv::AccessFlags::LOCAL_WRITE
                | rv::AccessFlags::REMOTE_READ
                | rv::AccessFlags::REMOTE_WRITE;
            let send_mr = rv::Mr::new(
                &pd,
                rv::AlignedBuf::new(UC_RING_SIZE).map_err(verr("alloc"))?,
                access,
            )
            .map_err(verr("ibv_reg_mr"))?;
            let recv_mr = rv::Mr::new(
                &pd,
                rv::AlignedBuf::new(UC_RING_SIZE).map_err(verr("alloc"))?,
                access,
            )
            .map_err(verr("ibv_reg_mr"))?;
            // Apple: INIT at probe time.
            qp.modify_to_init(&rv::InitAttr::upstream(m.port))
                .map_err(verr("QP INIT"))?;
            (qp, send_mr, recv_mr, cq, None)
        }
    };
    let max_inline = qp.max_inline() as usize;
    let gid = *m.gid.as_bytes();
    let caps = match flavor {
        Flavor::LinuxRc => Caps::rc(qp.qp_num(), gid),
        Flavor::AppleUc => Caps::uc(qp.qp_num(), m.lid, gid),
    }
    .with_lean(lean);
    Ok(Prepared {
        flavor,
        device: m.device.clone(),
        gid_index: m.gid_index,
        mtu: m.active_mtu.bytes(),
        port: m.port,
        active_mtu: m.active_mtu,
        caps,
        lean,
        qp: RealQp {
            ep: rv::OwnedQp::new(qp, send_mr, recv_mr).map_err(verr("queue pair memory"))?,
            send_cq,
            recv_cq,
            channel,
            _pd: pd,
            _ctx: ctx,
            max_inline,
            wcs: vec![rv::WorkCompletion::default(); 64],
        },
    })
}

impl Prepared {
    /// Our HELLO caps for this connection.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Whether this queue pair was prepared for the lean framing too.
    pub fn lean(&self) -> bool {
        self.lean
    }

    /// The lean framing over this queue pair, with the flavor's queue-pair sequence:
    /// RC: INIT → post receives → RTR → RTS (own psn = the lean psn of our caps);
    /// UC: RTR → RTS → post receives (the readiness byte exchange follows over TCP).
    pub fn activate_lean(self, peer: &Caps) -> Result<LeanLink<RealQp>, RdmaError> {
        if !self.lean {
            return Err(RdmaError::NotPreparedForLean);
        }
        let g = Geometry::for_flavor(self.flavor);
        debug_assert!(
            g.tx_size() <= self.qp.ep.send_mr().len() && g.rx_size() <= self.qp.ep.recv_mr().len()
        );
        match self.flavor {
            Flavor::LinuxRc => {
                let rc = self.rc_steps(peer);
                let mut link = LeanLink::new(self.qp, g);
                rc.init(link.verbs().qp())?;
                link.post_all_receives().map_err(RdmaError::PostRecv)?;
                rc.rtr_rts(link.verbs().qp())?;
                Ok(link)
            }
            Flavor::AppleUc => {
                self.uc_rtr_rts(peer)?;
                let mut link = LeanLink::new(self.qp, g);
                link.post_all_receives().map_err(RdmaError::PostRecv)?;
                Ok(link)
            }
        }
    }

    fn av(&self, peer: &Caps, dlid: u16) -> rv::AddressVector {
        rv::AddressVector::global(rv::Gid(peer.gid), self.gid_index as u8, self.port, dlid)
    }

    /// RC: INIT → post every receive → RTR → RTS (upstream order: receives before RTR, so the
    /// peer may send as soon as its own QP is ready).
    pub fn activate_rc(self, peer: &Caps) -> Result<RcLink<RealQp>, RdmaError> {
        let rc = self.rc_steps(peer);
        let mut link = RcLink::new(self.qp);
        rc.init(link.verbs().qp())?;
        link.post_all_receives().map_err(RdmaError::PostRecv)?;
        rc.rtr_rts(link.verbs().qp())?;
        Ok(link)
    }

    /// UC: RTR → RTS → post every receive (Apple's provider rejects receives before RTS).
    pub fn activate_uc(self, peer: &Caps) -> Result<UcLink<RealQp>, RdmaError> {
        self.uc_rtr_rts(peer)?;
        let mut link = UcLink::new(self.qp);
        link.post_all_receives().map_err(RdmaError::PostRecv)?;
        Ok(link)
    }

    /// UC: RTR → RTS (INIT was done at probe time); the receives are posted after it.
    fn uc_rtr_rts(&self, peer: &Caps) -> Result<(), RdmaError> {
        let av = self.av(peer, peer.lid);
        let qp = self.qp.qp();
        qp.modify_to_rtr(&rv::RtrAttr::uc(self.active_mtu, peer.qpn, 0, av))
            .map_err(verr("QP RTR"))?;
        qp.modify_to_rts(&rv::RtsAttr::uc(0))
            .map_err(verr("QP RTS"))
    }

    /// What RC's transitions need, taken before the queue pair moves into its link.
    fn rc_steps(&self, peer: &Caps) -> RcSteps {
        RcSteps {
            port: self.port,
            mtu: self.active_mtu,
            own_psn: self.caps.psn,
            peer_qpn: peer.qpn,
            peer_psn: peer.psn,
            av: self.av(peer, 0),
        }
    }
}

/// RC's transitions around posting the receives: INIT before, RTR → RTS after.
struct RcSteps {
    port: u8,
    mtu: rv::Mtu,
    own_psn: u32,
    peer_qpn: u32,
    peer_psn: u32,
    av: rv::AddressVector,
}

impl RcSteps {
    fn init(&self, qp: &rv::Qp) -> Result<(), RdmaError> {
        qp.modify_to_init(&rv::InitAttr::upstream(self.port))
            .map_err(verr("QP INIT"))
    }

    fn rtr_rts(&self, qp: &rv::Qp) -> Result<(), RdmaError> {
        qp.modify_to_rtr(&rv::RtrAttr::rc(
            self.mtu,
            self.peer_qpn,
            self.peer_psn,
            self.av,
        ))
        .map_err(verr("QP RTR"))?;
        qp.modify_to_rts(&rv::RtsAttr::rc(self.own_psn))
            .map_err(verr("QP RTS"))
    }
}
