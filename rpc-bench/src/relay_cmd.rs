//! `rpc-bench relay`: one emulating relay as a process of its own, for topologies `e2e` does not
//! build itself: e.g. an emulated link between `rpc-shim --one-endpoint` and each of its workers
//! (the client ↔ shim hop stays loopback), with the workers' own server-to-server link over an
//! emulated link too (`--comm-link`). The relay is [`link_emu::relay`]'s, as every other
//! subcommand uses it; this only binds it where it is told and reports its counters.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use rpc_proto::COMM_PORT_OFFSET;

use crate::links::{self, LinkKind, LinkProfile};
use crate::relay::{Relay, RelayOptions, Wire};
use crate::traffic::Traffic;

/// How long the link forwarder keeps dialing a rank 0 that is not listening yet (it listens
/// only once its COMM_INIT or LINK_OPEN arrived; rank 1 of a stock server dials for ~5 s).
const COMM_UPSTREAM_WAIT: Duration = Duration::from_secs(10);

/// Settings of a standalone relay: its command line.
#[derive(Args, Debug, Clone)]
pub struct RelayConfig {
    /// Where to listen, HOST:PORT (e.g. 127.0.0.3:PORT: another loopback address, so that the
    /// relay can take the server's own port).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: SocketAddr,
    /// The server to forward every connection to, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub to: SocketAddr,
    /// The link to emulate each way (one-way delay = RTT / 2, bandwidth per connection and
    /// direction): none, 2.5gbe, 10gbe, tb5-tcp or custom:RTT_US:GBIT_S.
    #[arg(long, default_value = "none", value_parser = parse_link)]
    pub link: LinkProfile,
    /// A raw byte stream: nothing parsed (only bytes counted, HELLO caps left alone). Default:
    /// ggml RPC, commands and round trips counted, HELLO caps zeroed (keeps RDMA-capable
    /// clients on TCP).
    #[arg(long)]
    pub raw: bool,
    /// Also carry the servers' own link (8.0's COMM_INIT, our LINK_OPEN): listen at --listen's
    /// port + 1000 on its host and forward, raw, over the same link, to --to's port + 1000 on
    /// its host (where our rpc-server's rank 0 listens: its own port + 1000, on the address the
    /// connection reached it at). A client that names this relay makes rank 1 dial exactly
    /// there, so the link crosses the emulated wire once.
    #[arg(long)]
    pub comm_link: bool,
    /// For a stock 8.0 server (implies --comm-link): it listens on every interface at the port
    /// its COMM_INIT names, the port rank 1 dials too; this rewrites every rank 0's COMM_INIT
    /// passing through to name PORT instead, and the link forwarder goes to --to's host at
    /// PORT.
    #[arg(long, value_name = "PORT")]
    pub comm_rank0_port: Option<u16>,
    /// Write the counters as JSON to FILE every `--stats-every` ms (replaced atomically).
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Period of `--stats`, milliseconds.
    #[arg(long, default_value_t = 500)]
    pub stats_every: u64,
}

fn parse_link(s: &str) -> Result<LinkProfile, String> {
    let mut v = links::parse_links(s).map_err(|e| e.to_string())?;
    match (v.pop(), v.is_empty()) {
        (Some(l), true) if l.kind != LinkKind::ProjectedOnly => Ok(l),
        (Some(l), true) => Err(format!("{}: projected only, cannot be emulated", l.name)),
        _ => Err(format!("'{s}': one link profile")),
    }
}

/// A running standalone relay: the protocol relay and, with `--comm-link`, the link forwarder.
pub struct Running {
    /// The relay on `--listen`.
    pub relay: Relay,
    /// The link forwarder (`--comm-link`).
    pub comm: Option<Relay>,
}

impl Running {
    /// The counters as one JSON object: the relay's traffic (`commands`: per command, e.g.
    /// `SET_TENSORx13`) and the link forwarder's bytes each way.
    pub fn stats_json(&self, cfg: &RelayConfig) -> serde_json::Value {
        let t = self.relay.counters().snapshot();
        let c = self
            .comm
            .as_ref()
            .map_or(Traffic::default(), |r| r.counters().snapshot());
        serde_json::json!({
            "listen": self.relay.addr().to_string(),
            "to": cfg.to.to_string(),
            "link": cfg.link.name,
            "connections": t.connections,
            "round_trips": t.round_trips,
            "c2s_bytes": t.c2s_bytes,
            "s2c_bytes": t.s2c_bytes,
            "commands": t.commands_summary(1.0),
            "comm_listen": self.comm.as_ref().map(|r| r.addr().to_string()),
            "comm_c2s_bytes": c.c2s_bytes,
            "comm_s2c_bytes": c.s2c_bytes,
        })
    }
}

/// Binds and starts the relay (and the link forwarder) of `cfg`.
pub fn start(cfg: &RelayConfig) -> anyhow::Result<Running> {
    let wire = Wire::of(&cfg.link);
    let bind = |at: SocketAddr| TcpListener::bind(at).with_context(|| format!("listening on {at}"));
    let main = bind(cfg.listen)?;
    let opts = RelayOptions {
        protocol: !cfg.raw,
        zero_hello_caps: !cfg.raw,
        comm_rank0_port: cfg.comm_rank0_port.map(u32::from),
        ..RelayOptions::default()
    };
    if cfg.raw && cfg.comm_rank0_port.is_some() {
        bail!("--comm-rank0-port rewrites COMM_INIT: not with --raw");
    }
    let comm = if cfg.comm_link || cfg.comm_rank0_port.is_some() {
        let off = |a: SocketAddr| -> anyhow::Result<SocketAddr> {
            let p = a.port().checked_add(COMM_PORT_OFFSET);
            let p = p.with_context(|| format!("{a}: its port + {COMM_PORT_OFFSET} is no port"))?;
            Ok(SocketAddr::new(a.ip(), p))
        };
        let listen = off(main.local_addr()?)?;
        let to = match cfg.comm_rank0_port {
            Some(p) => SocketAddr::new(cfg.to.ip(), p),
            None => off(cfg.to)?,
        };
        let link = RelayOptions {
            protocol: false,
            zero_hello_caps: false,
            upstream_wait: COMM_UPSTREAM_WAIT,
            comm_rank0_port: None,
        };
        Some(Relay::on(bind(listen)?, to, wire, link)?)
    } else {
        None
    };
    let relay = Relay::on(main, cfg.to, wire, opts)?;
    Ok(Running { relay, comm })
}

fn write_stats(path: &Path, v: &serde_json::Value) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{v}\n"))?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// `rpc-bench relay`: starts, says where it listens (one line per listener on stdout), serves
/// until killed.
pub fn command(cfg: RelayConfig) -> anyhow::Result<()> {
    let run = start(&cfg)?;
    let kind = if cfg.raw { "raw" } else { "ggml RPC" };
    let (name, fig) = (&cfg.link.name, cfg.link.figures());
    println!(
        "relay {} -> {} ({kind}), link {name} ({fig})",
        run.relay.addr(),
        cfg.to
    );
    if let Some(c) = &run.comm {
        let to = match cfg.comm_rank0_port {
            Some(p) => format!(
                "{} (rank 0's COMM_INIT port -> {p})",
                SocketAddr::new(cfg.to.ip(), p)
            ),
            None => format!(
                "{}",
                SocketAddr::new(cfg.to.ip(), cfg.to.port() + COMM_PORT_OFFSET)
            ),
        };
        println!(
            "relay {} -> {to} (servers' link, raw), link {name}",
            c.addr()
        );
    }
    let every = Duration::from_millis(cfg.stats_every.max(10));
    loop {
        if let Some(p) = &cfg.stats {
            write_stats(p, &run.stats_json(&cfg))
                .with_context(|| format!("writing {}", p.display()))?;
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use clap::Parser;
    use rpc_proto::{CommInit, Request};

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        relay: RelayConfig,
    }

    /// A "server" on 127.0.0.1:P whose link listener is at P + 1000 (both free).
    fn server_and_link() -> (TcpListener, TcpListener) {
        (0..50)
            .find_map(|_| {
                let s = TcpListener::bind("127.0.0.1:0").ok()?;
                let port = s.local_addr().ok()?.port().checked_add(COMM_PORT_OFFSET)?;
                Some((s, TcpListener::bind(("127.0.0.1", port)).ok()?))
            })
            .expect("a port P with P + 1000 free")
    }

    fn comm_init(rank: u32, port: u32) -> Vec<u8> {
        let mut v = Vec::new();
        Request::CommInit(CommInit {
            device: 0,
            rank,
            world: 2,
            port,
            host: CommInit::host_field("127.0.0.3").unwrap(),
        })
        .encode(&mut v);
        v
    }

    /// The command line as the one-endpoint driver gives it: requests cross the relay to the
    /// server intact, the reply comes back, a round trip takes at least the link's RTT, the
    /// servers' link crosses the forwarder at port + 1000 (delayed too), and the counters say
    /// so; with --comm-rank0-port, rank 0's COMM_INIT reaches the server naming that port and
    /// the forwarder goes there.
    #[test]
    fn relays_requests_and_the_servers_link_over_the_emulated_wire() {
        let (server, link) = server_and_link();
        let to = server.local_addr().unwrap();
        let listen = format!("127.0.0.3:{}", to.port());
        let stats = std::env::temp_dir().join(format!("relay-test-{}.json", std::process::id()));
        let cli = Cli::parse_from([
            "relay",
            "--listen",
            &listen,
            "--to",
            &to.to_string(),
            "--link",
            "custom:4000:1",
            "--comm-link",
            "--stats",
            stats.to_str().unwrap(),
        ]);
        let cfg = cli.relay;
        let run = start(&cfg).unwrap();
        assert_eq!(run.relay.addr().to_string(), listen);
        let comm_at = SocketAddr::from(([127, 0, 0, 3], to.port() + COMM_PORT_OFFSET));
        assert_eq!(run.comm.as_ref().unwrap().addr(), comm_at);

        // The client's COMM_INIT for rank 1 (naming the relay's port + 1000) and the server's
        // 8-byte reply: one round trip, at least the 4 ms RTT.
        let mut c = TcpStream::connect(run.relay.addr()).unwrap();
        let frame = comm_init(1, u32::from(comm_at.port()));
        let t = Instant::now();
        c.write_all(&frame).unwrap();
        let (mut s, _) = server.accept().unwrap();
        let mut got = vec![0u8; frame.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, frame, "the request reached the server unchanged");
        s.write_all(&1u64.to_le_bytes()).unwrap();
        s.write_all(&[1]).unwrap();
        let mut rsp = [0u8; 9];
        c.read_exact(&mut rsp).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(4),
            "RTT {:?}",
            t.elapsed()
        );

        // Rank 1 dials the relay's host at the named port; rank 0 listens at the server's.
        let t = Instant::now();
        let mut rank1 = TcpStream::connect(comm_at).unwrap();
        rank1.write_all(&[7; 24]).unwrap();
        let (mut rank0, _) = link.accept().unwrap();
        let mut caps = [0u8; 24];
        rank0.read_exact(&mut caps).unwrap();
        rank0.write_all(&[9; 24]).unwrap();
        rank1.read_exact(&mut caps).unwrap();
        assert_eq!(caps, [9; 24]);
        assert!(
            t.elapsed() >= Duration::from_millis(4),
            "link RTT {:?}",
            t.elapsed()
        );

        std::thread::sleep(Duration::from_millis(50));
        let v = run.stats_json(&cfg);
        assert_eq!(v["round_trips"], 1);
        assert_eq!(v["c2s_bytes"], frame.len() as u64);
        assert_eq!(v["s2c_bytes"], 9);
        assert_eq!(v["commands"], "COMM_INITx1");
        assert_eq!(
            (v["comm_c2s_bytes"].as_u64(), v["comm_s2c_bytes"].as_u64()),
            (Some(24), Some(24))
        );
        drop(run);

        // A stock server: rank 0's COMM_INIT is moved to another port, the forwarder follows.
        let (server, moved) = server_and_link();
        let to = server.local_addr().unwrap();
        let moved_port = moved.local_addr().unwrap().port();
        let cfg = RelayConfig {
            listen: SocketAddr::from(([127, 0, 0, 3], to.port())),
            to,
            comm_rank0_port: Some(moved_port),
            comm_link: false,
            stats: None,
            ..cfg
        };
        let run = start(&cfg).unwrap();
        let named = u32::from(to.port() + COMM_PORT_OFFSET);
        let mut c = TcpStream::connect(run.relay.addr()).unwrap();
        c.write_all(&comm_init(0, named)).unwrap();
        let (mut s, _) = server.accept().unwrap();
        let mut got = vec![0u8; comm_init(0, named).len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, comm_init(0, u32::from(moved_port)));
        let mut rank1 = TcpStream::connect(run.comm.as_ref().unwrap().addr()).unwrap();
        rank1.write_all(b"caps").unwrap();
        let (mut rank0, _) = moved.accept().unwrap();
        let mut b = [0u8; 4];
        rank0.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"caps");

        // The stats file the command writes.
        write_stats(&stats, &run.stats_json(&cfg)).unwrap();
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert_eq!(back["link"], "custom-4000us-1g");
        let _ = std::fs::remove_file(&stats);
        assert!(parse_link("tb5-rdma").is_err() && parse_link("none,tb5-tcp").is_err());
    }
}
