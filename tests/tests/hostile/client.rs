//! A blocking raw-protocol client that can send anything, well-formed or not, plus the server
//! processes under test (ours, or the stock `ggml-rpc-server`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_proto::RpcTensor;
use rpc_tests::free_port;

pub const HELLO: u8 = 14;
pub const ALLOC_BUFFER: u8 = 0;
pub const GET_ALIGNMENT: u8 = 1;
pub const BUFFER_GET_BASE: u8 = 3;
pub const FREE_BUFFER: u8 = 4;
pub const BUFFER_CLEAR: u8 = 5;
pub const SET_TENSOR: u8 = 6;
pub const GET_TENSOR: u8 = 8;
pub const COPY_TENSOR: u8 = 9;
pub const GRAPH_COMPUTE: u8 = 10;
pub const INIT_TENSOR: u8 = 12;
pub const GET_ALLOC_SIZE: u8 = 13;
pub const DEVICE_COUNT: u8 = 15;
pub const GRAPH_RECOMPUTE: u8 = 16;
pub const MEMSET_TENSOR: u8 = 17;

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_K: u32 = 12;
pub const Q8_K: u32 = 15;
pub const Q4_0: u32 = 2;
pub const I32: u32 = 26;
pub const I64: u32 = 27;
pub const FLAG_COMPUTE: i32 = 16;

/// Timeout for each read/write of a well-behaved exchange.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// One connection.
pub struct Conn {
    s: TcpStream,
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(Conn { s })
    }

    /// Connects and does the HELLO handshake.
    pub fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let mut c = Conn::connect(addr)?;
        c.send(HELLO, &[0u8; 24])?;
        let r = c.recv(28)?;
        if r[0] != 7 {
            return Err(std::io::Error::other(format!(
                "unexpected version {}.{}.{}",
                r[0], r[1], r[2]
            )));
        }
        Ok(c)
    }

    pub fn send_raw(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.s.write_all(b)
    }

    pub fn send(&mut self, cmd: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut f = Vec::with_capacity(9 + payload.len());
        f.push(cmd);
        f.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        f.extend_from_slice(payload);
        self.s.write_all(&f)
    }

    /// Reads one response and checks its size.
    pub fn recv(&mut self, want: usize) -> std::io::Result<Vec<u8>> {
        let mut h = [0u8; 8];
        self.s.read_exact(&mut h)?;
        let n = u64::from_le_bytes(h);
        if n != want as u64 {
            return Err(std::io::Error::other(format!(
                "response of {n} bytes, expected {want}"
            )));
        }
        let mut v = vec![0u8; want];
        self.s.read_exact(&mut v)?;
        Ok(v)
    }

    pub fn alloc(&mut self, size: u64) -> std::io::Result<(u64, u64)> {
        let mut p = 0u32.to_le_bytes().to_vec();
        p.extend_from_slice(&size.to_le_bytes());
        self.send(ALLOC_BUFFER, &p)?;
        let r = self.recv(16)?;
        Ok((
            u64::from_le_bytes(r[..8].try_into().unwrap()),
            u64::from_le_bytes(r[8..].try_into().unwrap()),
        ))
    }

    pub fn base(&mut self, handle: u64) -> std::io::Result<u64> {
        self.send(BUFFER_GET_BASE, &handle.to_le_bytes())?;
        Ok(u64::from_le_bytes(self.recv(8)?.try_into().unwrap()))
    }

    /// A buffer of `size` bytes: (handle, base address).
    pub fn buffer(&mut self, size: u64) -> std::io::Result<(u64, u64)> {
        let (h, _) = self.alloc(size)?;
        if h == 0 {
            return Err(std::io::Error::other("allocation failed"));
        }
        Ok((h, self.base(h)?))
    }

    pub fn set_tensor(&mut self, t: &RpcTensor, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut p = t.to_wire().to_vec();
        p.push(0);
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(data);
        self.send(SET_TENSOR, &p)
    }

    pub fn get_tensor(
        &mut self,
        t: &RpcTensor,
        offset: u64,
        size: u64,
    ) -> std::io::Result<Vec<u8>> {
        let mut p = t.to_wire().to_vec();
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        self.send(GET_TENSOR, &p)?;
        self.recv(size as usize)
    }

    pub fn graph(
        &mut self,
        device: u32,
        nodes: &[u64],
        tensors: &[RpcTensor],
    ) -> std::io::Result<()> {
        self.send(GRAPH_COMPUTE, &graph_payload(device, nodes, tensors))
    }

    pub fn recompute(&mut self, device: u32) -> std::io::Result<()> {
        self.send(GRAPH_RECOMPUTE, &device.to_le_bytes())
    }

    /// DEVICE_COUNT round trip: the connection is alive and in sync.
    pub fn ping(&mut self) -> std::io::Result<u32> {
        self.send(DEVICE_COUNT, &[])?;
        Ok(u32::from_le_bytes(self.recv(4)?.try_into().unwrap()))
    }

    /// Whether the server closes this connection within `t` (EOF or reset), discarding anything
    /// it sends meanwhile.
    pub fn closed_within(&mut self, t: Duration) -> bool {
        let deadline = Instant::now() + t;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self
                .s
                .set_read_timeout(Some(left.min(Duration::from_millis(500))));
            match self.s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(_) => return true,
            }
        }
    }

    pub fn close(self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
}

pub fn graph_payload(device: u32, nodes: &[u64], tensors: &[RpcTensor]) -> Vec<u8> {
    let mut p = device.to_le_bytes().to_vec();
    p.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
    for n in nodes {
        p.extend_from_slice(&n.to_le_bytes());
    }
    p.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
    for t in tensors {
        p.extend_from_slice(&t.to_wire());
    }
    p
}

/// Contiguous strides for a tensor of type size `ts` (block size 1) or `(ts, blck)`.
pub fn strides(ts: u32, blck: u32, ne: [u32; 4]) -> [u32; 4] {
    let nb0 = ts;
    let nb1 = nb0 * (ne[0] / blck);
    let nb2 = nb1 * ne[1];
    let nb3 = nb2 * ne[2];
    [nb0, nb1, nb2, nb3]
}

/// An f32 (or other 4-byte type) tensor of shape `ne` at `data` in `buffer`.
pub fn t4(id: u64, ty: u32, ne: [u32; 4], buffer: u64, data: u64) -> RpcTensor {
    RpcTensor::new(id, ty)
        .with_shape(ne, strides(4, 1, ne))
        .with_buffer(buffer, data)
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
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
