//! Request/response round trips over our RDMA transport stack (flavor framing, `RdmaTransport`
//! and real verbs), for comparison with rdma-core's `ibv_rc_pingpong` / `ibv_uc_pingpong` on the
//! same device (benches/rdma_pingpong_vm.sh runs both inside the soft-RoCE VM).
//!
//! ```text
//! rdma_pingpong server <bind-ip:port> <rc|uc>
//! rdma_pingpong client <server-ip:port> <rc|uc> <size> <iters>
//! ```
//! The TCP connection carries the 24-byte caps each way (like HELLO) and then stays open as the
//! liveness anchor. Each iteration: the client sends `size` bytes as one message, the server
//! reads them and sends them back; prints `usec/iter` like the ibv tools.

use std::net::SocketAddr;
use std::time::Instant;

use rpc_transport::rdma::real::{prepare, RdmaOptions};
use rpc_transport::rdma::{Caps, Flavor, RdmaTransport};
use rpc_transport::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn flavor(s: &str) -> Flavor {
    match s {
        "uc" => Flavor::AppleUc,
        _ => Flavor::LinuxRc,
    }
}

async fn exchange(
    tcp: &mut TcpStream,
    flavor: Flavor,
) -> anyhow::Result<(rpc_transport::rdma::real::Prepared, Caps)> {
    let local = tcp.local_addr()?.ip();
    let prepared = prepare(local, flavor, &RdmaOptions::default())?;
    tcp.write_all(&prepared.caps().encode()).await?;
    let mut peer = [0u8; 24];
    tcp.read_exact(&mut peer).await?;
    let peer =
        Caps::decode(&peer, flavor).ok_or_else(|| anyhow::anyhow!("peer sent no RDMA caps"))?;
    Ok((prepared, peer))
}

async fn run<T: Transport>(
    mut t: T,
    server: bool,
    size: usize,
    iters: usize,
) -> anyhow::Result<()> {
    let mut buf = vec![0x5au8; size.max(1)];
    let buf = &mut buf[..size];
    if server {
        let mut hdr = [0u8; 16];
        t.read_exact(&mut hdr).await?;
        let size = u64::from_le_bytes(hdr[..8].try_into()?) as usize;
        let iters = u64::from_le_bytes(hdr[8..].try_into()?) as usize;
        let mut buf = vec![0u8; size];
        for _ in 0..iters {
            t.read_exact(&mut buf).await?;
            t.send_message(&[&buf]).await?;
        }
        return Ok(());
    }
    let mut hdr = [0u8; 16];
    hdr[..8].copy_from_slice(&(size as u64).to_le_bytes());
    hdr[8..].copy_from_slice(&(iters as u64).to_le_bytes());
    t.send_message(&[&hdr]).await?;
    let start = Instant::now();
    for _ in 0..iters {
        t.send_message(&[buf]).await?;
        t.read_exact(buf).await?;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("{size} bytes in {iters} iters: {us:.2} usec/iter");
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        anyhow::bail!("usage: rdma_pingpong server <ip:port> <rc|uc> | client <ip:port> <rc|uc> <size> <iters>");
    }
    let addr: SocketAddr = a[2].parse()?;
    let fl = flavor(&a[3]);
    let server = a[1] == "server";
    let mut tcp = if server {
        let l = TcpListener::bind(addr).await?;
        l.accept().await?.0
    } else {
        TcpStream::connect(addr).await?
    };
    tcp.set_nodelay(true)?;
    let (prepared, peer) = exchange(&mut tcp, fl).await?;
    let (size, iters) = if server {
        (0, 0)
    } else {
        (a[4].parse()?, a[5].parse()?)
    };
    match fl {
        Flavor::LinuxRc => {
            let link = prepared.activate_rc(&peer)?;
            run(
                RdmaTransport::new(link, Some(tcp), "rc"),
                server,
                size,
                iters,
            )
            .await
        }
        Flavor::AppleUc => {
            let link = prepared.activate_uc(&peer)?;
            // Readiness exchange, as upstream's Apple flavor.
            tcp.write_all(&[rpc_transport::rdma::negotiate::READY])
                .await?;
            let mut b = [0u8; 1];
            tcp.read_exact(&mut b).await?;
            run(
                RdmaTransport::new(link, Some(tcp), "uc"),
                server,
                size,
                iters,
            )
            .await
        }
    }
}
