//! The start-up banner: what the server serves and how (endpoints, cache, devices, transport,
//! connections, tensor split, sessions and their containment, metrics, limits, liveness), on
//! stdout once its listeners are bound, and on stderr the warning of a listener reachable from
//! other machines. Tests and scripts read these lines (e.g. `containment    :`); [`Banner::lines`]
//! builds them without I/O.

use std::net::SocketAddr;

use rpc_proto::Major;
use rpc_session::SessionConfig;

use crate::options::ServerOptions;
use crate::rdma::{RdmaConfig, TransportMode};
use crate::server;
use crate::session_config::device_line;

const MIB: u64 = 1024 * 1024;

/// What the banner says, gathered once the listeners are bound.
pub struct Banner<'a> {
    pub options: &'a ServerOptions,
    pub config: &'a SessionConfig,
    pub rdma: &'a RdmaConfig,
    /// Each listener's address and the protocol major it speaks, `-p` first.
    pub endpoints: Vec<(SocketAddr, Major)>,
    /// Where `--metrics` listens.
    pub metrics: Option<SocketAddr>,
    /// The layers the containment probe installed (Linux, contained sessions); `None` when
    /// sessions are not contained (`--no-sandbox`, `--no-isolate`) or not on Linux.
    pub containment: Option<String>,
    /// RDMA devices are in exclusive network-namespace mode (Linux): contained sessions see none.
    pub rdma_netns_exclusive: bool,
}

impl<'a> Banner<'a> {
    /// The banner of a server with these listeners (and `--metrics` listener), asking the
    /// system what it must: their addresses, and whether RDMA devices are in exclusive
    /// network-namespace mode (only when that matters).
    pub fn new(
        options: &'a ServerOptions,
        config: &'a SessionConfig,
        rdma: &'a RdmaConfig,
        listeners: &[server::Listener],
        metrics: Option<&tokio::net::TcpListener>,
        containment: Option<String>,
    ) -> std::io::Result<Self> {
        let endpoints = listeners
            .iter()
            .map(|l| Ok((l.socket.local_addr()?, l.major)))
            .collect::<std::io::Result<Vec<_>>>()?;
        let metrics = metrics.map(|m| m.local_addr()).transpose()?;
        #[cfg(target_os = "linux")]
        let rdma_netns_exclusive = containment.is_some()
            && rdma.mode != TransportMode::Tcp
            && rpc_contain::namespaces::rdma_netns_exclusive();
        #[cfg(not(target_os = "linux"))]
        let rdma_netns_exclusive = false;
        Ok(Banner {
            options,
            config,
            rdma,
            endpoints,
            metrics,
            containment,
            rdma_netns_exclusive,
        })
    }

    /// The warning on stderr when the first listener is reachable from other machines.
    pub fn exposure_warning(&self) -> Option<Vec<String>> {
        let (local, _) = self.endpoints.first()?;
        if local.ip().is_loopback() {
            return None;
        }
        let bar = "!".repeat(74);
        Some(vec![
            bar.clone(),
            format!("WARNING: listening on {local}, reachable from other machines."),
            "         The ggml RPC protocol has no authentication or encryption:".into(),
            "         anyone who can connect can use this machine's devices and memory.".into(),
            "         Only expose it on a network you trust, and name that network".into(),
            "         with --allow CIDR (e.g. --allow 169.254.0.0/16 on a Thunderbolt".into(),
            "         bridge) so that other addresses are refused unread.".into(),
            bar,
        ])
    }

    /// The banner's lines on stdout, each without its newline.
    pub fn lines(&self) -> Vec<String> {
        let o = self.options;
        let mut out = Vec::new();
        let first = self.endpoints.first().map_or(Major::V8, |(_, m)| *m);
        out.push(format!(
            "Starting RPC server v{first} (rpc-server {})",
            env!("CARGO_PKG_VERSION")
        ));
        for (addr, major) in &self.endpoints {
            out.push(format!(
                "  endpoint       : {addr} (protocol {major}: {})",
                match major {
                    Major::V8 => "llama.cpp since October 2026",
                    Major::V7 => "llama.cpp before October 2026",
                }
            ));
        }
        out.push(match &self.config.cache {
            Some(c) => match c.max_size() {
                Some(m) => format!(
                    "  local cache    : {} (max {} MiB)",
                    c.dir().display(),
                    m / MIB
                ),
                None => format!("  local cache    : {}", c.dir().display()),
            },
            None => "  local cache    : n/a".into(),
        });
        if let Some(l) = &self.config.local {
            let s = l.summary();
            out.push(format!(
                "  local weights  : {} tensors, {} MiB in {} GGUF files (hashed {} MiB in {:.1} s)",
                s.tensors,
                s.bytes / MIB,
                s.files,
                s.bytes_hashed / MIB,
                s.seconds
            ));
        }
        out.push("Devices:".into());
        out.extend(self.config.devices.iter().map(device_line));
        out.push(format!("  threads        : {}", o.session.threads));
        out.push(format!("  transport      : {}", self.rdma.describe()));
        if self.rdma_netns_exclusive {
            out.push("  WARNING        : RDMA devices are in exclusive network-namespace mode: contained sessions see none and stay on TCP (`rdma system set netns shared`, the kernel's default, or --no-sandbox)".into());
        }
        out.push(format!(
            "  connections    : up to {} at once, {} per peer{}; from {}",
            o.max_connections,
            o.peer_share(),
            match o.share_exempt.is_empty() {
                true => String::new(),
                false => format!(
                    " (none for {})",
                    crate::cidr::AllowList(o.share_exempt.clone()).describe()
                ),
            },
            o.allow_list().describe()
        ));
        if let Some((addr, _)) = self.endpoints.iter().find(|(_, m)| *m == Major::V8) {
            let comm = o.comm_policy(*addr);
            let ports: Vec<String> = comm.peer_ports.iter().map(|r| r.to_string()).collect();
            out.push(format!(
                "  tensor split   : as rank 0 listens on port {} for {}; as rank 1 dials those on RPC ports {} + {} (--comm-peers, --comm-peer-ports)",
                comm.rank0_port().map_or_else(|| "none".to_string(), |p| p.to_string()),
                comm.peers.describe(),
                ports.join(","),
                rpc_proto::COMM_PORT_OFFSET
            ));
        }
        #[cfg(unix)]
        out.push(format!(
            "  sessions       : {}",
            describe_sessions(o.isolate)
        ));
        #[cfg(target_os = "linux")]
        match (&self.containment, o.isolate) {
            (Some(layers), _) => out.push(format!("  containment    : {layers}")),
            (None, true) => out.push("  containment    : off (--no-sandbox): sessions run with this process's identity and view".into()),
            (None, false) => {}
        }
        if let Some(m) = &self.metrics {
            out.push(format!("  metrics        : http://{m}/metrics"));
        }
        let memory = o.memory(server::device_memory(self.config));
        out.push(format!(
            "  limits         : {} MiB per connection, {} MiB in total",
            memory.per_connection / MIB,
            memory.total / MIB,
        ));
        out.push(format!(
            "  liveness       : idle timeout {} (connections holding nothing), keepalive {}",
            match o.idle_timeout {
                Some(t) => format!("{} s", t.as_secs()),
                None => "off".into(),
            },
            match o.keepalive {
                Some(k) => format!(
                    "{} s (a vanished peer is dropped after ~{} s)",
                    k.as_secs(),
                    server::keepalive_deadline(k).as_secs()
                ),
                None => "off".into(),
            }
        ));
        out
    }

    /// The warning (stderr), if any, then the banner (stdout), flushed.
    pub fn print(&self) {
        for l in self.exposure_warning().into_iter().flatten() {
            eprintln!("{l}");
        }
        for l in self.lines() {
            println!("{l}");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
    }
}

/// The `sessions` line: where sessions run.
fn describe_sessions(isolate: bool) -> &'static str {
    match isolate {
        true => "a process of its own per session (--no-isolate: all in this one)",
        false => "all in this process (--no-isolate): no containment",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SessionOptions;

    fn cpu_config() -> SessionConfig {
        let o = SessionOptions {
            devices: vec!["CPU".into()],
            reported_memory: Some(4096 * MIB),
            ..SessionOptions::default()
        };
        crate::session_config::session_config(&o, false).unwrap()
    }

    fn line<'l>(lines: &'l [String], key: &str) -> Option<&'l str> {
        let key = format!("  {key:<15}: ");
        lines.iter().find_map(|l| l.strip_prefix(key.as_str()))
    }

    fn banner<'a>(
        o: &'a ServerOptions,
        config: &'a SessionConfig,
        rdma: &'a RdmaConfig,
        containment: Option<String>,
    ) -> Vec<String> {
        let endpoints = vec![
            ("127.0.0.1:50052".parse().unwrap(), Major::V8),
            ("127.0.0.1:50053".parse().unwrap(), Major::V7),
        ];
        Banner {
            options: o,
            config,
            rdma,
            endpoints,
            metrics: None,
            containment,
            rdma_netns_exclusive: false,
        }
        .lines()
    }

    #[test]
    fn no_isolate_says_all_sessions_in_this_process_and_no_containment_line() {
        let config = cpu_config();
        let o = ServerOptions {
            isolate: false,
            ..ServerOptions::default()
        };
        let rdma = o.rdma_config();
        let lines = banner(&o, &config, &rdma, None);
        assert_eq!(
            line(&lines, "sessions"),
            Some("all in this process (--no-isolate): no containment")
        );
        assert_eq!(line(&lines, "containment"), None);
        // Contained, with the probe's layers, or with --no-sandbox.
        let o = ServerOptions { isolate: true, ..o };
        let lines = banner(&o, &config, &rdma, Some("uid 7; seccomp".into()));
        assert_eq!(
            line(&lines, "sessions"),
            Some("a process of its own per session (--no-isolate: all in this one)")
        );
        assert_eq!(line(&lines, "containment"), Some("uid 7; seccomp"));
        let lines = banner(&o, &config, &rdma, None);
        assert!(line(&lines, "containment")
            .unwrap()
            .starts_with("off (--no-sandbox)"));
    }

    #[test]
    fn limits_endpoints_and_tensor_split_come_from_the_options() {
        let config = cpu_config();
        let o = ServerOptions {
            max_alloc_total: Some(512 * MIB),
            max_alloc_per_connection: Some(128 * MIB),
            idle_timeout: None,
            ..ServerOptions::default()
        };
        let rdma = o.rdma_config();
        let lines = banner(&o, &config, &rdma, None);
        assert_eq!(
            line(&lines, "limits"),
            Some("128 MiB per connection, 512 MiB in total")
        );
        assert!(line(&lines, "liveness")
            .unwrap()
            .starts_with("idle timeout off (connections holding nothing)"));
        assert_eq!(
            lines[0],
            format!(
                "Starting RPC server v8.0.0 (rpc-server {})",
                env!("CARGO_PKG_VERSION")
            )
        );
        let endpoints: Vec<&String> = lines.iter().filter(|l| l.contains("endpoint")).collect();
        assert_eq!(endpoints.len(), 2);
        assert!(endpoints[1]
            .ends_with("127.0.0.1:50053 (protocol 7.0.0: llama.cpp before October 2026)"));
        // Tensor split is 8.0's: rank 0 on -p + 1000.
        assert!(line(&lines, "tensor split")
            .unwrap()
            .starts_with("as rank 0 listens on port 51052 "));
        // Without a total, the limit is what the devices report.
        let o = ServerOptions::default();
        let lines = banner(&o, &config, &rdma, None);
        assert!(line(&lines, "limits")
            .unwrap()
            .ends_with(", 4096 MiB in total"));
        // Each device as the stock tool lists it, under `Devices:`, with what it reports (-m).
        let devices = lines.iter().position(|l| l == "Devices:").unwrap();
        assert!(lines[devices + 1].starts_with("  CPU: "));
        assert!(lines[devices + 1].ends_with(" (4096 MiB, 4096 MiB free)"));
    }

    #[test]
    fn only_a_listener_beyond_loopback_is_warned_about() {
        let config = cpu_config();
        let o = ServerOptions::default();
        let rdma = o.rdma_config();
        let mut b = Banner::new(&o, &config, &rdma, &[], None, None).unwrap();
        assert!(b.exposure_warning().is_none());
        b.endpoints = vec![("127.0.0.1:50052".parse().unwrap(), Major::V8)];
        assert!(b.exposure_warning().is_none());
        b.endpoints = vec![("0.0.0.0:50052".parse().unwrap(), Major::V8)];
        let w = b.exposure_warning().unwrap();
        assert_eq!(
            w[1],
            "WARNING: listening on 0.0.0.0:50052, reachable from other machines."
        );
        assert_eq!(w[0], w[7]);
    }
}
