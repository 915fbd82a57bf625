//! The floor of a round trip: servers in a child process that speak just enough of the protocol
//! for [`crate::latency`] and do no work (`latency --echo-floor`'s help says how). Two of them:
//! [`Floor::Transport`] over the TCP code rpc-server uses (`rpc_transport::BlockingTcpTransport`
//! with its default poll policy), and [`Floor::Blocking`], a plain blocking `read`/`write` loop
//! on one thread per connection, the shape of the stock server, with no code of this repository
//! between the socket and the answer.

use std::io::{BufReader, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};

use rpc_proto::{check_frame, FrameHeader, Limits, Major, Request, Response};
use rpc_transport::tcp::DEFAULT_POLL_WINDOW;
use rpc_transport::{BlockingTcpTransport, Transport};

use anyhow::Context;
use bench_report::process::ServerProcess;

/// Largest GET_TENSOR the floor answers (the latency cases go up to a few MiB).
const MAX_GET: u64 = 256 << 20;

/// Which floor a child serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Floor {
    /// rpc-server's TCP code (`BlockingTcpTransport`, default poll policy).
    Transport,
    /// Plain blocking reads and one vectored write per reply, as the stock server does.
    Blocking,
}

impl Floor {
    /// The row label in reports.
    pub fn label(self) -> &'static str {
        match self {
            Floor::Transport => "echo (our transport)",
            Floor::Blocking => "echo (blocking)",
        }
    }
}

/// Starts this executable as `rpc-bench echo-floor --floor F`, which announces its port.
pub fn spawn_child(floor: Floor) -> anyhow::Result<ServerProcess> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("echo-floor");
    cmd.arg("--floor");
    cmd.arg(match floor {
        Floor::Transport => "transport",
        Floor::Blocking => "blocking",
    });
    ServerProcess::announced(cmd).context("echo floor")
}

/// `rpc-bench echo-floor`: serves on an ephemeral loopback port, prints it, runs until killed
/// (one thread per connection).
pub fn run_child(floor: Floor) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming().flatten() {
        let conn = move || {
            let r = match floor {
                Floor::Transport => serve_transport(stream),
                Floor::Blocking => serve_blocking(stream),
            };
            r.map_err(|e| tracing::debug!("echo floor connection: {e}"))
        };
        let spawned = std::thread::Builder::new()
            .name("echo-conn".into())
            .spawn(conn);
        if let Err(e) = spawned {
            tracing::warn!("echo floor: cannot start a connection thread: {e}");
        }
    }
    Ok(())
}

/// What the floor answers to one request.
enum Answer {
    /// Nothing (a command without a reply).
    None,
    /// An encoded response (size prefix included).
    Encoded,
    /// A GET_TENSOR reply of this many zero bytes: its size prefix encoded (by rpc-proto's
    /// [`Response::header`]), the bytes sent from a buffer of zeros kept for the purpose (not
    /// copied into the reply).
    Zeros(usize),
}

/// Decodes a request and encodes its do-nothing answer into `out`.
fn answer(h: &FrameHeader, payload: &[u8], out: &mut Vec<u8>) -> anyhow::Result<Answer> {
    let limits = Limits::default();
    let cmd = check_frame(Major::CURRENT, h, &limits)?;
    let reply = match Request::decode(Major::CURRENT, cmd, payload, &limits)? {
        Request::Hello { .. } => Response::hello(Major::CURRENT, [0; rpc_proto::CONN_CAPS_SIZE]),
        Request::AllocBuffer { size, .. } => Response::AllocBuffer {
            remote_ptr: 1,
            remote_size: size,
        },
        Request::BufferGetBase { .. } => Response::BufferGetBase { base_ptr: 1 << 40 },
        Request::DeviceCount => Response::DeviceCount { count: 1 },
        Request::GetAlignment { .. } => Response::GetAlignment { alignment: 32 },
        Request::GetTensor { size, .. } => {
            anyhow::ensure!(size <= MAX_GET, "GET_TENSOR too large for the floor");
            out.clear();
            out.extend_from_slice(&Response::header(size));
            return Ok(Answer::Zeros(size as usize));
        }
        _ if !cmd.has_response() => return Ok(Answer::None),
        _ => anyhow::bail!("the echo floor does not answer {}", cmd.name()),
    };
    out.clear();
    reply.encode(out);
    Ok(Answer::Encoded)
}

/// The size a header announces, bounded for the floor.
fn payload_size(h: &FrameHeader) -> anyhow::Result<usize> {
    anyhow::ensure!(h.size <= MAX_GET + 4096, "request too large for the floor");
    Ok(usize::try_from(h.size)?)
}

fn serve_transport(stream: TcpStream) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut t = BlockingTcpTransport::new(stream, None, DEFAULT_POLL_WINDOW)?;
    rt.block_on(async move {
        let (mut payload, mut zeros, mut out) = (Vec::new(), Vec::new(), Vec::with_capacity(64));
        loop {
            let mut hb = [0u8; rpc_proto::FRAME_HEADER_SIZE];
            if t.read(&mut hb[..1]).await? == 0 {
                return Ok(());
            }
            t.read_exact(&mut hb[1..]).await?;
            let h = FrameHeader::decode(&hb);
            payload.resize(payload_size(&h)?, 0);
            t.read_exact(&mut payload).await?;
            match answer(&h, &payload, &mut out)? {
                Answer::None => {}
                Answer::Encoded => t.send_message(&[&out[..8], &out[8..]]).await?,
                Answer::Zeros(n) => {
                    if zeros.len() < n {
                        zeros.resize(n, 0);
                    }
                    t.send_message(&[&out, &zeros[..n]]).await?;
                }
            }
        }
    })
}

fn serve_blocking(stream: TcpStream) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    let mut wr = stream.try_clone()?;
    let mut rd = BufReader::with_capacity(256 << 10, stream);
    let (mut payload, mut zeros, mut out) = (Vec::new(), Vec::new(), Vec::with_capacity(64));
    loop {
        let mut hb = [0u8; rpc_proto::FRAME_HEADER_SIZE];
        match rd.read_exact(&mut hb) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        }
        let h = FrameHeader::decode(&hb);
        payload.resize(payload_size(&h)?, 0);
        rd.read_exact(&mut payload)?;
        match answer(&h, &payload, &mut out)? {
            Answer::None => {}
            Answer::Encoded => write_all(&mut wr, &[&out])?,
            Answer::Zeros(n) => {
                if zeros.len() < n {
                    zeros.resize(n, 0);
                }
                write_all(&mut wr, &[&out, &zeros[..n]])?;
            }
        }
    }
}

/// Writes every part, one `writev` per try.
fn write_all(w: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut store: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let mut slices = &mut store[..];
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
