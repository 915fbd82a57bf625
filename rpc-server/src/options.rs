//! Every setting of a server, in one type with one set of defaults: the command line's. The
//! library (`server::serve`), the CLI (`cli::Args::options`) and a session process (which gets
//! the front's options as one message, `control::SessionStart`) all read [`ServerOptions`];
//! `cli.rs`'s test checks that a bare `rpc-server` parses to [`ServerOptions::default`].
//!
//! # Environment switches
//!
//! The program reads its environment once, at start-up, into these options
//! ([`ServerOptions::with_environment`], called by `app.rs` on the command line's options);
//! nothing else in the server reads a variable, and a session process gets the front's values
//! with the rest of its options. [`ServerOptions::default`] is every switch unset.
//!
//! | variable | option | effect |
//! |---|---|---|
//! | `GGML_RPC_NO_RDMA` (upstream's; set to anything) | [`ServerOptions::no_rdma`] | RDMA off, as `--transport tcp` |
//! | `RPC_RDMA_LEAN` (`0`, `off`, `false`, `no`) | [`ServerOptions::rdma_lean`] | no lean framing: upstream's framing for every RDMA peer |
//! | `RPC_MALLOC_TUNING` (`0`) | [`MallocTuning::on`] | glibc's allocator defaults (`rpc_ggml::tune_malloc`) |
//! | `MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_` (glibc's; set) | [`MallocTuning::arena_max`], [`MallocTuning::mmap_threshold`] | glibc's value stands instead of ours |
//! | `GGML_BACKEND_PATH` (upstream's) | [`ServerOptions::backend_path`] | dynamically built ggml backends loaded from there |
//! | `RPC_LOG` | [`ServerOptions::log_filter`] | the log filter (`tracing` `EnvFilter` syntax; default `info`) |
//! | `RPC_SANDBOX_SELFTEST` (`1`) | [`ServerOptions::sandbox_selftest`] | each session process tries what its sandbox forbids and logs each outcome |
//!
//! Read elsewhere, and why: `RPC_SESSION_START` (`control.rs`) carries these options to a
//! session process; `LLAMA_CACHE`, `XDG_CACHE_HOME` and `HOME` give `-c` its directory
//! (`rpc_weights::cache::default_cache_dir`, read by `cli::Args::options` into
//! [`SessionOptions::cache_dir`]); `HOME` names the home directory a session's sandbox
//! (macOS) and self-test deny (`child/contain.rs`); `GGML_RDMA_DEV` / `GGML_RDMA_GID` are read by the
//! command line's parser (`--rdma-device`, `--rdma-gid-index`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cidr::{AllowList, Cidr, PortRange};
use crate::comm::CommPolicy;
use crate::rdma::{RdmaConfig, TransportMode};
use rpc_session::MemoryLimits;
use rpc_transport::cli::FlavorChoice;

/// Default `--hello-timeout`: a client sends HELLO as soon as it connects.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--request-timeout`: a body must arrive at 35 KB/s at least.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default `--shutdown-grace`: below launchd's default `ExitTimeOut` (20 s), after which a
/// service is killed (a killed RDMA process can leave queue pairs behind).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Default `--keepalive`: a vanished peer is found within about two minutes.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(60);
/// Default `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
/// Default `--max-request-size`.
pub const DEFAULT_MAX_REQUEST_SIZE: u64 = 16 << 30;
/// Default `--max-graph-size`.
pub const DEFAULT_MAX_GRAPH_SIZE: u32 = 1 << 20;
/// Default `--session-pool`: session processes kept started, contained and waiting.
pub const DEFAULT_SESSION_POOL: usize = 0;

/// Default `-t`: half the cores (at least one).
pub fn default_threads() -> usize {
    (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).max(1)
}

/// Where the server listens: `-H`, `-p`, `--proto7-port`, `--metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listen {
    /// The address the RPC listeners bind (`-H`).
    pub host: String,
    /// The 8.0.0 port (`-p`).
    pub port: u16,
    /// The 7.0.0 port (`--proto7-port`), if any.
    pub proto7_port: Option<u16>,
    /// `HOST:PORT` of the Prometheus endpoint (`--metrics`), if any.
    pub metrics: Option<String>,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            host: "127.0.0.1".into(),
            port: 50052,
            proto7_port: None,
            metrics: None,
        }
    }
}

impl Listen {
    /// Each RPC listener's port and the major it speaks, 8.0.0 first; or why the ports clash.
    pub fn ports(&self) -> Result<Vec<(u16, rpc_proto::Major)>, String> {
        let mut ports = vec![(self.port, rpc_proto::Major::V8)];
        if let Some(p7) = self.proto7_port {
            if p7 == self.port {
                return Err(format!(
                    "--proto7-port {p7} is the same as -p: each port speaks one protocol major"
                ));
            }
            if Some(p7) == self.port.checked_add(rpc_proto::COMM_PORT_OFFSET) {
                return Err(format!(
                    "--proto7-port {p7} is -p + {}: an 8.0 client's tensor split makes rank 0 listen there",
                    rpc_proto::COMM_PORT_OFFSET
                ));
            }
            ports.push((p7, rpc_proto::Major::V7));
        }
        Ok(ports)
    }
}

/// A server's settings. `None` in a limit means "derived": see each field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerOptions {
    /// Where it listens (the process's listeners; a library caller binds its own).
    pub listen: Listen,
    /// Largest request accepted (`--max-request-size`).
    pub max_request_size: u64,
    /// Largest number of nodes and of tensors in one GRAPH_COMPUTE (`--max-graph-size`).
    pub max_graph_size: u32,
    /// Connections served at once (after their HELLO).
    pub max_connections: usize,
    /// Connections one peer may have at once; `None`: half of `max_connections`.
    pub max_per_peer: Option<usize>,
    /// Peers not held to a share (`--peer-share-exempt`; empty, the default: every peer is).
    #[serde(with = "flag_texts")]
    pub share_exempt: Vec<Cidr>,
    /// Addresses that may connect (empty: all).
    #[serde(with = "flag_texts")]
    pub allow: Vec<Cidr>,
    /// Comm peers (8.0's server-to-server link) rank 1 may dial and rank 0 accepts
    /// (`--comm-peers`; empty: what `allow` permits).
    #[serde(with = "flag_texts")]
    pub comm_peers: Vec<Cidr>,
    /// The RPC ports of comm peers rank 1 may dial, the link being on that port + 1000
    /// (`--comm-peer-ports`; empty: within `comm::DEFAULT_PEER_PORT_WINDOW` of the port the
    /// client reached this server at).
    #[serde(with = "flag_texts")]
    pub comm_peer_ports: Vec<PortRange>,
    /// How long a new connection may take to send its whole HELLO.
    pub hello_timeout: Duration,
    /// The longest a started request may go without progress.
    pub request_timeout: Duration,
    /// Close a connection that holds nothing and starts no request for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// TCP keepalive on every accepted connection (`None`: off).
    pub keepalive: Option<Duration>,
    /// How long a TCP read polls before the thread sleeps.
    pub poll_window: Duration,
    /// On shutdown, how long running commands may take to finish.
    pub shutdown_grace: Duration,
    /// Buffers one connection may hold; `None`: the total less one fair share
    /// (`admission::default_alloc_per_connection`).
    pub max_alloc_per_connection: Option<u64>,
    /// Buffers all connections may hold; `None`: the devices' memory.
    pub max_alloc_total: Option<u64>,
    #[serde(with = "value_enum")]
    pub transport: TransportMode,
    /// Upstream's switch `GGML_RPC_NO_RDMA` was set (to anything, even empty): RDMA is off
    /// whatever `transport` says: client connections and comm links stay on TCP, and a session
    /// process is not given the RDMA device (`child/contain.rs`). Default `false`; read at start-up
    /// ([`ServerOptions::with_environment`]).
    pub no_rdma: bool,
    /// Accept the lean framing from RDMA clients that offer it, and offer and accept it on a
    /// comm link (`rdma::RdmaConfig::lean`, `link::LinkRdma::lean`); `false`: upstream's framing
    /// of their flavor for everyone. `RPC_RDMA_LEAN` set to `0`, `off`, `false` or `no` (any
    /// case, blanks around ignored) makes it `false`; default `true`.
    pub rdma_lean: bool,
    /// The RDMA flavor this server offers as rank 1 of a comm link (`--comm-rdma-flavor`; as
    /// rank 0 it answers the flavor its peer offers).
    #[serde(with = "value_enum")]
    pub comm_rdma_flavor: FlavorChoice,
    pub rdma_device: Option<String>,
    pub rdma_gid_index: Option<u32>,
    /// RDMA connections at once (`rdma::default_max_connections`).
    pub rdma_max_connections: usize,
    /// A process per session (`handoff/`); `false`: sessions run in the server's process.
    pub isolate: bool,
    /// Contain session processes (namespaces, seccomp, Landlock; Seatbelt on macOS).
    pub sandbox: bool,
    /// The executable session processes run (`None`: this one).
    pub session_exe: Option<PathBuf>,
    /// Session processes kept started (contained, devices opened) and waiting for a connection
    /// (`--session-pool`; 0: each is started at its connection's hand-off).
    pub session_pool: usize,
    /// What each session computes with.
    pub session: SessionOptions,
    /// The glibc allocator tuning done at start-up, before any thread (`rpc_ggml::tune_malloc`).
    pub malloc: MallocTuning,
    /// Where dynamically built ggml backends are loaded from (`rpc_ggml::load_backends_from`):
    /// upstream's `GGML_BACKEND_PATH`; default `None` (none loaded: the static build has them).
    pub backend_path: Option<String>,
    /// The log filter (`tracing` `EnvFilter` directives), `RPC_LOG`; `None`, or directives that
    /// do not parse: `info`.
    pub log_filter: Option<String>,
    /// `RPC_SANDBOX_SELFTEST=1`: each session process, once it serves, tries what its sandbox
    /// forbids and logs each outcome (`child/contain.rs`; `tests/tests/isolate.rs` reads the lines).
    pub sandbox_selftest: bool,
}

/// Which of glibc's allocator tunables the server sets at start-up (`rpc_ggml::tune_malloc`; only
/// on Linux with glibc). Default: all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MallocTuning {
    /// Tune at all; `RPC_MALLOC_TUNING=0` makes it `false` (glibc's defaults).
    pub on: bool,
    /// Limit the malloc arenas; `false` when glibc's own `MALLOC_ARENA_MAX` is set (it stands).
    pub arena_max: bool,
    /// Fix the mmap threshold; `false` when glibc's own `MALLOC_MMAP_THRESHOLD_` is set.
    pub mmap_threshold: bool,
}

impl Default for MallocTuning {
    fn default() -> Self {
        MallocTuning {
            on: true,
            arena_max: true,
            mmap_threshold: true,
        }
    }
}

impl MallocTuning {
    /// What `rpc_ggml::tune_malloc` is asked to set: the arena limit (`arenas`, when ours to set)
    /// and whether to fix the mmap threshold.
    pub fn plan(&self, arenas: usize) -> (Option<usize>, bool) {
        (
            (self.on && self.arena_max).then_some(arenas),
            self.on && self.mmap_threshold,
        )
    }
}

/// The settings a session's [`rpc_session::SessionConfig`] is built from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionOptions {
    /// Device names (`-d`); empty: every GPU, else the CPU.
    pub devices: Vec<String>,
    /// Threads of the CPU device (`-t`).
    pub threads: usize,
    /// The weight cache's directory (`-c`, `--cache-dir`); `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    pub cache_max_size: Option<u64>,
    /// The worker's own GGUF files (`--gguf`).
    pub gguf: Vec<PathBuf>,
    /// Where the `--gguf` index lives (the cache directory, else the default one).
    pub gguf_index: Option<PathBuf>,
    pub verify_loads: bool,
    /// `--trusted-weights-only`: serve cache entries changed before this (ns since the epoch,
    /// the front's start).
    pub trusted_seeded_before: Option<u64>,
    /// Advise transparent huge pages for CPU buffers.
    pub huge_pages: bool,
    /// The memory each device reports (GET_DEVICE_MEMORY's free and total), in bytes, instead
    /// of its own (`-m/--mem`, the stock tool's flag); `None`: the device's.
    pub reported_memory: Option<u64>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: Listen::default(),
            max_request_size: DEFAULT_MAX_REQUEST_SIZE,
            max_graph_size: DEFAULT_MAX_GRAPH_SIZE,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_peer: None,
            share_exempt: Vec::new(),
            allow: Vec::new(),
            comm_peers: Vec::new(),
            comm_peer_ports: Vec::new(),
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            keepalive: Some(DEFAULT_KEEPALIVE),
            poll_window: rpc_transport::tcp::DEFAULT_POLL_WINDOW,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            max_alloc_per_connection: None,
            max_alloc_total: None,
            transport: TransportMode::Auto,
            no_rdma: false,
            rdma_lean: true,
            comm_rdma_flavor: FlavorChoice::Native,
            rdma_device: None,
            rdma_gid_index: None,
            rdma_max_connections: crate::rdma::default_max_connections(),
            isolate: true,
            sandbox: true,
            session_exe: None,
            session_pool: DEFAULT_SESSION_POOL,
            session: SessionOptions::default(),
            malloc: MallocTuning::default(),
            backend_path: None,
            log_filter: None,
            sandbox_selftest: false,
        }
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            devices: Vec::new(),
            threads: default_threads(),
            cache_dir: None,
            cache_max_size: None,
            gguf: Vec::new(),
            gguf_index: None,
            verify_loads: false,
            trusted_seeded_before: None,
            huge_pages: true,
            reported_memory: None,
        }
    }
}

impl ServerOptions {
    /// These options with the environment switches (the module's table) as this process's
    /// environment sets them: what the program does once, at start-up.
    pub fn with_environment(self) -> ServerOptions {
        self.with_switches(|k| std::env::var_os(k))
    }

    /// These options with the environment switches as `var` answers them (`None`: unset).
    fn with_switches(self, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> ServerOptions {
        // A value that is not UTF-8 counts as unset where a text is needed, as `std::env::var`
        // has it.
        let text = |k: &str| var(k).and_then(|v| v.into_string().ok());
        ServerOptions {
            no_rdma: var("GGML_RPC_NO_RDMA").is_some(),
            rdma_lean: text("RPC_RDMA_LEAN").is_none_or(|v| {
                !matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "0" | "off" | "false" | "no"
                )
            }),
            malloc: MallocTuning {
                on: var("RPC_MALLOC_TUNING").is_none_or(|v| v != "0"),
                arena_max: var("MALLOC_ARENA_MAX").is_none(),
                mmap_threshold: var("MALLOC_MMAP_THRESHOLD_").is_none(),
            },
            // Set but not UTF-8: an empty path, as before the switch was an option.
            backend_path: var("GGML_BACKEND_PATH").map(|v| v.into_string().unwrap_or_default()),
            log_filter: text("RPC_LOG"),
            sandbox_selftest: var("RPC_SANDBOX_SELFTEST").is_some_and(|v| v == "1"),
            ..self
        }
    }

    /// The request limits every frame is checked against.
    pub fn limits(&self) -> rpc_proto::Limits {
        rpc_proto::Limits {
            max_request_size: self.max_request_size,
            max_graph_nodes: self.max_graph_size,
            max_graph_tensors: self.max_graph_size,
        }
    }

    /// Connections one peer may have at once.
    pub fn peer_share(&self) -> usize {
        self.max_per_peer
            .unwrap_or_else(|| crate::admission::default_peer_share(self.max_connections))
    }

    /// The memory limits, with `device_memory` for what is derived from the devices.
    pub fn memory(&self, device_memory: u64) -> MemoryLimits {
        let total = self.max_alloc_total.unwrap_or(device_memory);
        MemoryLimits {
            per_connection: self.max_alloc_per_connection.unwrap_or_else(|| {
                crate::admission::default_alloc_per_connection(total, self.max_connections)
            }),
            total,
        }
    }

    pub fn allow_list(&self) -> AllowList {
        AllowList(self.allow.clone())
    }

    /// The comm peers: `--comm-peers`, else `--allow`.
    pub fn comm_peer_list(&self) -> AllowList {
        match self.comm_peers.is_empty() {
            true => self.allow_list(),
            false => AllowList(self.comm_peers.clone()),
        }
    }

    /// The links a connection that reached this server at `local` may have (`comm.rs`).
    pub fn comm_policy(&self, local: std::net::SocketAddr) -> CommPolicy {
        CommPolicy::new(
            local,
            self.comm_peer_list(),
            self.comm_peer_ports.clone(),
            crate::comm::SETUP_TIMEOUT,
            self.request_timeout,
        )
        .with_rdma(self.link_rdma())
    }

    /// What a comm link may run on besides TCP: as the client connections (`--transport`,
    /// `GGML_RPC_NO_RDMA`, the RDMA device flags, `RPC_RDMA_LEAN`).
    pub fn link_rdma(&self) -> crate::link::LinkRdma {
        crate::link::LinkRdma {
            flavor: self.comm_rdma_flavor.flavor(),
            mode: self.rdma_mode(),
            opts: self.rdma_options(),
            lean: self.rdma_lean,
        }
    }

    /// `--transport`, unless upstream's switch `GGML_RPC_NO_RDMA` ([`ServerOptions::no_rdma`])
    /// says TCP.
    pub fn rdma_mode(&self) -> TransportMode {
        match self.no_rdma {
            true => TransportMode::Tcp,
            false => self.transport,
        }
    }

    fn rdma_options(&self) -> rpc_transport::rdma::real::RdmaOptions {
        rpc_transport::rdma::real::RdmaOptions {
            device: self.rdma_device.clone(),
            gid_index: self.rdma_gid_index,
        }
    }

    /// The RDMA settings and counters these options make (one per server).
    pub fn rdma_config(&self) -> Arc<RdmaConfig> {
        Arc::new(
            RdmaConfig::new(
                self.rdma_mode(),
                self.rdma_options(),
                self.rdma_max_connections.max(1),
            )
            .with_lean(self.rdma_lean),
        )
    }

    /// How long a connection may stay silent between requests, and stall inside one.
    pub fn deadlines(&self) -> Deadlines {
        let stall = self
            .idle_timeout
            .map_or(self.request_timeout, |t| t.min(self.request_timeout));
        Deadlines {
            idle: self.idle_timeout,
            stall: Some(stall),
        }
    }

    /// How long a new connection has for its whole HELLO.
    pub fn hello_deadline(&self) -> Duration {
        self.idle_timeout
            .map_or(self.hello_timeout, |t| t.min(self.hello_timeout))
    }
}

/// How long the command loop waits. The two deadlines are different questions: `idle` is how
/// long a connection that holds nothing may stay silent between requests (a connection that
/// holds buffers or a graph waits forever: an idle `llama-server` keeps its model on us); `stall`
/// is how long a request whose header arrived may go without a byte of its body.
#[derive(Debug, Clone, Copy, Default)]
pub struct Deadlines {
    pub idle: Option<Duration>,
    pub stall: Option<Duration>,
}

impl Deadlines {
    /// Both deadlines from the `--idle-timeout` setting.
    pub fn from_idle_timeout(t: Option<Duration>) -> Deadlines {
        Deadlines { idle: t, stall: t }
    }

    /// For a connection that holds an RDMA queue pair: never idle, stalls still bounded.
    pub fn holding_queue_pair(self) -> Deadlines {
        Deadlines { idle: None, ..self }
    }
}

/// Lists of flag values (address blocks, port ranges) as their flag text (`10.0.0.0/8`,
/// `50000-50100`).
mod flag_texts {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<S: Serializer, T: Display>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|c| c.to_string()))
    }

    pub fn deserialize<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .collect()
    }
}

/// A flag's enum (`--transport`, `--comm-rdma-flavor`) as its flag value.
mod value_enum {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: clap::ValueEnum, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        let name = v.to_possible_value().map(|p| p.get_name().to_string());
        s.serialize_str(name.as_deref().unwrap_or(""))
    }

    pub fn deserialize<'de, T: clap::ValueEnum, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        let text = String::deserialize(d)?;
        T::from_str(&text, false).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_survive_the_message_to_a_session_process() {
        let mut o = ServerOptions {
            allow: vec![
                "169.254.0.0/16".parse().unwrap(),
                "fe80::/10".parse().unwrap(),
            ],
            idle_timeout: None,
            transport: TransportMode::Tcp,
            ..Default::default()
        };
        o.session.gguf = vec!["/models/x.gguf".into()];
        o.session.trusted_seeded_before = Some(42);
        let text = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<ServerOptions>(&text).unwrap(), o);
    }

    /// Each switch, read from a given environment, moves its option only, with the values the
    /// server has always given it; an empty environment leaves the defaults.
    #[test]
    fn environment_switches_are_read_into_their_options() {
        use std::ffi::OsString;
        let with = |pairs: &[(&str, &str)]| {
            let env: Vec<(String, OsString)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
            ServerOptions::default()
                .with_switches(move |k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        };
        let d = ServerOptions::default();
        assert_eq!(with(&[]), d);
        assert!(with(&[("GGML_RPC_NO_RDMA", "")]).no_rdma, "set to anything");
        assert_eq!(
            with(&[("GGML_RPC_NO_RDMA", "0")]).rdma_mode(),
            TransportMode::Tcp
        );
        for off in ["0", "off", " FALSE ", "No"] {
            assert!(!with(&[("RPC_RDMA_LEAN", off)]).rdma_lean, "{off:?}");
            assert!(!with(&[("RPC_RDMA_LEAN", off)]).link_rdma().lean);
            assert!(!with(&[("RPC_RDMA_LEAN", off)]).rdma_config().lean);
        }
        for on in ["1", "", "yes"] {
            assert!(with(&[("RPC_RDMA_LEAN", on)]).rdma_lean, "{on:?}");
        }
        let m = |pairs: &[(&str, &str)]| with(pairs).malloc.plan(4);
        assert_eq!(m(&[]), (Some(4), true));
        assert_eq!(m(&[("RPC_MALLOC_TUNING", "1")]), (Some(4), true));
        assert_eq!(m(&[("RPC_MALLOC_TUNING", "0")]), (None, false));
        assert_eq!(m(&[("MALLOC_ARENA_MAX", "2")]), (None, true));
        assert_eq!(m(&[("MALLOC_MMAP_THRESHOLD_", "")]), (Some(4), false));
        let b = with(&[("GGML_BACKEND_PATH", "/opt/ggml")]);
        assert_eq!(b.backend_path.as_deref(), Some("/opt/ggml"));
        assert_eq!(
            with(&[("RPC_LOG", "debug")]).log_filter.as_deref(),
            Some("debug")
        );
        assert!(with(&[("RPC_SANDBOX_SELFTEST", "1")]).sandbox_selftest);
        assert!(!with(&[("RPC_SANDBOX_SELFTEST", "yes")]).sandbox_selftest);
        // A switch moves its own option only; the flags' options stay.
        let flagged = ServerOptions {
            max_connections: 3,
            ..ServerOptions::default()
        }
        .with_switches(|k| (k == "RPC_RDMA_LEAN").then(|| "0".into()));
        assert_eq!(
            flagged,
            ServerOptions {
                max_connections: 3,
                rdma_lean: false,
                ..ServerOptions::default()
            }
        );
    }

    #[test]
    fn derived_limits_follow_the_devices_and_the_connection_count() {
        let o = ServerOptions {
            max_connections: 4,
            ..Default::default()
        };
        assert_eq!(o.memory(1000).total, 1000);
        assert_eq!(o.memory(1000).per_connection, 750);
        assert_eq!(o.peer_share(), 2);
        let d = o.deadlines();
        assert_eq!(d.idle, Some(DEFAULT_IDLE_TIMEOUT));
        assert_eq!(d.stall, Some(DEFAULT_REQUEST_TIMEOUT));
        let short = ServerOptions {
            idle_timeout: Some(Duration::from_secs(3)),
            ..o
        };
        assert_eq!(short.deadlines().stall, Some(Duration::from_secs(3)));
        assert_eq!(short.hello_deadline(), Duration::from_secs(3));
    }
}
