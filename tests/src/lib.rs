//! Helpers for the integration tests: an in-process `rpc-server` on 127.0.0.1:0, buffer and
//! tensor shorthands, and checks that a connection was closed and that a server is healthy.
//!
//! The server runs on its own thread with its own multi-threaded tokio runtime, so tests can
//! use any runtime and a server outlives no test that owns it. `RPC_LOG=debug` shows the
//! server's logs.

#![forbid(unsafe_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rpc_client::{ops, Client, ClientError, Major, RpcTensor, TensorBuilder, TENSOR_FLAG_COMPUTE};
use rpc_ggml::{Device, DeviceKind};
use rpc_server::options::ServerOptions;
use rpc_server::server;
use rpc_server::stats::Stats;
use rpc_session::SessionConfig;
use rpc_weights::cache::WeightCache;
use rpc_weights::local_weights::LocalWeights;

pub use rpc_client;
pub use rpc_proto;

/// How long a test waits for the server to close a connection (or to answer).
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// An `rpc-server` serving on 127.0.0.1 (random ports) from a background thread, with the
/// CPU device and one compute thread; protocol 7.0.0 on [`TestServer::addr`] (the suite written
/// for 7.0.0 runs there unchanged) and 8.0.0 on [`TestServer::addr8`], one server behind both.
/// Dropping it shuts the server down.
pub struct TestServer {
    /// Where to connect for protocol 7.0.0.
    pub addr: SocketAddr,
    /// Where to connect for protocol 8.0.0.
    pub addr8: SocketAddr,
    /// The server's counters.
    pub stats: Arc<Stats>,
    /// Its devices and weight cache.
    pub config: Arc<SessionConfig>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RPC_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
    });
}

/// The CPU device.
pub fn cpu_device() -> Device {
    rpc_ggml::load_backends();
    Device::all()
        .into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .expect("ggml has no CPU device")
}

impl TestServer {
    /// A server without weight cache.
    pub fn start() -> TestServer {
        Self::start_with(None)
    }

    /// A server whose weight cache lives in `dir`.
    pub fn start_with_cache(dir: &Path) -> TestServer {
        let cache = WeightCache::open(dir, None).expect("cannot open the cache directory");
        Self::start_with(Some(cache))
    }

    /// A server answering SET_TENSOR_HASH from these local GGUF weights (`--gguf`).
    pub fn start_with_local(local: LocalWeights) -> TestServer {
        Self::start_full(None, Some(local), Self::options())
    }

    /// The options of a test server: the library's defaults, sessions in the test's own process
    /// (a contained server's sessions run the release binary: set `isolate` and `session_exe`).
    pub fn options() -> ServerOptions {
        ServerOptions {
            isolate: false,
            // Test servers listen on random ports: any may be a comm peer's.
            comm_peer_ports: vec!["1-64535".parse().expect("a port range")],
            ..ServerOptions::default()
        }
    }

    /// A server with these listener options (idle timeout, limits, ...).
    pub fn start_with_options(opts: ServerOptions) -> TestServer {
        Self::start_full(None, None, opts)
    }

    /// A server with these options listening on `host` (an address of this machine, e.g. the
    /// host end of a veth pair) instead of 127.0.0.1.
    pub fn start_on(host: &str, opts: ServerOptions) -> TestServer {
        Self::start_at(host, None, None, opts)
    }

    fn start_with(cache: Option<WeightCache>) -> TestServer {
        Self::start_full(cache, None, Self::options())
    }

    fn start_full(
        cache: Option<WeightCache>,
        local: Option<LocalWeights>,
        opts: ServerOptions,
    ) -> TestServer {
        Self::start_at("127.0.0.1", cache, local, opts)
    }

    fn start_at(
        host: &str,
        cache: Option<WeightCache>,
        local: Option<LocalWeights>,
        opts: ServerOptions,
    ) -> TestServer {
        init_logging();
        let host = host.to_string();
        let config = Arc::new(SessionConfig {
            devices: vec![cpu_device()],
            n_threads: 1,
            cache,
            local,
        });
        let stats = Arc::new(Stats::default());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = stats.clone();
        let cfg = config.clone();
        let thread = std::thread::Builder::new()
            .name("rpc-test-server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .expect("server runtime");
                rt.block_on(async move {
                    let mut listeners = Vec::new();
                    for major in [Major::V7, Major::V8] {
                        let socket = server::bind(&host, 0).await.expect("bind the test port");
                        listeners.push(server::Listener::new(socket, major));
                    }
                    let addrs: Vec<SocketAddr> = listeners
                        .iter()
                        .map(|l| l.socket.local_addr().expect("local addr"))
                        .collect();
                    addr_tx.send((addrs[0], addrs[1])).expect("test gone");
                    let stop = async {
                        let _ = stop_rx.await;
                    };
                    let rdma = opts.rdma_config();
                    server::serve(listeners, cfg, opts, st, rdma, stop).await;
                });
            })
            .expect("spawn server thread");
        let (addr, addr8) = addr_rx.recv().expect("server thread failed to start");
        TestServer {
            addr,
            addr8,
            stats,
            config,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A server shared by every test of a test binary (lives until the process exits).
pub fn shared_server() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(TestServer::start)
}

/// A fresh temporary directory (removed by [`TempDir`]'s `Drop`).
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `$TMPDIR/rpc-tests-<tag>-<pid>-<nanos>`.
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let p =
            std::env::temp_dir().join(format!("rpc-tests-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` with a deadline of [`TIMEOUT`], panicking with `what` if it is exceeded.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(TIMEOUT, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {TIMEOUT:?}: {what}"),
    }
}

/// Waits (up to 20 s) until a server process accepts connections on `addr`; panics otherwise.
pub fn wait_listening(addr: SocketAddr) {
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "server did not start on {addr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// COMM_INIT on `c0` (rank 0, a client of the server on 127.0.0.1:`rank0_port`) and `c1`
/// (rank 1) as the stock client sends them: the link on `rank0_port` + 1000, both requests out
/// before either answer (rank 0 waits in accept for rank 1). Whether each joined.
pub async fn join_pair(c0: &mut Client, c1: &mut Client, rank0_port: u16) -> (bool, bool) {
    let port = u32::from(rank0_port) + u32::from(rpc_proto::COMM_PORT_OFFSET);
    let init = |rank, host: &str| rpc_client::CommInit {
        device: 0,
        rank,
        world: 2,
        port,
        host: rpc_client::CommInit::host_field(host).expect("host fits"),
    };
    let (ok0, ok1) = tokio::join!(
        c0.comm_init(init(0, "")),
        c1.comm_init(init(1, "127.0.0.1"))
    );
    (
        ok0.expect("COMM_INIT rank 0"),
        ok1.expect("COMM_INIT rank 1"),
    )
}

/// Connects and performs HELLO.
pub async fn connect(addr: SocketAddr) -> Client {
    within("connect", Client::connect(addr))
        .await
        .expect("connect + HELLO")
}

/// A TCP connection to `addr` from the local address `from` (on Linux every 127/8 address is
/// this machine's, and each is a peer of its own to the server's per-peer share), with a
/// receive buffer of `rcvbuf` bytes if given.
pub async fn tcp_from(
    addr: SocketAddr,
    from: std::net::IpAddr,
    rcvbuf: Option<u32>,
) -> std::io::Result<tokio::net::TcpStream> {
    let s = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n)?;
    }
    s.bind(SocketAddr::new(from, 0))?;
    within("connect", s.connect(addr)).await
}

/// Connects from the local address `from` (see [`tcp_from`]) and performs HELLO.
pub async fn connect_from(addr: SocketAddr, from: std::net::IpAddr) -> Client {
    let s = tcp_from(addr, from, None).await.expect("connect");
    let mut c = Client::new(rpc_transport::TcpTransport::new(s).expect("TCP transport"));
    within("HELLO", c.hello()).await.expect("HELLO");
    c
}

/// A server buffer with its base address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Handle from ALLOC_BUFFER.
    pub handle: u64,
    /// Base address from BUFFER_GET_BASE.
    pub base: u64,
    /// Size from ALLOC_BUFFER.
    pub size: u64,
}

impl Buf {
    /// Absolute address of `offset` in this buffer.
    pub fn at(&self, offset: u64) -> u64 {
        self.base + offset
    }

    /// An F32 tensor of shape `ne` at `offset` in this buffer.
    pub fn f32(&self, id: u64, ne: &[u32], offset: u64) -> TensorBuilder {
        TensorBuilder::f32(id)
            .ne(ne)
            .data(self.handle, self.at(offset))
    }
}

/// ALLOC_BUFFER on device 0 + BUFFER_GET_BASE; panics on failure.
pub async fn alloc(c: &mut Client, size: u64) -> Buf {
    let b = c
        .alloc_buffer(0, size)
        .await
        .expect("ALLOC_BUFFER")
        .expect("ALLOC_BUFFER returned a null handle");
    let base = c.buffer_get_base(b.handle).await.expect("BUFFER_GET_BASE");
    Buf {
        handle: b.handle,
        base,
        size: b.size,
    }
}

/// Little-endian bytes of `v`.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `f32`s from little-endian bytes (a trailing partial value is ignored).
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift64*), distinct for distinct seeds.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A full request frame with any command byte: command byte, `u64` LE size, payload
/// ([`rpc_proto::encode_raw`]).
pub fn frame(cmd: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    rpc_proto::encode_raw(cmd, payload, &mut v);
    v
}

/// Waits (at most [`TIMEOUT`]) until the server closes `c`; panics if it answers or stays open.
pub async fn expect_closed(c: &mut Client, what: &str) {
    match tokio::time::timeout(TIMEOUT, c.wait_closed()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{what}: expected the server to close the connection, got {e}"),
        Err(_) => panic!(
            "{what}: the server neither closed the connection nor answered within {TIMEOUT:?}"
        ),
    }
}

/// Asserts that a result is [`ClientError::Closed`].
pub fn assert_closed<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) {
    match r {
        Err(ClientError::Closed) => {}
        other => panic!("{what}: expected the connection to be closed, got {other:?}"),
    }
}

/// The tensors of `c = a + b` on `n` F32 values, laid out at offsets 0, 4n and 8n of `buf`
/// (ids 1, 2, 3). Returns `(a, b, c)`.
pub fn add_graph(buf: &Buf, n: u32) -> (RpcTensor, RpcTensor, RpcTensor) {
    let bytes = u64::from(n) * 4;
    let a = buf.f32(1, &[n], 0).name("a").build();
    let b = buf.f32(2, &[n], bytes).name("b").build();
    let c = buf
        .f32(3, &[n], 2 * bytes)
        .op(ops::ADD, &[])
        .srcs(&[1, 2])
        .flags(TENSOR_FLAG_COMPUTE)
        .name("c")
        .build();
    (a, b, c)
}

/// Checks that a brand-new client gets full, correct service: HELLO, DEVICE_COUNT, a buffer,
/// an `a + b` graph computed and read back, and a recompute with new inputs.
pub async fn assert_healthy(addr: SocketAddr) {
    within("health check", async {
        let mut c = connect(addr).await;
        assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
        let buf = alloc(&mut c, 3 * 64).await;
        let (a, b, sum) = add_graph(&buf, 16);
        let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let bv: Vec<f32> = (0..16).map(|i| 100.0 * i as f32).collect();
        c.set_tensor(&a, 0, &f32_bytes(&av), false)
            .await
            .expect("SET_TENSOR");
        c.set_tensor(&b, 0, &f32_bytes(&bv), false)
            .await
            .expect("SET_TENSOR");
        c.graph_compute(0, &[3], &[a, b, sum])
            .await
            .expect("GRAPH_COMPUTE");
        let got = bytes_f32(&c.get_tensor(&sum, 0, 64).await.expect("GET_TENSOR"));
        let want: Vec<f32> = (0..16).map(|i| 101.0 * i as f32).collect();
        assert_eq!(got, want, "health check: a + b");
        c.set_tensor(&b, 0, &f32_bytes(&av), false)
            .await
            .expect("SET_TENSOR");
        c.graph_recompute(0).await.expect("GRAPH_RECOMPUTE");
        let got = bytes_f32(&c.get_tensor(&sum, 0, 64).await.expect("GET_TENSOR"));
        let want: Vec<f32> = (0..16).map(|i| 2.0 * i as f32).collect();
        assert_eq!(got, want, "health check: recompute");
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// A server in a child process, for requests that might crash the whole server
// ---------------------------------------------------------------------------------------------

/// Environment variable that turns the child-server helper test into a server.
pub const CHILD_ENV: &str = "RPC_TESTS_CHILD_SERVER";

/// Body of the `#[ignore]`d helper test a test binary must define (named as passed to
/// [`ChildServer::start`]) to use [`ChildServer`]. Without [`CHILD_ENV`] it does nothing; with
/// it, it serves (in this process) until its stdin is closed, after printing its port.
pub fn child_server_main() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let s = TestServer::start();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "\nRPC_TESTS_PORT={}", s.addr.port());
        let _ = out.flush();
    }
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
}

/// An in-process server run in a child process (this test binary re-executed with only the
/// helper test), so that a request which aborts the server fails one test instead of killing
/// the whole test binary.
pub struct ChildServer {
    /// Where to connect.
    pub addr: SocketAddr,
    child: std::process::Child,
    stderr: Arc<std::sync::Mutex<String>>,
}

impl ChildServer {
    /// Starts the child; `helper` is the name of the helper test (see [`child_server_main`]).
    pub fn start(helper: &str) -> ChildServer {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let exe = std::env::current_exe().expect("current test binary");
        let mut child = Command::new(exe)
            .args([
                helper,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child server");
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(err) = child.stderr.take() {
            let sink = stderr.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        let out = child.stdout.take().expect("child stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // libtest prints `test <name> ... ` before the helper's own output.
                if let Some(port) = line.split("RPC_TESTS_PORT=").nth(1) {
                    if let (Some(tx), Ok(port)) = (tx.take(), port.trim().parse::<u16>()) {
                        let _ = tx.send(port);
                    }
                }
            }
        });
        let port = rx
            .recv_timeout(TIMEOUT)
            .expect("the child server did not report its port");
        ChildServer {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            stderr,
        }
    }

    /// Kills the server process (SIGKILL) and reaps it: a worker dying without a word.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Panics, with the child's stderr, if the child process has exited.
    pub fn assert_alive(&mut self, what: &str) {
        // Give a dying process a moment to be reaped.
        std::thread::sleep(Duration::from_millis(100));
        if let Ok(Some(status)) = self.child.try_wait() {
            let err = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
            let tail: Vec<&str> = err
                .lines()
                .filter(|l| !l.starts_with('#'))
                .take(20)
                .collect();
            panic!(
                "{what}: the server process died ({status}); its stderr:\n{}",
                tail.join("\n")
            );
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // Closing stdin ends the child; kill it if it does not exit promptly.
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workspace's root directory (the parent of this crate's).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// When [`release_server_bin`] runs `cargo build --release -p rpc-server --bin rpc-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildServer {
    /// Every time (cargo makes it a no-op when nothing changed).
    Always,
    /// Only when the binary does not exist yet.
    IfMissing,
    /// Never: the binary must already exist.
    Never,
}

/// `$CARGO_TARGET_DIR/release/rpc-server` (default `target/` of the workspace), built as `build`
/// says; panics if the build fails or the binary is then missing.
pub fn release_server_bin(build: BuildServer) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target.join("release").join("rpc-server");
    let run = match build {
        BuildServer::Always => true,
        BuildServer::IfMissing => !bin.exists(),
        BuildServer::Never => false,
    };
    if run {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = std::process::Command::new(cargo)
            .args([
                "build",
                "--release",
                "-p",
                "rpc-server",
                "--bin",
                "rpc-server",
            ])
            .current_dir(workspace_root())
            .status()
            .expect("cargo build");
        assert!(st.success(), "building rpc-server failed");
    }
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}
