//! `rpc-server doctor`: explains the local RDMA setup and whether RDMA would engage.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};

use rpc_transport::rdma::gid_to_string;

fn local_ip_towards(peer: &str) -> Result<(SocketAddr, IpAddr), String> {
    let with_port = if peer.parse::<IpAddr>().is_ok()
        || !peer.contains(':')
        || peer.matches(':').count() > 1 && !peer.starts_with('[')
    {
        if peer.contains(':') && !peer.starts_with('[') {
            format!("[{peer}]:50052")
        } else {
            format!("{peer}:50052")
        }
    } else {
        peer.to_string()
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {peer}: {e}"))?
        .next()
        .ok_or_else(|| format!("no address for {peer}"))?;
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().unwrap_or(addr)
    } else {
        "[::]:0".parse().unwrap_or(addr)
    };
    let s = UdpSocket::bind(bind).map_err(|e| e.to_string())?;
    s.connect(addr)
        .map_err(|e| format!("no route to {addr}: {e}"))?;
    Ok((addr, s.local_addr().map_err(|e| e.to_string())?.ip()))
}

/// Prints the report; returns whether RDMA is usable at all on this machine.
pub fn run(peer: Option<&str>) -> bool {
    println!(
        "rpc-server doctor ({} {})",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if !rdma_verbs::built_with_verbs() {
        println!("  verbs support  : not compiled in (no infiniband/verbs.h at build time; install libibverbs-dev and rebuild)");
    }
    match rdma_verbs::load() {
        Err(e) => {
            println!("  verbs library  : NOT available: {e}");
            println!("  => RDMA cannot engage here; every connection uses TCP.");
            if cfg!(target_os = "linux") {
                println!("     Install rdma-core (Debian: apt-get install rdma-core ibverbs-providers) and a NIC driver or rdma_rxe.");
            } else if cfg!(target_os = "macos") {
                println!("     macOS 26.2+ with Thunderbolt 5: boot to Recovery, run `rdma_ctl enable`, reboot.");
            }
            return false;
        }
        Ok(()) => println!("  verbs library  : loaded"),
    }
    let devices = match rdma_verbs::devices() {
        Ok(d) => d,
        Err(e) => {
            println!("  devices        : cannot list: {e}");
            return false;
        }
    };
    if devices.is_empty() {
        println!("  devices        : none (the kernel exposes no RDMA device)");
        println!("  => every connection uses TCP.");
        return false;
    }
    for d in &devices {
        println!("  device {}", d.name);
        if let Some(e) = &d.error {
            println!("    error: {e}");
        }
        for p in &d.ports {
            println!(
                "    port {}: state {:?}, link layer {:?}, active MTU {}, lid {}",
                p.port,
                p.state,
                p.link_layer,
                p.active_mtu
                    .map(|m| m.bytes().to_string())
                    .unwrap_or_else(|| "?".into()),
                p.lid
            );
            for g in &p.gids {
                println!(
                    "      gid[{:>2}] {:<40} {}",
                    g.index,
                    gid_to_string(g.gid.as_bytes()),
                    g.gid_type
                );
            }
        }
    }
    println!(
        "  An RPC connection uses RDMA when its TCP socket's local address appears above as a GID"
    );
    println!("  of an ACTIVE port (IPv4 addresses appear as ::ffff:a.b.c.d).");
    if let Some(peer) = peer {
        match local_ip_towards(peer) {
            Err(e) => println!("  peer {peer}: {e}"),
            Ok((addr, ip)) => {
                println!("  peer {addr}: this machine would use local address {ip}");
                match rdma_verbs::find_gid_for_ip(ip) {
                    Ok(Some(m)) => println!(
                        "  => RDMA can engage: device {} port {} gid[{}] ({}), port {:?}, MTU {}",
                        m.device,
                        m.port,
                        m.gid_index,
                        m.gid_type,
                        m.port_state,
                        m.active_mtu.bytes()
                    ),
                    Ok(None) => println!(
                        "  => RDMA would NOT engage: no device has a GID for {ip}. Connect over the interface that owns the RDMA device's address."
                    ),
                    Err(e) => println!("  => RDMA would NOT engage: {e}"),
                }
            }
        }
    }
    true
}
