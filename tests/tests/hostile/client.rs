//! The suite's connection, [`Conn`]: `rpc_client::Client` (the workspace's one client) driven
//! from blocking test code, every call bounded by [`IO_TIMEOUT`]; frames that no client would
//! send are built with rpc-proto (`encode_raw`, `FrameHeader`) and go out as bytes. Plus the
//! server processes under test (ours, or the stock `ggml-rpc-server`).

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rpc_client::{Client, ClientError, Major, RpcTensor};
use rpc_proto::Request;
use rpc_tests::free_port;

/// Timeout for each read/write of a well-behaved exchange.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// The runtime every [`Conn`] of the test process runs on (calls block the calling thread).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("client runtime")
    })
}

fn io_error(e: ClientError) -> io::Error {
    match e {
        ClientError::Io(e) => e,
        ClientError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, ClientError::Closed),
        other => io::Error::other(other),
    }
}

/// Runs one client call to its end, or fails it after `t`.
fn block<T>(t: Duration, f: impl Future<Output = Result<T, ClientError>>) -> io::Result<T> {
    // (The timer is made inside the runtime.)
    match runtime().block_on(async { tokio::time::timeout(t, f).await }) {
        Ok(r) => r.map_err(io_error),
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// A buffer on the server: handle and base address (zero: none).
#[derive(Debug, Clone, Copy, Default)]
pub struct Buf {
    pub handle: u64,
    pub base: u64,
}

/// One connection.
pub struct Conn {
    c: Client,
}

impl Conn {
    /// Connects without HELLO.
    pub fn connect(addr: SocketAddr) -> io::Result<Conn> {
        let c = block(IO_TIMEOUT, Client::connect_raw(addr))?;
        Ok(Conn { c })
    }

    /// Connects from the local address `from` (on Linux another peer than 127.0.0.1 for the
    /// server's per-peer share; where it cannot be bound, from the default address), without
    /// HELLO.
    pub fn connect_from(addr: SocketAddr, from: std::net::IpAddr) -> io::Result<Conn> {
        let connect = async {
            let s = match addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            let _ = s.bind(SocketAddr::new(from, 0));
            let stream = s.connect(addr).await?;
            Ok::<_, io::Error>(Conn {
                c: Client::new(rpc_transport::TcpTransport::new(stream)?),
            })
        };
        match runtime().block_on(async { tokio::time::timeout(IO_TIMEOUT, connect).await }) {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }

    /// Connects and does the HELLO handshake; the server must speak 7.0.0.
    pub fn open(addr: SocketAddr) -> io::Result<Conn> {
        let mut c = Conn::connect(addr)?;
        let (major, minor, patch) = block(IO_TIMEOUT, c.c.hello())?;
        if c.c.major() != Major::V7 {
            return Err(io::Error::other(format!(
                "unexpected version {major}.{minor}.{patch}"
            )));
        }
        Ok(c)
    }

    /// Sends one request (no reply read).
    pub fn send(&mut self, req: &Request<'_>) -> io::Result<()> {
        block(IO_TIMEOUT, self.c.request(req))
    }

    /// Sends bytes as they are (a malformed frame, part of one, several).
    pub fn send_bytes(&mut self, b: &[u8]) -> io::Result<()> {
        block(IO_TIMEOUT, self.c.send_bytes(b))
    }

    /// ALLOC_BUFFER on device 0: the buffer, or `None` when the server answered a null handle.
    pub fn alloc(&mut self, size: u64) -> io::Result<Option<rpc_client::RemoteBuffer>> {
        block(IO_TIMEOUT, self.c.alloc_buffer(0, size))
    }

    /// A buffer of `size` bytes with its base address.
    pub fn buffer(&mut self, size: u64) -> io::Result<Buf> {
        let b = self
            .alloc(size)?
            .ok_or_else(|| io::Error::other("allocation failed"))?;
        let base = block(IO_TIMEOUT, self.c.buffer_get_base(b.handle))?;
        Ok(Buf {
            handle: b.handle,
            base,
        })
    }

    pub fn set_tensor(
        &mut self,
        t: impl Into<RpcTensor>,
        offset: u64,
        data: &[u8],
    ) -> io::Result<()> {
        block(
            IO_TIMEOUT,
            self.c.set_tensor(&t.into(), offset, data, false),
        )
    }

    pub fn get_tensor(&mut self, t: &RpcTensor, offset: u64, size: u64) -> io::Result<Vec<u8>> {
        block(IO_TIMEOUT, self.c.get_tensor(t, offset, size))
    }

    /// GRAPH_COMPUTE (7.0.0 layout).
    pub fn graph(&mut self, device: u32, nodes: &[u64], tensors: &[RpcTensor]) -> io::Result<()> {
        block(IO_TIMEOUT, self.c.graph_compute(device, nodes, tensors))
    }

    pub fn recompute(&mut self, device: u32) -> io::Result<()> {
        block(IO_TIMEOUT, self.c.graph_recompute(device))
    }

    /// DEVICE_COUNT round trip: the connection is alive and in sync.
    pub fn ping(&mut self) -> io::Result<u32> {
        block(IO_TIMEOUT, self.c.device_count())
    }

    /// Reads the reply to a request sent with [`Conn::send`]: its size prefix must be `len`.
    pub fn reply(&mut self, len: u64) -> io::Result<Vec<u8>> {
        block(IO_TIMEOUT, self.c.recv_response(len))
    }

    /// Whether the server closes this connection within `t` (EOF or reset), discarding anything
    /// it sends meanwhile.
    pub fn closed_within(&mut self, t: Duration) -> bool {
        use rpc_transport::Transport;
        let deadline = Instant::now() + t;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let read = self.c.transport_mut().read(&mut buf);
            let step = left.min(Duration::from_millis(500));
            match runtime().block_on(async { tokio::time::timeout(step, read).await }) {
                Ok(Ok(0)) => return true,
                Ok(Ok(_)) | Err(_) => continue,
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(Err(_)) => return true,
            }
        }
    }

    pub fn close(self) {
        let _ = block(IO_TIMEOUT, self.c.shutdown());
    }
}

/// Which server implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ours,
    Stock,
}

/// A server process on 127.0.0.1.
pub struct Server {
    pub kind: Kind,
    pub addr: SocketAddr,
    child: Child,
    bin: PathBuf,
    log: PathBuf,
    /// Extra flags (ours): default memory limits that make the allocation limit observable.
    args: Vec<String>,
}

impl Server {
    pub fn start(kind: Kind, bin: &Path, log: &Path) -> Server {
        let args = [
            "--max-alloc-per-connection",
            "512M",
            "--max-alloc-total",
            "1G",
        ];
        Server::start_with(kind, bin, log, &args)
    }

    pub fn start_with(kind: Kind, bin: &Path, log: &Path, args: &[&str]) -> Server {
        let mut s = Server {
            kind,
            addr: "127.0.0.1:0".parse().unwrap(),
            child: spawn_placeholder(),
            bin: bin.into(),
            log: log.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let port = free_port();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let mut cmd = Command::new(&self.bin);
        cmd.args(["-H", "127.0.0.1", "-t", "1"]);
        if self.kind == Kind::Ours {
            // This suite speaks 7.0.0 (as the stock 7.0.0 server it compares with): ours
            // serves it on its 7.0 listener, 8.0.0 on another port.
            cmd.args([
                "-p",
                &free_port().to_string(),
                "--proto7-port",
                &port.to_string(),
            ]);
            cmd.args(&self.args);
            // The slowloris case connects from 127.0.0.2 (`Conn::connect_from`), another peer
            // than the bystanders'. Where that address is not this machine's (macOS has only
            // 127.0.0.1), its connections share 127.0.0.1's share of the slots and would lock
            // the bystanders out by design: 127.0.0.1 is exempt there, as loopback once was.
            if std::net::TcpListener::bind("127.0.0.2:0").is_err() {
                cmd.args(["--peer-share-exempt", "127.0.0.1"]);
            }
            cmd.env("RUST_LOG", "warn");
        } else {
            cmd.args(["-p", &port.to_string()]);
        }
        // A crashing stock server would otherwise spend seconds printing a backtrace via gdb.
        cmd.env("GGML_NO_BACKTRACE", "1");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.addr = format!("127.0.0.1:{port}").parse().unwrap();
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{:?} server did not start",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The stock server serves one connection at a time: let it finish the probe above.
        std::thread::sleep(Duration::from_millis(50));
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Starts a new process if this one died (the stock server after a crash).
    pub fn restart_if_dead(&mut self) -> bool {
        if self.alive() {
            return false;
        }
        self.spawn();
        true
    }

    pub fn child_id(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal (`TERM`, `INT`) to the process.
    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill -s {sig} failed");
    }

    /// Waits up to `t` for the process to exit.
    pub fn wait_exit(&mut self, t: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if t0.elapsed() > t {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_placeholder() -> Child {
    Command::new("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn true")
}
