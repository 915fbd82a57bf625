//! The client role of the transport negotiation inside HELLO, over real verbs: prepare a queue
//! pair, offer its caps (with the lean marker) in HELLO through a [`Client`], and activate
//! whatever the server's reply says (lean framing, upstream's flavor, or TCP).
//!
//! The decisions themselves (who speaks what from the caps) are `rpc_transport::rdma::negotiate`;
//! this is the one place that drives them as a client (rpc-shim, rpc-bench, tests).

use std::io;
use std::time::Duration;

use rpc_transport::rdma::negotiate::{
    client_choice, lean_name, Choice, ClientConfig, ClientConn, READY,
};
use rpc_transport::rdma::real::{self, RealQp};
use rpc_transport::rdma::{Flavor, LeanLink, RdmaTransport, UcLink};
use rpc_transport::{TcpTransport, Transport};
use tokio::net::TcpStream;

use crate::client::{Client, Result};
use crate::error::ClientError;

/// The outcome of [`negotiate_client`]: a client after HELLO, over RDMA or TCP.
pub struct Negotiated {
    /// The connection, HELLO done (version and caps of the server kept).
    pub client: Client<ClientConn>,
    /// Why the connection is on TCP (`None` on RDMA).
    pub why_tcp: Option<String>,
}

fn other(msg: impl Into<String>) -> ClientError {
    ClientError::Io(io::Error::other(msg.into()))
}

async fn bounded<T>(
    t: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(t, f).await {
        Ok(r) => r,
        Err(_) => Err(ClientError::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no answer within {} s", t.as_secs_f64()),
        ))),
    }
}

/// Upstream's readiness exchange (UC): our byte out, theirs in, over TCP.
async fn readiness(tcp: &mut TcpTransport, ours: u8) -> Result<u8> {
    tcp.send_message(&[&[ours]]).await?;
    let mut b = [0u8; 1];
    tcp.read_exact(&mut b).await?;
    Ok(b[0])
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| other(e.to_string()))
}

/// The connection after activation: the TCP socket stays open, idle, as the liveness anchor of
/// the RDMA connection `wrap` makes.
fn on_rdma(
    hello: Client<TcpTransport>,
    wrap: impl FnOnce(TcpStream) -> ClientConn,
) -> Result<Negotiated> {
    Ok(Negotiated {
        client: hello.try_map_transport(|tcp| tcp.into_stream().map(wrap))?,
        why_tcp: None,
    })
}

enum ClientUc {
    Lean(LeanLink<RealQp>),
    Upstream(UcLink<RealQp>),
}

/// Connects the client role on a fresh TCP stream: prepares a queue pair for `cfg.flavor` (with
/// the lean marker when `cfg.lean`), sends HELLO (checking the server's version), and activates
/// whatever the reply says (lean, upstream framing, or TCP; UC with the readiness byte exchange).
/// HELLO, activation and the readiness exchange each get `cfg.timeout`. An `Err` means the
/// connection is unusable (e.g. an RC server switched and our activation failed): reconnect on
/// TCP.
pub async fn negotiate_client(stream: TcpStream, cfg: &ClientConfig) -> Result<Negotiated> {
    let t = cfg.timeout;
    let local_ip = stream.local_addr()?.ip();
    let mut hello = Client::new(TcpTransport::new(stream)?);
    let tcp = |hello: Client<TcpTransport>, why: String| Negotiated {
        client: hello.map_transport(ClientConn::Tcp),
        why_tcp: Some(why),
    };
    let prepared = if cfg.rdma {
        let (flavor, opts, lean) = (cfg.flavor, cfg.opts.clone(), cfg.lean);
        blocking(move || real::prepare_with(local_ip, flavor, &opts, lean))
            .await?
            .map_err(|e| e.to_string())
    } else {
        Err("RDMA not offered".to_string())
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(why) => {
            bounded(t, "HELLO", hello.hello()).await?;
            return Ok(tcp(hello, why));
        }
    };
    let ours = prepared.caps();
    bounded(t, "HELLO", hello.hello_with_caps(ours.encode())).await?;
    let choice = client_choice(&ours, hello.server_caps())
        .map_err(|e| other(format!("RDMA negotiation: {e}")))?;
    let (peer, lean) = match choice {
        Choice::Tcp => return Ok(tcp(hello, "the server answered zero caps".into())),
        Choice::Upstream(p) => (p, false),
        Choice::Lean(p) => (p, true),
    };
    match (cfg.flavor, lean) {
        (Flavor::LinuxRc, false) => {
            // The server has switched: no way back to TCP on this connection.
            let link = blocking(move || prepared.activate_rc(&peer))
                .await?
                .map_err(|e| other(format!("RC activation: {e}")))?;
            on_rdma(hello, |anchor| {
                ClientConn::Rc(RdmaTransport::new(link, Some(anchor), "RDMA/RC"))
            })
        }
        (Flavor::LinuxRc, true) => {
            let link = blocking(move || prepared.activate_lean(&peer))
                .await?
                .map_err(|e| other(format!("RC activation: {e}")))?;
            on_rdma(hello, |anchor| {
                let name = lean_name(Flavor::LinuxRc);
                ClientConn::Lean(RdmaTransport::new(link, Some(anchor), name))
            })
        }
        (Flavor::AppleUc, lean) => {
            let activated = if lean {
                blocking(move || prepared.activate_lean(&peer).map(ClientUc::Lean)).await?
            } else {
                blocking(move || prepared.activate_uc(&peer).map(ClientUc::Upstream)).await?
            };
            let byte = if activated.is_ok() { READY } else { 0 };
            let theirs = bounded(
                t,
                "RDMA readiness byte",
                readiness(hello.transport_mut(), byte),
            )
            .await?;
            match activated {
                Ok(link) if theirs == READY => on_rdma(hello, |anchor| match link {
                    ClientUc::Lean(l) => ClientConn::Lean(RdmaTransport::new(
                        l,
                        Some(anchor),
                        lean_name(Flavor::AppleUc),
                    )),
                    ClientUc::Upstream(l) => {
                        ClientConn::Uc(RdmaTransport::new(l, Some(anchor), "RDMA/UC"))
                    }
                }),
                Ok(_) => Ok(tcp(
                    hello,
                    format!("the server could not activate (readiness byte {theirs:#04x})"),
                )),
                Err(e) => Ok(tcp(hello, format!("activation failed: {e}"))),
            }
        }
    }
}
