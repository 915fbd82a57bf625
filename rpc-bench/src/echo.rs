//! The floor of a round trip: a server in a child process that speaks just enough of the
//! protocol for [`crate::latency`] and does no work (`latency --echo-floor`'s help says how).

use std::net::{TcpListener, TcpStream};

use rpc_proto::{check_frame, FrameHeader, Limits, Major, Request, Response};
use rpc_transport::tcp::DEFAULT_POLL_WINDOW;
use rpc_transport::{BlockingTcpTransport, Transport};

use anyhow::Context;
use bench_report::process::ServerProcess;

/// Largest GET_TENSOR the floor answers (the latency cases go up to a few MiB).
const MAX_GET: u64 = 256 << 20;

/// Starts this executable as `rpc-bench echo-floor`, which announces its port.
pub fn spawn_child() -> anyhow::Result<ServerProcess> {
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("echo-floor");
    ServerProcess::announced(cmd).context("echo floor")
}

/// `rpc-bench echo-floor`: serves on an ephemeral loopback port, prints it, runs until killed
/// (one thread per connection).
pub fn run_child() -> anyhow::Result<()> {
    use std::io::Write;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming().flatten() {
        let conn = move || serve(stream).map_err(|e| tracing::debug!("echo floor connection: {e}"));
        let spawned = std::thread::Builder::new()
            .name("echo-conn".into())
            .spawn(conn);
        if let Err(e) = spawned {
            tracing::warn!("echo floor: cannot start a connection thread: {e}");
        }
    }
    Ok(())
}

fn serve(stream: TcpStream) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut t = BlockingTcpTransport::new(stream, None, DEFAULT_POLL_WINDOW)?;
    rt.block_on(async move {
        let limits = Limits::default();
        let mut payload = Vec::new();
        let mut zeros = Vec::new();
        let mut out = Vec::with_capacity(64);
        loop {
            let mut hb = [0u8; rpc_proto::FRAME_HEADER_SIZE];
            if t.read(&mut hb[..1]).await? == 0 {
                return Ok(());
            }
            t.read_exact(&mut hb[1..]).await?;
            let h = FrameHeader::decode(&hb);
            let cmd = check_frame(Major::CURRENT, &h, &limits)?;
            let size = usize::try_from(h.size)?;
            anyhow::ensure!(h.size <= MAX_GET + 4096, "request too large for the floor");
            payload.resize(size, 0);
            t.read_exact(&mut payload).await?;
            let reply = match Request::decode(Major::CURRENT, cmd, &payload, &limits)? {
                Request::Hello { .. } => {
                    Response::hello(Major::CURRENT, [0; rpc_proto::CONN_CAPS_SIZE])
                }
                Request::AllocBuffer { size, .. } => Response::AllocBuffer {
                    remote_ptr: 1,
                    remote_size: size,
                },
                Request::BufferGetBase { .. } => Response::BufferGetBase { base_ptr: 1 << 40 },
                Request::DeviceCount => Response::DeviceCount { count: 1 },
                Request::GetTensor { size, .. } => {
                    anyhow::ensure!(size <= MAX_GET, "GET_TENSOR too large for the floor");
                    let n = size as usize;
                    if zeros.len() < n {
                        zeros.resize(n, 0);
                    }
                    t.send_message(&[&size.to_le_bytes(), &zeros[..n]]).await?;
                    continue;
                }
                r if !cmd.has_response() => {
                    drop(r);
                    continue;
                }
                _ => anyhow::bail!("the echo floor does not answer {}", cmd.name()),
            };
            out.clear();
            reply.encode(&mut out);
            t.send_message(&[&out[..8], &out[8..]]).await?;
        }
    })
}
