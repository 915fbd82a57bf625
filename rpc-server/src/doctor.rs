//! `rpc-server doctor`: which protocol major each port speaks (and which one a running server's
//! port answers with, `--probe`), the local RDMA setup and whether RDMA would engage.

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

/// The protocol part of `doctor`: what each port speaks, what the version-mismatch abort means,
/// and, with `probe`, the version a running server's port announces.
pub fn protocols(probe: Option<&str>) {
    println!("rpc-server doctor: protocols");
    println!("  -p PORT            : 8.0.0, llama.cpp built since October 2026 (b11549 speaks it; b11434 does not)");
    println!("  --proto7-port PORT : 7.0.0, llama.cpp built before (llama-cpp-python 0.3.x, b11434 and older)");
    println!("  A llama.cpp that stops at its first connection with");
    println!("    RPC server version mismatch: 7.0.0   (or 8.0.0)");
    println!("    .../ggml-rpc.cpp:NNN: RPC handshake failed for HOST:PORT");
    println!("  reached the port of the other major (both sides send the same HELLO, so a server");
    println!("  cannot tell them apart before it answers). Point it at the port of its major, or");
    println!("  start the server with the other port (e.g. -p 50052 --proto7-port 50053).");
    if let Some(p) = probe {
        match probe_version(p) {
            Ok((a, b, c)) => {
                let who = match a {
                    8 => "llama.cpp built since October 2026",
                    7 => "llama.cpp built before October 2026",
                    _ => "no llama.cpp this server knows",
                };
                println!("  {p} speaks {a}.{b}.{c}: for {who}");
            }
            Err(e) => println!("  {p}: no answer to HELLO ({e})"),
        }
    }
    println!();
}

/// Sends HELLO to `addr` and reads the announced version (5 s deadlines).
fn probe_version(addr: &str) -> Result<(u8, u8, u8), String> {
    use std::io::{Read, Write};
    let to = std::time::Duration::from_secs(5);
    let sa = addr
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = std::net::TcpStream::connect_timeout(&sa, to).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(to)).map_err(|e| e.to_string())?;
    let mut req = Vec::new();
    rpc_proto::Request::Hello {
        caps: [0; rpc_proto::CONN_CAPS_SIZE],
    }
    .encode(&mut req);
    s.write_all(&req).map_err(|e| e.to_string())?;
    let mut head = [0u8; rpc_proto::RESPONSE_HEADER_SIZE];
    s.read_exact(&mut head).map_err(|e| e.to_string())?;
    let n = rpc_proto::Response::check_header(rpc_proto::Command::Hello, &head, 0)
        .map_err(|e| e.to_string())?;
    let mut payload = vec![0u8; n as usize];
    s.read_exact(&mut payload).map_err(|e| e.to_string())?;
    match rpc_proto::Response::decode(rpc_proto::Command::Hello, &payload) {
        Ok(rpc_proto::Response::Hello {
            major,
            minor,
            patch,
            ..
        }) => Ok((major, minor, patch)),
        Ok(_) => Err("not a HELLO reply".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The systems whose advice differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
    Other,
}

impl Os {
    /// The system this binary was built for.
    pub fn this() -> Os {
        if cfg!(target_os = "macos") {
            Os::MacOs
        } else if cfg!(target_os = "linux") {
            Os::Linux
        } else {
            Os::Other
        }
    }
}

/// What keeps RDMA from engaging, in the order `doctor` finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Built without `infiniband/verbs.h`: the verbs layer is a stub.
    NotCompiledIn,
    /// The verbs library cannot be loaded at run time.
    NoLibrary,
    /// The library loads but lists no device.
    NoDevices,
    /// Devices exist but no port is ACTIVE.
    NoActivePort,
    /// The address used towards the peer is no device's GID.
    NoGidForAddress,
}

/// What to do about `p` on `os`: one table, so that each system gets its own advice.
pub fn advice(os: Os, p: Problem) -> &'static str {
    use Problem::*;
    match (os, p) {
        (Os::MacOs, NotCompiledIn) => "the SDK had no infiniband/verbs.h at build time (it ships with the macOS 26.2 SDK): update the Command Line Tools (softwareupdate --list, or xcode-select --install) and rebuild (scripts/run-server.sh)",
        (Os::MacOs, NoLibrary) => "librdma.dylib is missing: RDMA over Thunderbolt needs macOS 26.2 or later on an Apple-silicon Mac with Thunderbolt 5",
        (Os::MacOs, NoDevices) => "RDMA is not enabled: boot to Recovery, open Terminal, run `rdma_ctl enable`, reboot (`rdma_ctl status` shows it; it cannot be done remotely). Thunderbolt 4 Macs never list a device, and on a Mac Studio the Thunderbolt 5 port next to Ethernet cannot do RDMA",
        (Os::MacOs, NoActivePort) => "a port is ACTIVE only when the Mac at the other end of the cable has RDMA enabled too: run `rdma_ctl status` there, check the cable (Thunderbolt 5), and keep both Macs on the same macOS version",
        (Os::MacOs, NoGidForAddress) => "use the address of the Thunderbolt interface enN paired with the device rdma_enN (e.g. `ifconfig en2`), not the Thunderbolt Bridge (bridge0): clients connect to that address, and the server listens on it or on 0.0.0.0. The IPv4 GID appears only once enN has an IPv4 address (a self-assigned 169.254.x.x one can take minutes after boot or re-cabling)",
        (_, NotCompiledIn) => "built without infiniband/verbs.h: install the verbs headers (Debian/Ubuntu: apt-get install libibverbs-dev; Fedora: rdma-core-devel) and rebuild",
        (_, NoLibrary) => "install rdma-core (Debian/Ubuntu: apt-get install rdma-core ibverbs-providers) and a NIC driver or soft-RoCE (rdma_rxe)",
        (_, NoDevices) => "load the NIC's RDMA driver (e.g. mlx5_ib) or create a soft-RoCE device: rdma link add rxe0 type rxe netdev eth0",
        (_, NoActivePort) => "no port is ACTIVE: check the link (cable, switch port, `ibv_devinfo`); a soft-RoCE port follows its Ethernet interface's state",
        (_, NoGidForAddress) => "connect over the interface that owns the RDMA device's address (its GIDs are listed above)",
    }
}

/// Prints the report; returns whether RDMA is usable at all on this machine.
pub fn run(peer: Option<&str>) -> bool {
    let os = Os::this();
    println!(
        "rpc-server doctor ({} {})",
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if !rdma_verbs::built_with_verbs() {
        println!("  verbs support  : not compiled in");
        println!("  => {}", advice(os, Problem::NotCompiledIn));
    }
    match rdma_verbs::load() {
        Err(e) => {
            println!("  verbs library  : NOT available: {e}");
            println!("  => RDMA cannot engage here; every connection uses TCP.");
            println!("     {}", advice(os, Problem::NoLibrary));
            return false;
        }
        Ok(()) => println!(
            "  verbs library  : loaded ({} entry points; {})",
            rdma_verbs::symbols_loaded(),
            match rdma_verbs::symbol_set() {
                rdma_verbs::SymbolSet::Apple =>
                    "Apple's set: only what upstream's Apple transport calls",
                rdma_verbs::SymbolSet::Full => "full set",
            }
        ),
    }
    let devices = match rdma_verbs::devices() {
        Ok(d) => d,
        Err(e) => {
            println!("  devices        : cannot list: {e}");
            return false;
        }
    };
    if devices.is_empty() {
        println!("  devices        : none");
        println!("  => every connection uses TCP.");
        println!("     {}", advice(os, Problem::NoDevices));
        return false;
    }
    #[cfg(target_os = "linux")]
    if rpc_contain::namespaces::rdma_netns_exclusive() {
        println!("  netns mode     : exclusive: contained sessions (the default) run in network namespaces of their own, which see no RDMA device, so their clients stay on TCP");
        println!("  => `rdma system set netns shared` (the kernel's default), or serve with --no-sandbox");
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
    let active = devices.iter().any(|d| {
        d.ports.iter().any(|p| {
            matches!(
                p.state,
                rdma_verbs::PortState::Active | rdma_verbs::PortState::ActiveDefer
            )
        })
    });
    if !active {
        println!("  => {}", advice(os, Problem::NoActivePort));
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
                        "  => RDMA would NOT engage: no device has a GID for {ip}. {}",
                        advice(os, Problem::NoGidForAddress)
                    ),
                    Err(e) => println!("  => RDMA would NOT engage: {e}"),
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Problem; 5] = [
        Problem::NotCompiledIn,
        Problem::NoLibrary,
        Problem::NoDevices,
        Problem::NoActivePort,
        Problem::NoGidForAddress,
    ];

    #[test]
    fn a_mac_gets_mac_advice_and_linux_linux_advice() {
        for p in ALL {
            let mac = advice(Os::MacOs, p);
            let linux = advice(Os::Linux, p);
            assert_ne!(mac, linux, "{p:?}: the same advice on both systems");
            for apt in ["apt-get", "libibverbs-dev", "rdma_rxe", "rdma link"] {
                assert!(
                    !mac.contains(apt),
                    "{p:?}: macOS advice mentions {apt}: {mac}"
                );
            }
            for mac_only in ["rdma_ctl", "Thunderbolt", "librdma"] {
                assert!(
                    !linux.contains(mac_only),
                    "{p:?}: Linux advice mentions {mac_only}"
                );
            }
        }
        assert!(advice(Os::MacOs, Problem::NoDevices).contains("rdma_ctl enable"));
        assert!(advice(Os::MacOs, Problem::NoGidForAddress).contains("bridge0"));
        assert!(advice(Os::MacOs, Problem::NotCompiledIn).contains("26.2"));
        assert!(advice(Os::Linux, Problem::NotCompiledIn).contains("libibverbs-dev"));
    }
}
