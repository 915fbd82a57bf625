//! A benchmark connection to a ggml RPC server: [`rpc_client::Client`] over TCP, or over RDMA
//! negotiated in HELLO by [`rpc_client::negotiate_client`] (the client role the shim uses too).

use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

use rpc_client::{negotiate_client, Client};
use rpc_transport::rdma::negotiate::{ClientConfig, ClientConn};
use tokio::net::TcpStream;

/// A server to measure: `[LABEL=]HOST:PORT`; `e2e` also takes `[LABEL=]HOST:PORT,HOST:PORT,...`,
/// several servers of one llama.cpp run (`--rpc A,B`, e.g. for `--split-mode tensor`).
#[derive(Debug, Clone)]
pub struct Target {
    /// Name in tables and charts (default: the address).
    pub label: String,
    /// The servers of the run (resolved, the first address of each), in `--rpc` order; at least
    /// one.
    pub addrs: Vec<SocketAddr>,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (label, hostports) = match s.split_once('=') {
            Some((l, h)) => (l.to_string(), h),
            None => (s.to_string(), s),
        };
        let addrs = hostports.split(',').map(|hostport| {
            hostport
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {hostport:?}: {e}"))?
                .next()
                .ok_or_else(|| format!("{hostport:?} resolves to no address"))
        });
        let addrs = addrs.collect::<Result<_, _>>()?;
        Ok(Target { label, addrs })
    }
}

/// The protocol major `addr` announces in its HELLO reply (one short connection). Waits as long
/// as it takes (a note after 10 s): a stock server serves one connection at a time and dies of
/// SIGPIPE when a client leaves before its reply, so the request is never abandoned.
pub fn server_major(addr: SocketAddr) -> anyhow::Result<rpc_proto::Major> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let hello = Client::connect(addr);
        tokio::pin!(hello);
        let c = tokio::select! {
            c = &mut hello => c?,
            _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {
                eprintln!(
                    "{addr}: no HELLO reply after 10 s, still waiting (a stock server serves one \
                     connection at a time: is another client connected to it?)"
                );
                hello.await?
            }
        };
        let major = c.major();
        c.shutdown().await?;
        Ok(major)
    })
}

/// A connection the benchmark drives: TCP, or RDMA in upstream's flavor.
pub type BenchConn = Client<ClientConn>;

/// Connects over TCP (HELLO with zero caps), or with `rdma` negotiates RDMA in HELLO and fails
/// if it does not engage (unless `tcp_fallback`, `--transport auto`).
pub async fn connect(
    addr: SocketAddr,
    rdma: Option<&ClientConfig>,
    tcp_fallback: bool,
) -> anyhow::Result<BenchConn> {
    let Some(cfg) = rdma else {
        return Ok(Client::connect(addr).await?.map_transport(ClientConn::Tcp));
    };
    let n = negotiate_client(TcpStream::connect(addr).await?, cfg).await?;
    match n.why_tcp {
        Some(why) if !tcp_fallback => anyhow::bail!(
            "RDMA did not engage with {addr}: {why} (without RDMA on this machine nothing is offered; \
             a server declines with zero caps when it has no RDMA device for that address, runs with \
             --transport tcp, has its RDMA budget used up, or was built without RDMA)"
        ),
        _ => Ok(n.client),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets() {
        let tg: Target = "ours=127.0.0.1:5".parse().unwrap();
        assert_eq!((tg.label.as_str(), tg.addrs[0].port()), ("ours", 5));
        let tg: Target = "127.0.0.1:6".parse().unwrap();
        assert_eq!(tg.label, "127.0.0.1:6");
        assert_eq!(tg.addrs.len(), 1);
        let tg: Target = "pair=127.0.0.1:7,127.0.0.1:8".parse().unwrap();
        assert_eq!(tg.label, "pair");
        let ports: Vec<u16> = tg.addrs.iter().map(|a| a.port()).collect();
        assert_eq!(ports, [7, 8]);
        assert!("x=127.0.0.1:7,".parse::<Target>().is_err());
    }
}
