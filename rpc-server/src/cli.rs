//! Command line: the flags of the stock `ggml-rpc-server`, plus our own.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::Parser;

use crate::options::{Listen, ServerOptions, SessionOptions};

/// Now, in ns since the epoch.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Parses sizes like `512M`, `20G`, `1T` or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let m: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in '{s}' (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size '{s}'"))?;
    // Negated on purpose: NaN is rejected too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(n >= 0.0) {
        return Err(format!("invalid size '{s}'"));
    }
    Ok((n * mult as f64) as u64)
}

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n as usize),
        _ => Err(format!("invalid number of threads '{s}' (must be > 0)")),
    }
}

/// A ggml RPC server (protocol 8.0.0, and 7.0.0 on a second port): lets llama.cpp offload layers
/// to this machine with `--rpc host:port`. Drop-in replacement for llama.cpp's `ggml-rpc-server`.
#[derive(Debug, Parser)]
#[command(name = "rpc-server", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<SubCommand>,

    /// Host or address to bind to (IPv4, IPv6 or a host name).
    #[arg(short = 'H', long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to bind to. It speaks protocol 8.0.0, what llama.cpp built since October 2026 speaks
    /// (see --proto7-port for older builds).
    #[arg(short, long, default_value_t = 50052, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,

    /// Also serve protocol 7.0.0 (llama.cpp built before October 2026) on this port, same host,
    /// same process and memory. A client of the other major aborts at its first connection with
    /// "RPC server version mismatch": point it at the port of its major. Must differ from -p and
    /// from -p + 1000 (an 8.0 client's tensor split makes rank 0 listen there).
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub proto7_port: Option<u16>,

    /// Devices to use, comma- or slash-separated (e.g. `CUDA0,CUDA1`); see --list-devices.
    /// Default: every GPU device, else the CPU.
    #[arg(short, long, value_delimiter = ',')]
    pub device: Vec<String>,

    /// Number of threads for the CPU device.
    #[arg(short, long, default_value_t = crate::options::default_threads(), value_parser = parse_threads)]
    pub threads: usize,

    /// Memory each device reports to clients, in MiB: the free and the total memory of
    /// GET_DEVICE_MEMORY, by which a client splits a model's layers between its devices (the
    /// stock tool's -m/--mem). It also bounds --max-alloc-total's default: each device counts
    /// with the smaller of this and its own memory. 0 or absent: each device reports its own.
    #[arg(short = 'm', long = "mem", value_name = "MB")]
    pub mem: Option<u64>,

    /// Enable the local weight cache (SET_TENSOR_HASH), in the stock directory
    /// ($LLAMA_CACHE/rpc, else $XDG_CACHE_HOME/llama.cpp/rpc, else ~/.cache/llama.cpp/rpc).
    #[arg(short, long)]
    pub cache: bool,

    /// Cache directory (implies --cache).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    /// Bound the cache's total size (e.g. `20G`); least recently used entries are evicted.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub cache_max_size: Option<u64>,

    /// Load weights from this machine's own GGUF files (a file, or a directory searched for
    /// `*.gguf`; repeatable; the other parts of a split model come along): a client's
    /// SET_TENSOR_HASH for a tensor they hold is read from the file instead of uploaded. Indexed
    /// at start, the index kept in the cache directory (a restart rehashes only changed files).
    #[arg(long, value_name = "PATH")]
    pub gguf: Vec<PathBuf>,

    /// Hash every tensor read from the cache or a --gguf file. By default bytes are hashed once
    /// (when indexed, written or first read) and trusted while the file keeps its size,
    /// modification time and inode: hashing costs more than the read (~1.6 s per GB).
    #[arg(long)]
    pub verify_loads: bool,

    /// Serve only weights the operator trusts: no client upload is ever stored in the cache,
    /// and SET_TENSOR_HASH is answered only from --gguf files and from cache entries that were
    /// already there when the server started (seeded by the operator). Without it any client
    /// can fill the cache, and FNV-1a is no defence: an upload crafted to carry another model's
    /// hash is served to the next client that asks for that hash.
    #[arg(long)]
    pub trusted_weights_only: bool,

    /// List the available devices and exit.
    #[arg(long)]
    pub list_devices: bool,

    /// Connections served at the same time, counted from their HELLO. When all are taken, a new
    /// client gets the slot of the oldest connection that holds nothing (no buffer, graph or
    /// RDMA queue pair), which is closed; when every one holds something, it waits.
    #[arg(long, default_value_t = crate::options::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Connections one peer may have at once (an IPv4 address, an IPv6 /64; connections waiting
    /// for their HELLO and those handed to a session process included); more are closed unread.
    /// Every peer, loopback included, unless named by --peer-share-exempt. Default: half of
    /// --max-connections.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections_per_peer: Option<u64>,

    /// Peers not held to --max-connections-per-peer (comma-separated CIDRs; a bare address is
    /// one host), e.g. `127.0.0.1` for an rpc-shim on this machine that relays many clients.
    /// They can still take every slot. Default: none.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub peer_share_exempt: Vec<crate::cidr::Cidr>,

    /// Serve only these networks, e.g. `--allow 169.254.0.0/16` for a Thunderbolt bridge, or
    /// `--allow 192.168.2.0/24,fe80::/10` (comma-separated; a bare address is one host). Other
    /// peers are closed before a byte is read. Default: anyone who can reach the port.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub allow: Vec<crate::cidr::Cidr>,

    /// Servers this one may pair with for tensor split's collectives (8.0's COMM_INIT): as rank 1
    /// it dials only these, as rank 0 it accepts only these (comma-separated CIDRs, e.g.
    /// `169.254.0.0/16`). Default: what --allow permits. A host name in a COMM_INIT is resolved
    /// once and each of its addresses checked.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub comm_peers: Vec<crate::cidr::Cidr>,

    /// The RPC ports (their -p) of the servers this one may pair with; the link goes to that
    /// port + 1000, as the stock client asks (comma-separated, `50052` or `50000-50100`).
    /// Default: within 100 of this server's own -p (a rack's workers share one port; two
    /// servers on one machine use neighbouring ones).
    #[arg(long, value_name = "PORTS", value_delimiter = ',')]
    pub comm_peer_ports: Vec<crate::cidr::PortRange>,

    /// The RDMA flavor this server offers on a tensor-split link it dials (rank 1): `native`
    /// (Apple UC on macOS, Linux RC elsewhere, as a stock RDMA build), `rc` or `uc`. As rank 0
    /// it answers whichever its peer offers. The link goes on RDMA only when both servers can;
    /// between two of ours it speaks the lean framing.
    #[arg(long, value_enum, value_name = "FLAVOR", default_value = "native")]
    pub comm_rdma_flavor: rpc_transport::cli::FlavorChoice,

    /// A new connection must send its whole HELLO within this many seconds (stock clients send
    /// it at once); until then it holds no connection slot.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::options::DEFAULT_HELLO_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub hello_timeout: u64,

    /// A request that has started must keep arriving: every MiB of its body (and the rest of a
    /// frame header) within this many seconds, or the connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::options::DEFAULT_REQUEST_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout: u64,

    /// Serve each client session in a process of its own, started fresh for it (the default): a
    /// request that gets past validation and trips a ggml kernel can then harm only its own
    /// session (its process ends; the server and every other session go on).
    #[arg(long, overrides_with = "no_isolate")]
    pub isolate: bool,

    /// Serve every session in this one process (no containment; for debugging, or to save the
    /// few milliseconds a session process takes to start).
    #[arg(long)]
    pub no_isolate: bool,

    /// Keep this many session processes started ahead, contained and with their devices
    /// opened, each waiting for a connection: a client's first command then skips a process
    /// start (TCP clients; one offering RDMA gets a process started for it). A taken process is
    /// replaced in the background. 0: start each at its hand-off.
    #[arg(long, value_name = "N", default_value_t = crate::options::DEFAULT_SESSION_POOL, conflicts_with = "no_isolate", value_parser = clap::value_parser!(u16).range(..=64).map(usize::from))]
    pub session_pool: usize,

    /// Do not sandbox the session processes (Linux: seccomp, Landlock, rlimits); they stay
    /// processes of their own. For debugging.
    #[arg(long, conflicts_with = "no_isolate")]
    pub no_sandbox: bool,

    /// (internal) Run as the session process of one connection: the socket is stdin, the
    /// front's control line stdout, the configuration in the environment (`control::SessionStart`).
    #[arg(long, hide = true)]
    pub session_child: bool,

    /// (internal) A session process's client, a label for `ps` and the logs only (its
    /// configuration, the peer included, is the front's message).
    #[arg(long, hide = true, value_name = "ADDR", requires = "session_child")]
    pub session_peer: Option<String>,

    /// (internal) A pooled session process (`--session-pool`): contained and ready, it waits on
    /// its control line for its connection (the message and the client's socket).
    #[arg(long, hide = true, requires = "session_child")]
    pub session_wait: bool,

    /// (internal) Set up a session's containment as a session process would, print what was
    /// installed and exit (the front does this once at start for its banner).
    #[arg(long, hide = true)]
    pub sandbox_probe: bool,

    /// Largest request accepted (bytes, or with a K/M/G/T suffix).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "16G")]
    pub max_request_size: u64,

    /// Largest total size of the buffers one connection may hold (ALLOC_BUFFER beyond it answers
    /// a failed allocation). Default: --max-alloc-total less one connection's fair share of it
    /// (total / --max-connections), kept for the others: 127/128 of the total with 128
    /// connections, all of it with --max-connections 1.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_alloc_per_connection: Option<u64>,

    /// Largest total size of the buffers all connections together may hold. Default: the
    /// devices' total memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_alloc_total: Option<u64>,

    /// Close a connection that holds nothing (no buffer, graph or RDMA queue pair) and sends no
    /// request for this many seconds (0: never); also bounds --hello-timeout and
    /// --request-timeout when shorter. A connection that holds a model never ends on silence
    /// (see --keepalive).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::options::DEFAULT_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout: u64,

    /// TCP keepalive: probe a connection silent for this many seconds; a peer that answers no
    /// probe (vanished without closing) is dropped after about twice this and its buffers are
    /// freed (0: off).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::options::DEFAULT_KEEPALIVE.as_secs())]
    pub keepalive: u64,

    /// How long a TCP connection polls for the next bytes of a request before its thread sleeps
    /// (microseconds; 0: sleep at once). Polling yields the core to any other runnable thread;
    /// it saves the sleep and wake-up of a thread per request, which on a VM or a busy host
    /// costs more than the request itself. A connection polls only while its recent requests
    /// came within the window; after a few that came later it sleeps at once, like a plain
    /// blocking server, until they come sooner again.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = rpc_transport::tcp::DEFAULT_POLL_WINDOW.as_micros() as u64)]
    pub poll_window: u64,

    /// Do not ask Linux for transparent huge pages for CPU buffers. By default buffers of 2 MiB
    /// and more are advised MADV_HUGEPAGE: weights read every token then take far fewer TLB
    /// entries (token generation measurably faster where THP is in `madvise` mode).
    #[arg(long)]
    pub no_huge_pages: bool,

    /// On SIGTERM or Ctrl-C: stop accepting, close idle connections, and give running commands
    /// this many seconds to finish before exiting without them. Keep it below the service
    /// manager's stop timeout (launchd: 20 s by default; the files in packaging/ allow 30 s).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::options::DEFAULT_SHUTDOWN_GRACE.as_secs())]
    pub shutdown_grace: u64,

    /// Serve the server's counters in Prometheus text format at http://HOST:PORT/metrics
    /// (connections, commands and bytes per command and transport, compute and per-token time
    /// histograms, memory against the limits, cache, RDMA activations and fallbacks). Off by
    /// default; e.g. `--metrics 127.0.0.1:9100`.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Largest number of nodes and of tensors in one GRAPH_COMPUTE.
    #[arg(long, value_name = "N", default_value_t = crate::options::DEFAULT_MAX_GRAPH_SIZE)]
    pub max_graph_size: u32,

    /// Transport: `auto` switches a connection to RDMA when the client offers it in HELLO and a
    /// local RDMA device owns the connection's address (else TCP); `tcp` never uses RDMA (also
    /// set by GGML_RPC_NO_RDMA); `rdma` is `auto` but refuses to start without an RDMA device.
    #[arg(long, value_enum, default_value = "auto")]
    pub transport: crate::rdma::TransportMode,

    #[command(flatten)]
    pub rdma: rpc_transport::cli::RdmaArgs,

    /// RDMA connections at once; more clients get TCP. Apple allows 10 queue pairs per
    /// Thunderbolt device, shared by every process: 8 with Apple's verbs (macOS, or
    /// RDMA_VERBS_SYMBOLS=apple), else 64.
    #[arg(long, value_name = "N", default_value_t = crate::rdma::default_max_connections())]
    pub rdma_max_connections: usize,
}

#[derive(Debug, clap::Subcommand)]
pub enum SubCommand {
    /// Explain the local RDMA setup (devices, ports, GIDs, which address maps to which device)
    /// and whether RDMA would engage for a connection to or from a peer.
    Doctor {
        /// A peer address (host or host:port) to check the RDMA path to.
        #[arg(long)]
        peer: Option<String>,
        /// A running server (host:port, ours or stock) to ask which protocol its port speaks.
        #[arg(long, value_name = "HOST:PORT")]
        probe: Option<String>,
    },
}

impl Args {
    /// The server's options these flags say (`--trusted-weights-only` starts its clock here: the
    /// cache serves entries seeded before this moment).
    pub fn options(&self) -> ServerOptions {
        let secs = Duration::from_secs;
        // Where `-c` caches without `--cache-dir`, from the environment (`LLAMA_CACHE`,
        // `XDG_CACHE_HOME`, `HOME`), as the stock tool has it; read once, here.
        let default_dir = rpc_weights::cache::default_cache_dir();
        let cache_dir = match self.cache || self.cache_dir.is_some() {
            true => self.cache_dir.clone().or_else(|| default_dir.clone()),
            false => None,
        };
        let rdma = self.rdma.options();
        ServerOptions {
            listen: Listen {
                host: self.host.clone(),
                port: self.port,
                proto7_port: self.proto7_port,
                metrics: self.metrics.clone(),
            },
            max_request_size: self.max_request_size,
            max_graph_size: self.max_graph_size,
            max_connections: self.max_connections,
            max_per_peer: self
                .max_connections_per_peer
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            share_exempt: self.peer_share_exempt.clone(),
            allow: self.allow.clone(),
            comm_peers: self.comm_peers.clone(),
            comm_peer_ports: self.comm_peer_ports.clone(),
            comm_rdma_flavor: self.comm_rdma_flavor,
            hello_timeout: secs(self.hello_timeout),
            request_timeout: secs(self.request_timeout),
            idle_timeout: (self.idle_timeout > 0).then(|| secs(self.idle_timeout)),
            keepalive: (self.keepalive > 0).then(|| secs(self.keepalive)),
            poll_window: Duration::from_micros(self.poll_window),
            shutdown_grace: secs(self.shutdown_grace),
            max_alloc_per_connection: self.max_alloc_per_connection,
            max_alloc_total: self.max_alloc_total,
            transport: self.transport,
            rdma_device: rdma.device,
            rdma_gid_index: rdma.gid_index,
            rdma_max_connections: self.rdma_max_connections,
            isolate: !self.no_isolate,
            sandbox: !self.no_sandbox,
            session_pool: self.session_pool,
            session: SessionOptions {
                devices: self.device_names(),
                threads: self.threads,
                gguf_index: cache_dir
                    .clone()
                    .or(default_dir)
                    .map(|d| d.join(rpc_weights::local_weights::INDEX_FILE)),
                cache_dir,
                cache_max_size: self.cache_max_size,
                gguf: self.gguf.clone(),
                verify_loads: self.verify_loads,
                trusted_seeded_before: self.trusted_weights_only.then(now_ns),
                huge_pages: !self.no_huge_pages,
                // As the stock tool: MB are MiB, and 0 means the device's own figure.
                reported_memory: self
                    .mem
                    .filter(|&m| m > 0)
                    .map(|m| m.saturating_mul(1 << 20)),
            },
            ..ServerOptions::default()
        }
    }

    /// Device names, accepting both `,` and `/` as separators like the stock tool.
    pub fn device_names(&self) -> Vec<String> {
        self.device
            .iter()
            .flat_map(|d| d.split('/'))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2K").unwrap(), 2048);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("20GiB").unwrap(), 20 << 30);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("5X").is_err());
    }

    /// The library's defaults are the command line's: a bare `rpc-server` makes exactly
    /// `ServerOptions::default()` (the environment switches are the program's to read, at
    /// start-up: `ServerOptions::with_environment`), but for what the defaults derive from this
    /// machine (the cache directory the `--gguf` index would use).
    #[test]
    fn the_library_and_the_command_line_share_their_defaults() {
        std::env::remove_var("GGML_RDMA_DEV");
        std::env::remove_var("GGML_RDMA_GID");
        let parsed = Args::try_parse_from(["rpc-server"]).unwrap().options();
        let mut lib = ServerOptions::default();
        lib.session.gguf_index = parsed.session.gguf_index.clone();
        assert_eq!(parsed, lib);
        // And a flag moves its field only.
        let a = Args::try_parse_from(["rpc-server", "--idle-timeout", "0", "--no-isolate"])
            .unwrap()
            .options();
        assert_eq!(a.idle_timeout, None);
        assert!(!a.isolate);
        assert_eq!(a.max_connections, lib.max_connections);
    }

    /// `ggml-rpc-server --help` of the stock builds: 7.0.0 (llama-cpp-python 0.3.36) and 8.0.0
    /// (xllamacpp 2026.10.11549) print the same options (run on the cached builds), and the
    /// older single-device tool that had `-m/--mem`
    /// (upstream's `rpc-server.cpp` before its device list; `MEM` in MB, reported by
    /// GET_DEVICE_MEMORY as the device's free and total memory).
    const STOCK_USAGE_7_AND_8: &str = "\
  -h, --help                       show this help message and exit
  -t, --threads N                  number of threads for the CPU device (default: 1)
  -d, --device <dev1,dev2,...>     comma-separated list of devices
  -H, --host HOST                  host to bind to (default: 127.0.0.1)
  -p, --port PORT                  port to bind to (default: 50052)
  -c, --cache                      enable local file cache
";
    const STOCK_USAGE_OLDER: &str = "\
  -h, --help                show this help message and exit
  -t,      --threads        number of threads for the CPU backend (default: 6)
  -d DEV,  --device         device to use
  -H HOST, --host HOST      host to bind to (default: 127.0.0.1)
  -p PORT, --port PORT      port to bind to (default: 50052)
  -m MEM,  --mem MEM        backend memory size (in MB)
  -c,      --cache          enable local file cache
";

    /// A stock usage line's flags (`-x`, `--xx`) and whether they take a value: the words
    /// before the description are flags and value names (`N`, `HOST`, `<dev1,dev2,...>`).
    fn stock_flags(line: &str) -> (Vec<String>, bool) {
        let spec: Vec<&str> = line
            .split_whitespace()
            .map(|w| w.trim_end_matches(','))
            .take_while(|w| w.starts_with(['-', '<']) || w.chars().all(|c| c.is_ascii_uppercase()))
            .collect();
        let flags = spec
            .iter()
            .filter(|w| w.starts_with('-'))
            .map(|w| w.to_string())
            .collect();
        // -t takes N in every version, though the older usage did not say so.
        let takes = spec.iter().any(|w| !w.starts_with('-')) || spec.contains(&"--threads");
        (flags, takes)
    }

    /// Every flag of the stock usages is ours, with the same arity and the same meaning.
    #[test]
    fn every_stock_flag_is_accepted_with_its_meaning() {
        use clap::CommandFactory;
        let cmd = Args::command();
        let mut seen = 0;
        for usage in [STOCK_USAGE_7_AND_8, STOCK_USAGE_OLDER] {
            for line in usage.lines() {
                let (flags, takes) = stock_flags(line);
                assert!(!flags.is_empty(), "{line}");
                for flag in flags {
                    seen += 1;
                    let ours = cmd.get_arguments().find(|a| match flag.strip_prefix("--") {
                        Some(long) => a.get_long() == Some(long),
                        None => a.get_short() == flag.chars().nth(1),
                    });
                    if flag == "-h" || flag == "--help" {
                        let e = Args::try_parse_from(["rpc-server", flag.as_str()]).unwrap_err();
                        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
                        continue;
                    }
                    let ours = ours.unwrap_or_else(|| panic!("stock flag {flag} is not ours"));
                    assert_eq!(
                        ours.get_action().takes_values(),
                        takes,
                        "{flag}: takes a value in one and not the other"
                    );
                    let value = match ours.get_id().as_str() {
                        "threads" => "3",
                        "device" => "CPU,CUDA0/MTL0",
                        "host" => "0.0.0.0",
                        "port" => "50053",
                        "mem" => "2048",
                        _ => "",
                    };
                    let mut argv = vec!["rpc-server", flag.as_str()];
                    if takes {
                        argv.push(value);
                    }
                    let a = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
                    let o = a.options();
                    match ours.get_id().as_str() {
                        "threads" => assert_eq!(o.session.threads, 3),
                        "device" => {
                            assert_eq!(o.session.devices, ["CPU", "CUDA0", "MTL0"])
                        }
                        "host" => assert_eq!(a.host, "0.0.0.0"),
                        "port" => assert_eq!(a.port, 50053),
                        "mem" => assert_eq!(o.session.reported_memory, Some(2048 << 20)),
                        "cache" => assert!(
                            o.session.cache_dir.is_some()
                                || rpc_weights::cache::default_cache_dir().is_none()
                        ),
                        other => panic!("{flag}: no check for {other}"),
                    }
                }
            }
        }
        assert_eq!(seen, 12 + 14, "every flag of both usages checked");
        // The stock defaults where they are stated: host and port.
        let a = Args::try_parse_from(["rpc-server"]).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 50052));
        assert_eq!(a.options().listen, crate::options::Listen::default());
        // -m 0 is the stock "not set": the devices' own figure.
        let a = Args::try_parse_from(["rpc-server", "-m", "0"]).unwrap();
        assert_eq!(a.options().session.reported_memory, None);
        assert!(Args::try_parse_from(["rpc-server", "-m", "-5"]).is_err());
        // Repeated -d add devices, as the stock tool's do.
        let a = Args::try_parse_from(["rpc-server", "-d", "CPU", "--device", "CUDA0"]).unwrap();
        assert_eq!(a.device_names(), ["CPU", "CUDA0"]);
    }

    #[test]
    fn the_listeners_are_options_and_clashing_ports_are_refused() {
        let listen = |extra: &[&str]| {
            let base = ["rpc-server", "-H", "0.0.0.0", "-p", "50100"];
            let a = Args::try_parse_from(base.iter().chain(extra)).unwrap();
            a.options().listen
        };
        let l = listen(&["--proto7-port", "50200", "--metrics", "127.0.0.1:9100"]);
        assert_eq!((l.host.as_str(), l.port), ("0.0.0.0", 50100));
        assert_eq!(l.metrics.as_deref(), Some("127.0.0.1:9100"));
        use rpc_proto::Major::{V7, V8};
        assert_eq!(l.ports(), Ok(vec![(50100, V8), (50200, V7)]));
        assert_eq!(listen(&[]).ports(), Ok(vec![(50100, V8)]));
        let same = listen(&["--proto7-port", "50100"]).ports().unwrap_err();
        assert!(same.contains("same as -p"), "{same}");
        let comm = listen(&["--proto7-port", "51100"]).ports().unwrap_err();
        assert!(comm.contains("-p + 1000"), "{comm}");
    }

    #[test]
    fn the_session_pool_is_bounded_and_needs_isolation() {
        let a = Args::try_parse_from(["rpc-server", "--session-pool", "4"]).unwrap();
        assert_eq!(a.options().session_pool, 4);
        assert!(Args::try_parse_from(["rpc-server", "--session-pool", "65"]).is_err());
        assert!(
            Args::try_parse_from(["rpc-server", "--session-pool", "1", "--no-isolate"]).is_err()
        );
    }

    #[test]
    fn stock_flags_parse() {
        let a = Args::try_parse_from([
            "rpc-server",
            "-H",
            "0.0.0.0",
            "-p",
            "50053",
            "-d",
            "CPU/CUDA0",
            "-t",
            "4",
            "-c",
        ])
        .unwrap();
        assert_eq!(a.host, "0.0.0.0");
        assert_eq!(a.port, 50053);
        assert_eq!(a.device_names(), vec!["CPU", "CUDA0"]);
        assert_eq!(a.threads, 4);
        assert!(a.cache);
        assert!(Args::try_parse_from(["rpc-server", "-t", "0"]).is_err());
        assert!(Args::try_parse_from(["rpc-server", "-p", "0"]).is_err());
    }
}
