//! A minimal TCP → RDMA byte relay for an unmodified, TCP-only llama.cpp client, over
//! `rpc_client::negotiate_client`: the client's HELLO is answered locally (7.0.0, zero caps: it stays on
//! TCP), the upstream connection offers RDMA with the lean marker (`--no-lean`: without) and
//! speaks whatever the server's reply says (lean, upstream framing, or TCP). Then bytes are
//! pumped both ways; every chunk read from the client becomes one message upstream.
//!
//! This is a measuring stand-in for `rpc-shim` (which parses frames, caches queries and batches
//! no-response commands); the VM's lean suite uses it when no shim is given. Byte streams only:
//! lean, upstream UC, or TCP (upstream RC needs per-part SENDs, so it refuses that answer).
//!
//! ```text
//! lean_relay --listen 127.0.0.1:50152 --worker 10.77.0.1:50052 [--flavor rc|uc] [--no-lean] [--tcp]
//! ```

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use rpc_client::negotiate_client;
use rpc_proto::Response;
use rpc_transport::rdma::negotiate::{ClientConfig, ClientConn};
use rpc_transport::rdma::Flavor;
use rpc_transport::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counters {
    sends: AtomicU64,
    recvs: AtomicU64,
}

async fn serve(
    mut client: TcpStream,
    worker: String,
    cfg: ClientConfig,
    n: Arc<Counters>,
) -> anyhow::Result<()> {
    client.set_nodelay(true)?;
    // The client's HELLO: | 14 | u64 24 | caps[24] |, answered locally with zero caps.
    let mut hello = [0u8; 9 + 24];
    client.read_exact(&mut hello).await?;
    anyhow::ensure!(
        hello[0] == rpc_proto::Command::Hello as u8,
        "first command is not HELLO"
    );
    let up = TcpStream::connect(&worker).await?;
    let neg = negotiate_client(up, &cfg).await?;
    let (major, minor, patch) = neg.client.server_version().unwrap_or_default();
    let mut rsp = Vec::new();
    Response::Hello {
        major,
        minor,
        patch,
        caps: [0; 24],
    }
    .encode(&mut rsp);
    client.write_all(&rsp).await?;
    let mut up = neg.client.into_transport();
    // Upstream's RC receiver needs one SEND per send_data() piece, which a byte relay cannot know.
    anyhow::ensure!(
        !matches!(up, ClientConn::Rc(_)),
        "the server answered upstream's RC framing; a byte relay cannot segment for it"
    );
    eprintln!(
        "lean_relay: upstream {} ({})",
        up.name(),
        neg.why_tcp.as_deref().unwrap_or("RDMA")
    );
    let (mut crd, mut cwr) = client.into_split();
    let mut cbuf = vec![0u8; 1 << 20];
    let mut ubuf = vec![0u8; 1 << 20];
    let r: anyhow::Result<()> = async {
        loop {
            tokio::select! {
                r = crd.read(&mut cbuf) => {
                    let k = r?;
                    if k == 0 { return Ok(()); }
                    up.send_message(&[&cbuf[..k]]).await?;
                }
                r = up.read(&mut ubuf) => {
                    let k = r?;
                    if k == 0 { return Ok(()); }
                    cwr.write_all(&ubuf[..k]).await?;
                }
            }
        }
    }
    .await;
    let (s, rc) = up.rdma_counters();
    n.sends.fetch_add(s, Relaxed);
    n.recvs.fetch_add(rc, Relaxed);
    eprintln!(
        "lean_relay: connection done ({}) sends={s} recvs={rc}",
        up.name()
    );
    r
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut listen = "127.0.0.1:50152".to_string();
    let mut worker = String::new();
    let mut cfg = ClientConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().unwrap_or_default(),
            "--worker" => worker = args.next().unwrap_or_default(),
            "--flavor" => {
                cfg.flavor = match args.next().as_deref() {
                    Some("uc") => Flavor::AppleUc,
                    _ => Flavor::LinuxRc,
                }
            }
            "--no-lean" => cfg.lean = false,
            "--tcp" => cfg.rdma = false,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(!worker.is_empty(), "--worker HOST:PORT is required");
    let l = TcpListener::bind(&listen).await?;
    eprintln!(
        "lean_relay: {listen} -> {worker} (flavor {:?}, lean {}, rdma {})",
        cfg.flavor, cfg.lean, cfg.rdma
    );
    let n = Arc::new(Counters::default());
    loop {
        let (c, _) = l.accept().await?;
        let (w, cfg, n) = (worker.clone(), cfg.clone(), n.clone());
        tokio::spawn(async move {
            if let Err(e) = serve(c, w, cfg, n).await {
                eprintln!("lean_relay: connection failed: {e:#}");
            }
        });
    }
}
