//! Command line of the `rpc-shim` binary.

use clap::Parser;

use rpc_transport::cli::RdmaClientArgs;

use crate::upstream::TransportMode;

/// Default first local port: the stock server's default (50052) plus 100, so a shim and a
/// local `rpc-server` can run side by side with their defaults.
pub const DEFAULT_BASE_PORT: u16 = 50152;

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("invalid duration '{s}' (seconds, > 0)")),
    }
}

fn parse_endpoint(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' is not host:port"))?;
    if host.is_empty() {
        return Err(format!("'{s}' has no host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!("'{s}' has no valid port")),
    }
}

/// Relays ggml RPC (protocol 8.0.0, and 7.0.0 on --proto7-port) from an unmodified, TCP-only
/// llama.cpp to remote workers, over RDMA when it can engage, else TCP.
///
/// Run it next to llama.cpp, then point llama.cpp at the local ports:
///
///   rpc-shim --worker 10.0.0.2:50052 --worker 10.0.0.3:50052
///   llama-cli -m model.gguf --rpc 127.0.0.1:50152,127.0.0.1:50153
///
/// Local ports: `--listen` once per worker in the same order, or by default `--host` with
/// consecutive ports from `--base-port` (worker i listens on base-port + i). They speak
/// protocol 8.0.0 (llama.cpp since October 2026); with `--proto7-port N` worker i also listens
/// on port N + i of the same address, speaking 7.0.0 (older llama.cpp).
///
/// One endpoint for all workers (`--one-endpoint`): one port (`--listen`, or `--host` and
/// `--base-port`) whose devices are every worker's devices in `--worker` order; copies between
/// them go from worker to worker, not through llama.cpp:
///
///   rpc-shim --one-endpoint -w 10.0.0.2:50052 -w 10.0.0.3:50052 -w 10.0.0.4:50052
///   llama-cli -m model.gguf --rpc 127.0.0.1:50152
#[derive(Debug, Parser)]
#[command(name = "rpc-shim", version, verbatim_doc_comment)]
pub struct Args {
    /// A remote worker (our rpc-server or a stock ggml-rpc-server), `host:port`. Repeat for
    /// several workers.
    #[arg(short = 'w', long = "worker", value_name = "HOST:PORT", required = true, value_parser = parse_endpoint)]
    pub workers: Vec<String>,

    /// Local address for the worker in the same position (repeat once per worker; with
    /// --one-endpoint, once).
    #[arg(short = 'l', long = "listen", value_name = "ADDR:PORT", value_parser = parse_endpoint)]
    pub listen: Vec<String>,

    /// Serve all workers behind one local endpoint whose devices are the workers' devices in
    /// --worker order (layer split's hidden states and tensor split's reductions then go from
    /// worker to worker, never through llama.cpp).
    #[arg(long)]
    pub one_endpoint: bool,

    /// Local address for the default listen ports (without --listen).
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    pub host: String,

    /// First local port without --listen: worker i listens on base-port + i.
    #[arg(short = 'p', long, default_value_t = DEFAULT_BASE_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    pub base_port: u16,

    /// Also listen for 7.0.0 clients (llama.cpp before October 2026): worker i on port N + i of
    /// its listen address. Toward an 8.0.0 worker their graphs get a fixed uid; the other ports
    /// speak 8.0.0.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub proto7_port: Option<u16>,

    /// A 7.0.0 listen address for the worker in the same position (repeat once per worker),
    /// instead of --proto7-port.
    #[arg(long = "listen7", value_name = "ADDR:PORT", value_parser = parse_endpoint, conflicts_with = "proto7_port")]
    pub listen7: Vec<String>,

    /// Transport to the workers: `auto` offers RDMA in HELLO when a local RDMA device owns the
    /// route to the worker and uses TCP otherwise (per worker and connection); `tcp` never offers
    /// RDMA (also set by GGML_RPC_NO_RDMA); `rdma` refuses connections on which RDMA does not engage.
    #[arg(long, value_enum, default_value = "auto")]
    pub transport: TransportMode,

    /// `--rdma-device`, `--rdma-gid-index`, `--rdma-flavor`.
    #[command(flatten)]
    pub rdma: RdmaClientArgs,

    /// Offer only upstream's RDMA framing, not also the lean framing our own rpc-server speaks
    /// (a stock server never takes the lean one anyway; also RPC_RDMA_LEAN=0).
    #[arg(long)]
    pub no_lean: bool,

    /// RDMA connections at once over all workers; more use TCP. Apple allows 10 queue pairs per
    /// Thunderbolt device, shared by every process.
    #[arg(long, value_name = "N", default_value_t = if cfg!(target_os = "macos") { 8 } else { 64 })]
    pub rdma_max_connections: usize,

    /// Seconds to wait for a TCP connection to a worker.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub connect_timeout: f64,

    /// Seconds to wait for a worker's HELLO reply (and RDMA setup).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub handshake_timeout: f64,

    /// Seconds to wait for a query answered over the control connection.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    pub query_timeout: f64,

    /// Do not connect to the workers at start-up to fill the query cache (connect on first use).
    #[arg(long)]
    pub no_prefetch: bool,

    /// With --one-endpoint: never ask workers for a worker-to-worker link (LINK_*); every copy
    /// between workers passes through the shim, as with stock workers. For workers that cannot
    /// reach each other on their port + 1000 (each pair would otherwise wait 10 s for its link
    /// once), and to measure what the links save.
    #[arg(long, requires = "one_endpoint")]
    pub no_worker_links: bool,

    /// Runtime threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: u16,
}

impl Args {
    /// The local address of each worker, in `--worker` order.
    pub fn listen_addrs(&self) -> Result<Vec<String>, String> {
        let listeners = self.listeners();
        if !self.listen.is_empty() {
            if self.one_endpoint && self.listen.len() != 1 {
                return Err(format!(
                    "{} --listen with --one-endpoint: give one (all workers share it), or none",
                    self.listen.len()
                ));
            }
            if self.listen.len() != listeners {
                return Err(format!(
                    "{} --listen for {} --worker: give one --listen per worker (same order), or none",
                    self.listen.len(),
                    self.workers.len()
                ));
            }
            return Ok(self.listen.clone());
        }
        let host = if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        (0..listeners)
            .map(|i| {
                u16::try_from(usize::from(self.base_port) + i)
                    .map(|p| format!("{host}:{p}"))
                    .map_err(|_| "--base-port + number of workers exceeds 65535".to_string())
            })
            .collect()
    }

    /// The 7.0.0 listen address of each worker, in `--worker` order (empty without
    /// `--proto7-port` and `--listen7`): `--listen7`, or port `N + i` on the address of its
    /// 8.0.0 listener; none of them one of the 8.0.0 addresses.
    pub fn proto7_addrs(&self) -> Result<Vec<String>, String> {
        let v8 = self.listen_addrs()?;
        let v7 = if !self.listen7.is_empty() {
            if self.listen7.len() != self.listeners() {
                return Err(if self.one_endpoint {
                    format!(
                        "{} --listen7 with --one-endpoint: give one, or none",
                        self.listen7.len()
                    )
                } else {
                    format!(
                        "{} --listen7 for {} --worker: give one --listen7 per worker (same order), or none",
                        self.listen7.len(),
                        self.workers.len()
                    )
                });
            }
            self.listen7.clone()
        } else if let Some(base) = self.proto7_port {
            Self::proto7_ports(&v8, base)?
        } else {
            return Ok(Vec::new());
        };
        if let Some(a) = v7.iter().find(|a| v8.contains(a)) {
            return Err(format!(
                "{a} is both an 8.0.0 and a 7.0.0 listen address; choose ports apart"
            ));
        }
        Ok(v7)
    }

    /// Local listeners per protocol major: one per worker, or one with --one-endpoint.
    pub fn listeners(&self) -> usize {
        if self.one_endpoint {
            1
        } else {
            self.workers.len()
        }
    }

    fn proto7_ports(v8: &[String], base: u16) -> Result<Vec<String>, String> {
        v8.iter()
            .enumerate()
            .map(|(i, a)| {
                let host = a.rsplit_once(':').map_or(a.as_str(), |(h, _)| h);
                u16::try_from(usize::from(base) + i)
                    .map(|p| format!("{host}:{p}"))
                    .map_err(|_| "--proto7-port + number of workers exceeds 65535".to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_worker_links_needs_one_endpoint() {
        let w = ["rpc-shim", "-w", "10.0.0.2:50052", "-w", "10.0.0.3:50052"];
        let alone = Args::try_parse_from(w.iter().chain(&["--no-worker-links"]));
        assert!(
            alone.is_err_and(|e| e.to_string().contains("--one-endpoint")),
            "--no-worker-links without --one-endpoint must be refused, naming it"
        );
        let a =
            Args::try_parse_from(w.iter().chain(&["--one-endpoint", "--no-worker-links"])).unwrap();
        assert!(a.one_endpoint && a.no_worker_links);
        assert!(!Args::try_parse_from(w).unwrap().no_worker_links);
    }

    #[test]
    fn default_ports_are_consecutive() {
        let a = Args::try_parse_from(["rpc-shim", "-w", "10.0.0.2:50052", "-w", "10.0.0.3:50052"])
            .unwrap();
        assert_eq!(
            a.listen_addrs().unwrap(),
            ["127.0.0.1:50152", "127.0.0.1:50153"]
        );
        assert_eq!(a.transport, TransportMode::Auto);
        let a = Args::try_parse_from(["rpc-shim", "-w", "h:1", "--base-port", "6000", "-H", "::1"])
            .unwrap();
        assert_eq!(a.listen_addrs().unwrap(), ["[::1]:6000"]);
    }

    #[test]
    fn proto7_ports_follow_the_listen_addresses() {
        let a = Args::try_parse_from(["rpc-shim", "-w", "a:1", "-w", "b:2"]).unwrap();
        assert!(
            a.proto7_addrs().unwrap().is_empty(),
            "no 7.0 port by default"
        );
        let a = Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "-w",
            "b:2",
            "--proto7-port",
            "50252",
        ])
        .unwrap();
        assert_eq!(
            a.proto7_addrs().unwrap(),
            ["127.0.0.1:50252", "127.0.0.1:50253"]
        );
        let a = Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "-l",
            "[::1]:7000",
            "--proto7-port",
            "7100",
        ])
        .unwrap();
        assert_eq!(a.proto7_addrs().unwrap(), ["[::1]:7100"]);
        // Worker 0's 7.0 port would be worker 1's 8.0 port (50153).
        let a = Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "-w",
            "b:2",
            "--proto7-port",
            "50153",
        ])
        .unwrap();
        assert!(a.proto7_addrs().is_err());
        assert!(Args::try_parse_from(["rpc-shim", "-w", "a:1", "--proto7-port", "0"]).is_err());
        // --listen7: one per worker, not together with --proto7-port.
        let a = Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "-l",
            "127.0.0.1:7000",
            "--listen7",
            "127.0.0.1:7700",
        ])
        .unwrap();
        assert_eq!(a.proto7_addrs().unwrap(), ["127.0.0.1:7700"]);
        let a = Args::try_parse_from(["rpc-shim", "-w", "a:1", "-w", "b:1", "--listen7", "h:1"])
            .unwrap();
        assert!(a.proto7_addrs().is_err());
        let a = Args::try_parse_from(["rpc-shim", "-w", "a:1", "--listen7", "127.0.0.1:50152"])
            .unwrap();
        assert!(a.proto7_addrs().is_err(), "the 8.0.0 default port");
        assert!(Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "--listen7",
            "h:1",
            "--proto7-port",
            "9"
        ])
        .is_err());
    }

    #[test]
    fn listen_must_match_workers() {
        let a =
            Args::try_parse_from(["rpc-shim", "-w", "a:1", "-w", "b:2", "-l", "127.0.0.1:7000"])
                .unwrap();
        assert!(a.listen_addrs().is_err());
        let a = Args::try_parse_from([
            "rpc-shim",
            "-w",
            "a:1",
            "-l",
            "0.0.0.0:7000",
            "--transport",
            "tcp",
        ])
        .unwrap();
        assert_eq!(a.listen_addrs().unwrap(), ["0.0.0.0:7000"]);
        assert!(Args::try_parse_from(["rpc-shim", "-w", "nohost"]).is_err());
        assert!(Args::try_parse_from(["rpc-shim", "-w", "h:0"]).is_err());
        assert!(Args::try_parse_from(["rpc-shim"]).is_err());
    }
}
