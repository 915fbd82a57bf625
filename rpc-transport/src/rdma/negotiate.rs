//! Who speaks what after HELLO, decided from the 24-byte caps in both roles, and what the client
//! role over real verbs needs (its settings [`ClientConfig`], its connection [`ClientConn`]); the
//! client role itself is `rpc_client::negotiate_client`, the seam our clients (rpc-shim, tests,
//! benches) share.
//!
//! | client offers | server is | server answers | both speak |
//! |---|---|---|---|
//! | zero caps | any | zero caps (ours) | TCP |
//! | stock RC / UC blob | ours | stock blob of that flavor | upstream flavor |
//! | lean RC / UC blob | ours (lean on) | lean blob of that flavor | lean framing |
//! | lean RC / UC blob | ours (lean off) | stock blob of that flavor | upstream flavor |
//! | lean RC / UC blob | stock, same flavor | its stock blob | upstream flavor (RC: our psn is the lean one, the stock server took it as its `rq_psn`) |
//!
//! A stock peer never sends the marker, so it never gets the lean framing, whatever it offers.

use std::io;
use std::time::Duration;

use super::caps::{Caps, Flavor, CAPS_SIZE};
use super::lean::LeanLink;
use super::rc::RcLink;
use super::real::{RdmaOptions, RealQp};
use super::uc::UcLink;
use super::RdmaTransport;
use crate::{TcpTransport, Transport};

/// What a connection speaks after HELLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Tcp,
    /// Upstream's framing of `peer.flavor`.
    Upstream(Caps),
    /// The lean framing over `peer.flavor`'s queue-pair type.
    Lean(Caps),
}

/// The server's decision from the client's caps (`native`: the platform's flavor, for blobs that
/// fit both stock layouts; `accept_lean`: whether this server speaks the lean framing). The reply
/// then carries the lean marker exactly when the choice is [`Choice::Lean`].
pub fn server_choice(client: &[u8; CAPS_SIZE], native: Flavor, accept_lean: bool) -> Choice {
    match Caps::decode(client, native) {
        None => Choice::Tcp,
        Some(peer) if peer.lean && accept_lean => Choice::Lean(peer),
        Some(peer) => Choice::Upstream(peer),
    }
}

/// A server reply that cannot go with our offer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("the server's caps fit neither upstream layout")]
    Unreadable,
    #[error("the server answered the {answered:?} layout to a {offered:?} offer")]
    Flavor { offered: Flavor, answered: Flavor },
    #[error("the server accepted the lean framing, which we did not offer")]
    UnofferedLean,
}

/// The client's decision from the server's reply to our offer `offered`.
pub fn client_choice(offered: &Caps, reply: &[u8; CAPS_SIZE]) -> Result<Choice, Mismatch> {
    if reply.iter().all(|&b| b == 0) {
        return Ok(Choice::Tcp);
    }
    let peer = Caps::decode(reply, offered.flavor).ok_or(Mismatch::Unreadable)?;
    if peer.flavor != offered.flavor {
        return Err(Mismatch::Flavor {
            offered: offered.flavor,
            answered: peer.flavor,
        });
    }
    match (peer.lean, offered.lean) {
        (true, true) => Ok(Choice::Lean(peer)),
        (true, false) => Err(Mismatch::UnofferedLean),
        (false, _) => Ok(Choice::Upstream(peer)),
    }
}

/// Upstream's readiness byte (UC, both framings): sent and expected over TCP after activation
/// (both roles: the server's `connection/rdma.rs`, the client's `rpc_client::negotiate_client`).
pub const READY: u8 = 0x2A;

/// The client role.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Offer RDMA at all (else zero caps: TCP).
    pub rdma: bool,
    /// The flavor (caps layout and queue-pair type) offered.
    pub flavor: Flavor,
    /// Offer the lean framing (the marker); a stock server answers without it.
    pub lean: bool,
    pub opts: RdmaOptions,
    /// HELLO reply, activation and readiness exchange.
    pub timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            rdma: true,
            flavor: Flavor::native(),
            lean: true,
            opts: RdmaOptions::default(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A client connection after HELLO.
pub enum ClientConn {
    Tcp(TcpTransport),
    Rc(RdmaTransport<RcLink<RealQp>>),
    Uc(RdmaTransport<UcLink<RealQp>>),
    Lean(RdmaTransport<LeanLink<RealQp>>),
}

impl ClientConn {
    /// RDMA SENDs posted and receives completed (zero on TCP).
    pub fn rdma_counters(&self) -> (u64, u64) {
        match self {
            ClientConn::Tcp(_) => (0, 0),
            ClientConn::Rc(t) => t.counters(),
            ClientConn::Uc(t) => t.counters(),
            ClientConn::Lean(t) => t.counters(),
        }
    }
}

impl Transport for ClientConn {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientConn::Tcp(t) => t.read(buf).await,
            ClientConn::Rc(t) => t.read(buf).await,
            ClientConn::Uc(t) => t.read(buf).await,
            ClientConn::Lean(t) => t.read(buf).await,
        }
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self {
            ClientConn::Tcp(t) => t.read_exact(buf).await,
            ClientConn::Rc(t) => t.read_exact(buf).await,
            ClientConn::Uc(t) => t.read_exact(buf).await,
            ClientConn::Lean(t) => t.read_exact(buf).await,
        }
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        match self {
            ClientConn::Tcp(t) => t.send_message(parts).await,
            ClientConn::Rc(t) => t.send_message(parts).await,
            ClientConn::Uc(t) => t.send_message(parts).await,
            ClientConn::Lean(t) => t.send_message(parts).await,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            ClientConn::Tcp(t) => t.name(),
            ClientConn::Rc(t) => t.name(),
            ClientConn::Uc(t) => t.name(),
            ClientConn::Lean(t) => t.name(),
        }
    }
}

/// Transport name of a lean link.
pub fn lean_name(f: Flavor) -> &'static str {
    match f {
        Flavor::LinuxRc => "RDMA/RC+lean",
        Flavor::AppleUc => "RDMA/UC+lean",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];

    #[test]
    fn server_picks_lean_only_for_the_marker() {
        for native in [Flavor::LinuxRc, Flavor::AppleUc] {
            assert_eq!(server_choice(&[0; 24], native, true), Choice::Tcp);
            // (A stock RC QPN below 2^16 is ambiguous and follows `native`; see Caps::decode.)
            let stock_rc = Caps::rc(0x12_3456, GID);
            let stock_uc = Caps::uc(17, 0, GID);
            assert_eq!(
                server_choice(&stock_rc.encode(), native, true),
                Choice::Upstream(stock_rc)
            );
            assert_eq!(
                server_choice(&stock_uc.encode(), native, true),
                Choice::Upstream(stock_uc)
            );
            let lean_rc = Caps::rc_lean(17, GID);
            let lean_uc = Caps::uc_lean(17, 0, GID);
            assert_eq!(
                server_choice(&lean_rc.encode(), native, true),
                Choice::Lean(lean_rc)
            );
            assert_eq!(
                server_choice(&lean_uc.encode(), native, true),
                Choice::Lean(lean_uc)
            );
            // Lean off: the same flavor, upstream framing; RC keeps the client's psn (rq_psn).
            match server_choice(&lean_rc.encode(), native, false) {
                Choice::Upstream(p) => assert_eq!(
                    (p.flavor, p.psn),
                    (Flavor::LinuxRc, crate::rdma::lean_rc_psn(17))
                ),
                c => panic!("{c:?}"),
            }
            assert!(
                matches!(server_choice(&lean_uc.encode(), native, false), Choice::Upstream(p) if p.flavor == Flavor::AppleUc)
            );
        }
    }

    #[test]
    fn client_speaks_lean_only_when_the_reply_carries_the_marker() {
        let offer_rc = Caps::rc_lean(40, GID);
        let offer_uc = Caps::uc_lean(40, 0, GID);
        // Our server accepting.
        assert_eq!(
            client_choice(&offer_rc, &Caps::rc_lean(18, GID).encode()),
            Ok(Choice::Lean(Caps::rc_lean(18, GID)))
        );
        assert_eq!(
            client_choice(&offer_uc, &Caps::uc_lean(18, 0, GID).encode()),
            Ok(Choice::Lean(Caps::uc_lean(18, 0, GID)))
        );
        // A stock server (or ours with lean off) answers its stock blob: upstream framing.
        assert_eq!(
            client_choice(&offer_rc, &Caps::rc(18, GID).encode()),
            Ok(Choice::Upstream(Caps::rc(18, GID)))
        );
        assert_eq!(
            client_choice(&offer_uc, &Caps::uc(18, 0, GID).encode()),
            Ok(Choice::Upstream(Caps::uc(18, 0, GID)))
        );
        // Declined.
        assert_eq!(client_choice(&offer_rc, &[0; 24]), Ok(Choice::Tcp));
        // A lean answer to a stock offer, or the other flavor: refused.
        assert_eq!(
            client_choice(&Caps::rc(40, GID), &Caps::rc_lean(18, GID).encode()),
            Err(Mismatch::UnofferedLean)
        );
        assert!(matches!(
            client_choice(&offer_rc, &Caps::uc_lean(18, 0, GID).encode()),
            Err(Mismatch::Flavor { .. })
        ));
        assert!(matches!(
            client_choice(&offer_uc, &Caps::rc(0x12_3456, GID).encode()),
            Err(Mismatch::Flavor { .. })
        ));
    }

    #[test]
    fn mixed_peers_never_pick_lean() {
        // Every pairing of (stock | ours) client with (stock | ours) server: lean only for ours+ours.
        let gid = GID;
        for flavor in [Flavor::LinuxRc, Flavor::AppleUc] {
            let stock = match flavor {
                Flavor::LinuxRc => Caps::rc(21, gid),
                Flavor::AppleUc => Caps::uc(21, 0, gid),
            };
            let ours = stock.with_lean(true);
            // A stock server ignores the marker and answers its own stock blob.
            let stock_server_reply = match flavor {
                Flavor::LinuxRc => Caps::rc(22, gid),
                Flavor::AppleUc => Caps::uc(22, 0, gid),
            };
            for (client, client_is_ours) in [(stock, false), (ours, true)] {
                for server_is_ours in [false, true] {
                    let reply = if server_is_ours {
                        match server_choice(&client.encode(), flavor, true) {
                            Choice::Lean(_) => stock_server_reply.with_lean(true),
                            Choice::Upstream(_) => stock_server_reply,
                            Choice::Tcp => panic!("offer refused"),
                        }
                    } else {
                        stock_server_reply
                    };
                    // A stock client never looks for the marker: it always speaks upstream.
                    let lean = client_is_ours
                        && matches!(client_choice(&client, &reply.encode()), Ok(Choice::Lean(_)));
                    let server_lean = server_is_ours
                        && matches!(
                            server_choice(&client.encode(), flavor, true),
                            Choice::Lean(_)
                        );
                    assert_eq!(
                        lean,
                        client_is_ours && server_is_ours,
                        "{flavor:?} client ours={client_is_ours} server ours={server_is_ours}"
                    );
                    assert_eq!(lean, server_lean, "both ends must agree");
                }
            }
        }
    }
}
