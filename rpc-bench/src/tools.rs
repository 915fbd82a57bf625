//! The stock llama.cpp tools the benchmarks drive: where they are ([`default_bin`]), and a run
//! through `link-emu`'s counting relay with the traffic it caused ([`through_relay`]).

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rpc_proto::Major;

use crate::relay::{Relay, RelayOptions, Wire};
use crate::traffic::Traffic;

/// Default directory of the stock tools speaking `major` (`--bin`'s help), the newest TCP-only
/// build in the cache `$RPC_CACHE_DIR` (default `~/.cache/ggml-rpc-rs`) of each package.
pub fn default_bin(major: Major) -> PathBuf {
    let (var, package) = match major {
        Major::V7 => ("STOCK_BIN", "llama-cpp-python-0.3.36"),
        Major::V8 => ("STOCK_BIN8", "xllamacpp-2026.10.11549"),
    };
    if let Some(b) = std::env::var_os(var).filter(|b| !b.is_empty()) {
        return b.into();
    }
    let cache = std::env::var_os("RPC_CACHE_DIR")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/ggml-rpc-rs")
        });
    let root = cache.join(package);
    let newest = std::fs::read_dir(&root).ok().and_then(|rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("src-rdma-OFF"))
            .map(|e| e.path().join("build/bin"))
            .filter(|b| b.join("ggml-rpc-server").is_file())
            .max_by_key(|b| b.metadata().and_then(|m| m.modified()).ok())
    });
    newest.unwrap_or_else(|| root.join("src-rdma-OFF/build/bin"))
}

/// Runs `f` against one relay per server over `wire` (`f` gets the relays' addresses, in the
/// order of `servers`) and returns its result and the traffic it caused, summed over the relays;
/// with no `wire`, against the servers themselves (no traffic counted).
pub fn through_relay<T>(
    servers: &[SocketAddr],
    wire: Option<Wire>,
    f: impl FnOnce(&[SocketAddr]) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Traffic)> {
    through_relay_pairing(servers, wire, false, f)
}

/// Where [`through_relay_pairing`] puts rank 0's relay and the pairwise link's forwarder: another
/// loopback address, so that the relay can take rank 0's own port.
pub const PAIR_HOST: [u8; 4] = [127, 0, 0, 2];

/// [`through_relay`]; with `own_comm_port`, for servers whose rank 0 listens for a tensor split's
/// pairwise link (8.0's COMM_INIT) only on its own port + 1000 (our rpc-server; the stock server
/// listens on whatever port the client names): the stock client asks for the port of rank 0's
/// endpoint + 1000 and tells rank 1 that endpoint's host, so the first server's relay listens on
/// [`PAIR_HOST`] at that server's own port, and a forwarder on [`PAIR_HOST`] at that port + 1000
/// (no delay, not counted: the link is the servers' own, as a stock pair's is) carries rank 1's
/// link to the first server's host at that port + 1000 (rank 0 itself on 127.0.0.1, or an
/// emulating `rpc-bench relay --comm-link` in front of it). The first server must not be on
/// [`PAIR_HOST`].
pub fn through_relay_pairing<T>(
    servers: &[SocketAddr],
    wire: Option<Wire>,
    own_comm_port: bool,
    f: impl FnOnce(&[SocketAddr]) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Traffic)> {
    let Some(wire) = wire else {
        return Ok((f(servers)?, Traffic::default()));
    };
    let mut relays = Vec::new();
    let mut forwarder = None;
    for (i, &s) in servers.iter().enumerate() {
        if i > 0 || !own_comm_port {
            relays.push(Relay::start(s, wire, RelayOptions::default())?);
            continue;
        }
        if s.ip() == IpAddr::from(PAIR_HOST) {
            anyhow::bail!(
                "rank 0 {s}: its relay takes its port on 127.0.0.2, so it must listen elsewhere"
            );
        }
        let comm = s
            .port()
            .checked_add(rpc_proto::COMM_PORT_OFFSET)
            .ok_or_else(|| anyhow::anyhow!("rank 0 {s}: its port + 1000 is no port"))?;
        let bind = |port: u16| {
            let at = SocketAddr::from((PAIR_HOST, port));
            TcpListener::bind(at).with_context(|| format!("listening on {at}"))
        };
        relays.push(Relay::on(
            bind(s.port())?,
            s,
            wire,
            RelayOptions::default(),
        )?);
        let link = RelayOptions {
            protocol: false,
            zero_hello_caps: false,
            upstream_wait: Duration::from_secs(10),
            ..RelayOptions::default()
        };
        let rank0 = SocketAddr::new(s.ip(), comm);
        forwarder = Some(Relay::on(bind(comm)?, rank0, Wire::transparent(), link)?);
    }
    let traffic = || {
        relays
            .iter()
            .fold(Traffic::default(), |t, r| t.plus(&r.counters().snapshot()))
    };
    let before = traffic();
    let out = f(&relays.iter().map(Relay::addr).collect::<Vec<_>>())?;
    // The client has exited; let the relay threads forward the last bytes.
    std::thread::sleep(Duration::from_millis(100));
    drop(forwarder);
    Ok((out, traffic().since(&before)))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    /// With `own_comm_port`, rank 0's relay takes the server's own port on [`PAIR_HOST`] (so the
    /// client names the server's port + 1000), and what rank 1 sends to [`PAIR_HOST`] at that
    /// port + 1000 reaches rank 0's link listener on the server's address; without it, the relay
    /// is on 127.0.0.1.
    #[test]
    fn own_comm_port_relays_rank0_on_its_port_and_forwards_the_link() {
        // A "server" and its link listener (port + 1000), both on 127.0.0.1.
        let (server, link) = (0..50)
            .find_map(|_| {
                let s = TcpListener::bind("127.0.0.1:0").ok()?;
                let port = s.local_addr().ok()?.port().checked_add(1000)?;
                let l = TcpListener::bind(("127.0.0.1", port)).ok()?;
                Some((s, l))
            })
            .expect("a port P with P + 1000 free");
        let addr = server.local_addr().unwrap();
        let ((), _) = through_relay_pairing(&[addr], Some(Wire::transparent()), true, |a| {
            assert_eq!(a[0], SocketAddr::from((PAIR_HOST, addr.port())));
            let mut rank1 = TcpStream::connect(SocketAddr::from((PAIR_HOST, addr.port() + 1000)))?;
            rank1.write_all(b"caps")?;
            let (mut rank0, _) = link.accept()?;
            let mut got = [0u8; 4];
            rank0.read_exact(&mut got)?;
            assert_eq!(&got, b"caps");
            Ok(())
        })
        .unwrap();
        let ((), _) = through_relay_pairing(&[addr], Some(Wire::transparent()), false, |a| {
            assert_eq!(a[0].ip(), IpAddr::from([127, 0, 0, 1]));
            Ok(())
        })
        .unwrap();
        let on_pair_host = SocketAddr::from((PAIR_HOST, addr.port()));
        assert!(through_relay_pairing(
            &[on_pair_host],
            Some(Wire::transparent()),
            true,
            |_| Ok(())
        )
        .is_err());
    }
}
