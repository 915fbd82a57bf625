//! Ping-pong of one message each way over the blocking driver of tensor split's server-to-server
//! link (`rdma::blocking::BlockingLink`) on real verbs, in any framing, for comparison with
//! rdma-core's `ibv_rc_pingpong` of the same bytes on the same device: what the link's framing and
//! driver cost over the wire itself (`rpc-bench/vm/allreduce-rdma.sh` runs both in the VM).
//!
//! ```text
//! link_pingpong server <bind-ip:port> <rc|uc|lean-rc|lean-uc>
//! link_pingpong client <server-ip:port> <rc|uc|lean-rc|lean-uc> <size> <iters>
//! ```
//! A TCP connection carries the 24-byte caps each way and one ready byte each way after
//! activation, then stays open as the liveness anchor. Each iteration: the client (rank 0 of the
//! link) sends `size` bytes and reads as many back, the server (rank 1) reads then sends, as an
//! allreduce does. Prints `usec/iter` like the ibv tools.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rpc_transport::rdma::blocking::BlockingLink;
use rpc_transport::rdma::real::{prepare_with, RdmaOptions};
use rpc_transport::rdma::{Caps, Flavor, Flavored};

fn mode(s: &str) -> (Flavor, bool) {
    match s {
        "uc" => (Flavor::AppleUc, false),
        "lean-rc" => (Flavor::LinuxRc, true),
        "lean-uc" => (Flavor::AppleUc, true),
        _ => (Flavor::LinuxRc, false),
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn run<F: Flavored>(
    link: F,
    tcp: TcpStream,
    client: bool,
    size: usize,
    iters: usize,
) -> anyhow::Result<()> {
    let mut l = BlockingLink::new(link, Some(tcp), "link")?;
    let mut out = vec![0x5au8; size];
    let mut back = vec![0u8; size];
    let mut round = |l: &mut BlockingLink<F>| -> anyhow::Result<()> {
        if client {
            l.send(&out, deadline())?;
            l.recv_exact(&mut back, deadline())?;
        } else {
            l.recv_exact(&mut back, deadline())?;
            out.copy_from_slice(&back);
            l.send(&out, deadline())?;
        }
        Ok(())
    };
    // One round trip first, not measured.
    round(&mut l)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        round(&mut l)?;
    }
    let dt = t0.elapsed();
    if client {
        let (sends, recvs) = l.counters();
        println!(
            "{size} bytes, {iters} iters: {:.2} usec/iter ({sends} SENDs, {recvs} receives)",
            dt.as_secs_f64() * 1e6 / iters.max(1) as f64
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "link_pingpong server <ip:port> <rc|uc|lean-rc|lean-uc> | client <ip:port> <mode> <size> <iters>";
    let (role, addr, m) = match (args.get(1), args.get(2), args.get(3)) {
        (Some(r), Some(a), Some(m)) => (r.as_str(), a.parse::<SocketAddr>()?, m.as_str()),
        _ => anyhow::bail!("{usage}"),
    };
    let client = role == "client";
    let (flavor, lean) = mode(m);
    let mut tcp = if client {
        TcpStream::connect(addr)?
    } else {
        TcpListener::bind(addr)?.accept()?.0
    };
    tcp.set_nodelay(true)?;
    let (size, iters) = if client {
        let size: usize = args
            .get(4)
            .ok_or_else(|| anyhow::anyhow!("{usage}"))?
            .parse()?;
        let iters: usize = args
            .get(5)
            .ok_or_else(|| anyhow::anyhow!("{usage}"))?
            .parse()?;
        tcp.write_all(&(size as u64).to_le_bytes())?;
        tcp.write_all(&(iters as u64).to_le_bytes())?;
        (size, iters)
    } else {
        let mut b = [0u8; 16];
        tcp.read_exact(&mut b)?;
        (
            u64::from_le_bytes(b[..8].try_into()?) as usize,
            u64::from_le_bytes(b[8..].try_into()?) as usize,
        )
    };
    let prepared = prepare_with(
        tcp.local_addr()?.ip(),
        flavor,
        &RdmaOptions::default(),
        lean,
    )?;
    tcp.write_all(&prepared.caps().encode())?;
    let mut peer = [0u8; 24];
    tcp.read_exact(&mut peer)?;
    let peer =
        Caps::decode(&peer, flavor).ok_or_else(|| anyhow::anyhow!("peer sent no RDMA caps"))?;
    let ready = |tcp: &mut TcpStream| -> anyhow::Result<()> {
        tcp.write_all(&[1])?;
        let mut b = [0u8; 1];
        tcp.read_exact(&mut b)?;
        Ok(())
    };
    match (lean, flavor) {
        (true, _) => {
            let l = prepared.activate_lean(&peer)?;
            ready(&mut tcp)?;
            run(l, tcp, client, size, iters)
        }
        (false, Flavor::LinuxRc) => {
            let l = prepared.activate_rc(&peer)?;
            ready(&mut tcp)?;
            run(l, tcp, client, size, iters)
        }
        (false, Flavor::AppleUc) => {
            let l = prepared.activate_uc(&peer)?;
            ready(&mut tcp)?;
            run(l, tcp, client, size, iters)
        }
    }
}
