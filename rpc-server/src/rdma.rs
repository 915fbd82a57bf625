//! RDMA negotiation inside HELLO, compatible with upstream's two flavors.
//!
//! The decision is made **before** the HELLO reply: we read the client's caps, and only if our
//! side can fully activate (device found for the socket's local address, queue pair created and
//! moved to RTS, receives posted, budget available) do we answer with our caps. Otherwise we
//! answer all-zero caps and the client stays on TCP: no one-sided activation, no hang.
//!
//! A client that is ours offers the lean framing with a marker in its caps (see
//! `rpc_transport::rdma::caps`); we accept it by answering our caps with the marker. Stock
//! clients never send the marker and get upstream's framing of their flavor, byte for byte.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rpc_transport::rdma::negotiate::{server_choice, Choice};
use rpc_transport::rdma::real::{self, RdmaOptions, RealQp};
use rpc_transport::rdma::{gid_to_string, Flavor, LeanLink, RcLink, UcLink};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use rpc_transport::cli::TransportMode;

/// Server-wide RDMA settings and counters.
pub struct RdmaConfig {
    pub mode: TransportMode,
    pub opts: RdmaOptions,
    budget: Arc<Semaphore>,
    pub max_connections: usize,
    /// Accept the lean framing from clients that offer it: [`RdmaConfig::with_lean`], from
    /// `ServerOptions::rdma_lean` (`RPC_RDMA_LEAN=0` turns it off); `true` from
    /// [`RdmaConfig::new`].
    pub lean: bool,
    pub activated: AtomicU64,
    pub lean_activated: AtomicU64,
    pub sends: AtomicU64,
    pub recvs: AtomicU64,
    /// Activations per kind, in [`ACTIVATIONS`] order.
    activations: [AtomicU64; ACTIVATIONS.len()],
    /// Clients that offered RDMA and stayed on TCP, per [`Fallback`].
    fallbacks: [AtomicU64; FALLBACKS.len()],
}

/// Kinds of RDMA activation, as the metrics label them.
pub const ACTIVATIONS: [&str; 4] = ["rc", "uc", "rc_lean", "uc_lean"];

/// Why a client that offered RDMA stayed on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Its caps fit neither upstream layout.
    UnknownCaps,
    /// `--rdma-max-connections` RDMA connections were open.
    Budget,
    /// No device owns the connection's address, or the queue pair could not be prepared.
    NoDevice,
    /// The queue pair could not be moved to RTS with the client's parameters.
    ActivationFailed,
    /// The client could not activate its side (upstream's UC readiness byte).
    ClientNotReady,
}

/// [`Fallback`] labels, in its order.
pub const FALLBACKS: [&str; 5] = [
    "unknown_caps",
    "budget",
    "no_device",
    "activation_failed",
    "client_not_ready",
];

impl std::fmt::Debug for RdmaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConfig")
            .field("mode", &self.mode)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// Default `--rdma-max-connections`: Apple's Thunderbolt devices allow 10 queue pairs each,
/// shared by every process, so 8 with Apple's verbs; 64 elsewhere.
pub fn default_max_connections() -> usize {
    if rdma_verbs::symbol_set() == rdma_verbs::SymbolSet::Apple {
        8
    } else {
        64
    }
}

impl RdmaConfig {
    pub fn new(mode: TransportMode, opts: RdmaOptions, max_connections: usize) -> RdmaConfig {
        RdmaConfig {
            mode,
            opts,
            budget: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            lean: true,
            activated: AtomicU64::new(0),
            lean_activated: AtomicU64::new(0),
            sends: AtomicU64::new(0),
            recvs: AtomicU64::new(0),
            activations: Default::default(),
            fallbacks: Default::default(),
        }
    }

    /// This configuration accepting the lean framing (`lean`) or not (upstream's framing of
    /// their flavor for every client).
    pub fn with_lean(self, lean: bool) -> RdmaConfig {
        RdmaConfig { lean, ..self }
    }

    /// Whether a client's HELLO offers RDMA this server may engage: its session process must then
    /// answer the HELLO (the queue pair is that process's); a TCP client's HELLO the front answers.
    pub fn engages(&self, caps: &[u8; rpc_proto::CONN_CAPS_SIZE]) -> bool {
        caps.iter().any(|&b| b != 0) && self.mode != TransportMode::Tcp
    }

    /// Counts a client that offered RDMA and stays on TCP.
    pub fn fallback(&self, why: Fallback) {
        self.fallbacks[why as usize].fetch_add(1, Relaxed);
    }

    /// `(kind, count)` per [`ACTIVATIONS`] kind.
    pub fn activations(&self) -> Vec<(&'static str, u64)> {
        ACTIVATIONS
            .iter()
            .zip(&self.activations)
            .map(|(k, n)| (*k, n.load(Relaxed)))
            .collect()
    }

    /// `(reason, count)` per [`FALLBACKS`] reason.
    pub fn fallbacks(&self) -> Vec<(&'static str, u64)> {
        FALLBACKS
            .iter()
            .zip(&self.fallbacks)
            .map(|(k, n)| (*k, n.load(Relaxed)))
            .collect()
    }

    /// One line for the banner: what this machine can do.
    pub fn describe(&self) -> String {
        match self.mode {
            TransportMode::Tcp => "TCP (RDMA disabled by --transport tcp)".into(),
            _ => match rdma_verbs::load() {
                Err(e) => format!("TCP (no RDMA: {e})"),
                Ok(()) => match rdma_verbs::devices() {
                    Ok(d) if !d.is_empty() => format!(
                        "TCP + RDMA auto-negotiated in HELLO (Linux RC and Apple UC flavors{}; devices: {}; up to {} RDMA connections{})",
                        if self.lean { ", lean framing for our clients" } else { "" },
                        d.iter().map(|d| d.name.clone()).collect::<Vec<_>>().join(", "),
                        self.max_connections,
                        match rdma_verbs::symbol_set() {
                            rdma_verbs::SymbolSet::Apple => format!(
                                "; Apple's verbs: {} entry points, idle connections poll",
                                rdma_verbs::symbols_loaded()
                            ),
                            rdma_verbs::SymbolSet::Full => String::new(),
                        }
                    ),
                    _ => "TCP (RDMA library present, no RDMA device)".into(),
                },
            },
        }
    }

    /// Every counter, in a fixed order (reported by a session process, see `child/front_line.rs`).
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        [
            &self.activated,
            &self.lean_activated,
            &self.sends,
            &self.recvs,
        ]
        .into_iter()
        .chain(&self.activations)
        .chain(&self.fallbacks)
    }

    /// One of the `--rdma-max-connections` places, held by a session process's connection.
    pub fn try_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.budget.clone().try_acquire_owned().ok()
    }

    pub fn record(&self, (sends, recvs): (u64, u64)) {
        self.sends.fetch_add(sends, Relaxed);
        self.recvs.fetch_add(recvs, Relaxed);
    }
}

/// An activated RDMA link, holding its slot of the budget.
pub enum Activated {
    Rc(RcLink<RealQp>, OwnedSemaphorePermit),
    Uc(UcLink<RealQp>, OwnedSemaphorePermit),
    /// Our lean framing over the flavor's queue-pair type (UC: the readiness byte follows).
    Lean(LeanLink<RealQp>, Flavor, OwnedSemaphorePermit),
}

/// Decides the transport for a connection from the client's HELLO caps. Returns our reply caps
/// (all zero = TCP) and the activated link, if any.
pub fn negotiate(
    cfg: &RdmaConfig,
    local_ip: IpAddr,
    client: &[u8; rpc_proto::CONN_CAPS_SIZE],
) -> ([u8; rpc_proto::CONN_CAPS_SIZE], Option<Activated>) {
    if cfg.mode == TransportMode::Tcp {
        return ([0; rpc_proto::CONN_CAPS_SIZE], None);
    }
    let (peer, lean) = match server_choice(client, Flavor::native(), cfg.lean) {
        Choice::Tcp => {
            if client.iter().any(|&b| b != 0) {
                tracing::warn!("client caps fit neither upstream RDMA layout; staying on TCP");
                cfg.fallback(Fallback::UnknownCaps);
            }
            return ([0; rpc_proto::CONN_CAPS_SIZE], None);
        }
        Choice::Upstream(peer) => (peer, false),
        Choice::Lean(peer) => (peer, true),
    };
    let Ok(permit) = cfg.budget.clone().try_acquire_owned() else {
        tracing::info!(
            max = cfg.max_connections,
            "RDMA connection budget used up; this client stays on TCP"
        );
        cfg.fallback(Fallback::Budget);
        return ([0; rpc_proto::CONN_CAPS_SIZE], None);
    };
    let prepared = match real::prepare_with(local_ip, peer.flavor, &cfg.opts, lean) {
        Ok(p) => p,
        Err(e) => {
            tracing::info!("RDMA cannot engage ({e}); staying on TCP");
            cfg.fallback(Fallback::NoDevice);
            return ([0; rpc_proto::CONN_CAPS_SIZE], None);
        }
    };
    let ours = prepared.caps();
    tracing::info!(
        "RDMA probed: flavor={}{} dev={} gid_index={} mtu={} qpn={} peer qpn={} peer gid={}",
        peer.flavor.name(),
        if lean {
            " +lean"
        } else if peer.lean {
            " (lean offered, declined)"
        } else {
            ""
        },
        prepared.device,
        prepared.gid_index,
        prepared.mtu,
        ours.qpn,
        peer.qpn,
        gid_to_string(&peer.gid)
    );
    let activated = match (peer.flavor, lean) {
        (flavor, true) => prepared
            .activate_lean(&peer)
            .map(|l| Activated::Lean(l, flavor, permit)),
        (Flavor::LinuxRc, false) => prepared
            .activate_rc(&peer)
            .map(|l| Activated::Rc(l, permit)),
        (Flavor::AppleUc, false) => prepared
            .activate_uc(&peer)
            .map(|l| Activated::Uc(l, permit)),
    };
    match activated {
        Ok(a) => {
            cfg.activated.fetch_add(1, Relaxed);
            if lean {
                cfg.lean_activated.fetch_add(1, Relaxed);
            }
            let kind = usize::from(peer.flavor == Flavor::AppleUc) + 2 * usize::from(lean);
            cfg.activations[kind].fetch_add(1, Relaxed);
            (ours.encode(), Some(a))
        }
        Err(e) => {
            tracing::warn!("RDMA activation failed ({e}); staying on TCP");
            cfg.fallback(Fallback::ActivationFailed);
            ([0; rpc_proto::CONN_CAPS_SIZE], None)
        }
    }
}
