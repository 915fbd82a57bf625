//! `--metrics HOST:PORT`: the server's counters in Prometheus text format at `GET /metrics`.
//!
//! A minimal HTTP/1.x responder on the listener's runtime: one request per connection, headers
//! bounded to 8 KiB and 5 s, at most 16 scrapes at once; anything but `GET /metrics` (or `/`) gets
//! 404 or 405. Rendering reads atomics only: a scrape never waits for a computing connection.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rpc_session::SessionConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::rdma::RdmaConfig;
use crate::stats::{HistogramSnapshot, Stats};

/// Everything a scrape reads.
pub struct Sources {
    /// Counters, and the memory budget once the server serves.
    pub stats: Arc<Stats>,
    pub rdma: Arc<RdmaConfig>,
    /// The weight cache lives here.
    pub config: Arc<SessionConfig>,
}

const MAX_HEADER: usize = 8 << 10;
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
const MAX_SCRAPES: usize = 16;

/// Serves scrapes until the runtime ends.
pub async fn serve(listener: TcpListener, src: Arc<Sources>) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let (s, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: too many scrapes at once; dropping one");
            continue;
        };
        let src = src.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(REQUEST_DEADLINE, answer(s, &src)).await {
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics: request failed"),
                Err(_) => tracing::debug!(%peer, "metrics: request too slow; dropped"),
                Ok(Ok(())) => {}
            }
        });
    }
}

async fn answer(mut s: TcpStream, src: &Sources) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_HEADER {
            return respond(&mut s, "431 Request Header Fields Too Large", "").await;
        }
    }
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics" | "/") => respond(&mut s, "200 OK", &render(src)).await,
        ("GET", _) => respond(&mut s, "404 Not Found", "see /metrics\n").await,
        _ => respond(&mut s, "405 Method Not Allowed", "GET /metrics\n").await,
    }
}

async fn respond(s: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

/// A Prometheus text exposition being written.
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let val = val
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{val}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {v}");
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: u64) {
        self.family(name, kind, help);
        self.sample(name, &[], v);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        self.family(name, "histogram", help);
        for (le, n) in &h.buckets {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            self.sample(&format!("{name}_bucket"), &[("le", &le)], n);
        }
        self.sample(&format!("{name}_sum"), &[], h.sum_seconds);
        self.sample(&format!("{name}_count"), &[], h.count);
    }
}

/// The exposition text of everything in `src`.
pub fn render(src: &Sources) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let mut o = Out(String::with_capacity(8 << 10));
    let st = &src.stats;
    o.one(
        "rpc_connections_total",
        "counter",
        "Client connections accepted since start.",
        st.connections.load(Relaxed),
    );
    o.one(
        "rpc_connections_open",
        "gauge",
        "Client connections open now.",
        st.active.load(Relaxed),
    );
    o.one(
        "rpc_connections_closed_with_error_total",
        "counter",
        "Connections closed on an error: a malformed or refused request, an I/O error, a deadline.",
        st.closed_with_error.load(Relaxed),
    );
    o.one(
        "rpc_sessions_killed_total",
        "counter",
        "Session processes the front killed for a control-line violation (a malformed, \
         out-of-order or flooding message, a link request outside the comm policy).",
        st.sessions_killed.load(Relaxed),
    );
    o.one(
        "rpc_connections_evicted_total",
        "counter",
        "Connections that held nothing (no buffer, graph or RDMA queue pair), closed to admit a \
         new client when every --max-connections slot was taken.",
        st.evicted.load(Relaxed),
    );
    o.family(
        "rpc_connections_refused_total",
        "counter",
        "Connections closed before they were served: address not in --allow, the peer's share of \
         the slots taken, or no HELLO within the HELLO deadline.",
    );
    for why in crate::stats::Refusal::ALL {
        o.sample(
            "rpc_connections_refused_total",
            &[("reason", why.name())],
            st.refused(why),
        );
    }
    let cmds = st.snapshot();
    o.family(
        "rpc_commands_total",
        "counter",
        "Commands served, per command.",
    );
    for (c, n, _, _) in &cmds {
        o.sample("rpc_commands_total", &[("command", c.name())], n);
    }
    o.family(
        "rpc_command_received_bytes_total",
        "counter",
        "Request bytes received per command (9-byte frame header included).",
    );
    for (c, _, i, _) in &cmds {
        o.sample(
            "rpc_command_received_bytes_total",
            &[("command", c.name())],
            i,
        );
    }
    o.family(
        "rpc_command_sent_bytes_total",
        "counter",
        "Reply bytes sent per command (8-byte size prefix included).",
    );
    for (c, _, _, out) in &cmds {
        o.sample(
            "rpc_command_sent_bytes_total",
            &[("command", c.name())],
            out,
        );
    }
    let tr = st.transports();
    o.family(
        "rpc_transport_received_bytes_total",
        "counter",
        "Request bytes received per transport (TCP, RDMA per flavor, lean framing).",
    );
    for (t, i, _) in &tr {
        o.sample("rpc_transport_received_bytes_total", &[("transport", t)], i);
    }
    o.family(
        "rpc_transport_sent_bytes_total",
        "counter",
        "Reply bytes sent per transport.",
    );
    for (t, _, out) in &tr {
        o.sample("rpc_transport_sent_bytes_total", &[("transport", t)], out);
    }
    o.histogram(
        "rpc_graph_compute_seconds",
        "Wall time of each GRAPH_COMPUTE and GRAPH_RECOMPUTE (validation, graph build, compute).",
        &st.compute.snapshot(),
    );
    o.histogram(
        "rpc_token_seconds",
        "Per generated token, server side: from a GRAPH_RECOMPUTE's arrival to the end of the GET_TENSOR reply after it.",
        &st.token.snapshot(),
    );
    o.histogram(
        "rpc_token_non_compute_seconds",
        "The part of rpc_token_seconds that is not the recompute: reading, copying out, replying.",
        &st.token_non_compute.snapshot(),
    );
    o.histogram(
        "rpc_comm_allreduce_seconds",
        "Wall time of each COMM_ALLREDUCE: the exchange with the peer server (waiting for it included) and the sum.",
        &st.allreduce.snapshot(),
    );
    o.one(
        "rpc_comm_sent_bytes_total",
        "counter",
        "Bytes sent to peer servers on tensor split's server-to-server links (COMM_ALLREDUCE).",
        st.comm_sent.load(std::sync::atomic::Ordering::Relaxed),
    );
    o.one(
        "rpc_comm_received_bytes_total",
        "counter",
        "Bytes received from peer servers on tensor split's server-to-server links.",
        st.comm_received.load(std::sync::atomic::Ordering::Relaxed),
    );
    if let Some(b) = st.budget() {
        let limits = b.limits();
        o.one(
            "rpc_memory_allocated_bytes",
            "gauge",
            "Memory held against the limits by all connections: buffers, stored graphs, request bodies being read.",
            b.used(),
        );
        o.family(
            "rpc_memory_limit_bytes",
            "gauge",
            "Buffer memory limits (--max-alloc-per-connection, --max-alloc-total).",
        );
        o.sample(
            "rpc_memory_limit_bytes",
            &[("scope", "per_connection")],
            limits.per_connection,
        );
        o.sample(
            "rpc_memory_limit_bytes",
            &[("scope", "total")],
            limits.total,
        );
        o.one(
            "rpc_memory_refused_allocations_total",
            "counter",
            "ALLOC_BUFFERs answered with a failed allocation because a limit would have been exceeded.",
            b.refused(),
        );
    }
    if let Some(c) = &src.config.cache {
        let c = c.counters();
        for (name, help, v) in [
            (
                "rpc_cache_hits_total",
                "SET_TENSOR_HASH answered from the weight cache.",
                &c.hits,
            ),
            (
                "rpc_cache_misses_total",
                "SET_TENSOR_HASH not in the cache (the client uploads the tensor).",
                &c.misses,
            ),
            (
                "rpc_cache_served_bytes_total",
                "Bytes written into tensors from the cache.",
                &c.bytes_served,
            ),
            (
                "rpc_cache_stores_total",
                "Entries written to the cache.",
                &c.stores,
            ),
            (
                "rpc_cache_stored_bytes_total",
                "Bytes written to the cache.",
                &c.bytes_stored,
            ),
        ] {
            o.one(name, "counter", help, v.load(Relaxed));
        }
    }
    if let Some(l) = &src.config.local {
        let c = l.counters();
        for (name, help, v) in [
            (
                "rpc_gguf_hits_total",
                "SET_TENSOR_HASH answered from a local GGUF file (--gguf).",
                &c.hits,
            ),
            (
                "rpc_gguf_served_bytes_total",
                "Bytes read from local GGUF files into tensors.",
                &c.bytes_served,
            ),
            (
                "rpc_gguf_failed_total",
                "SET_TENSOR_HASH whose hash the --gguf index knew but could not serve (file changed or unreadable): the client uploads.",
                &c.failed,
            ),
        ] {
            o.one(name, "counter", help, v.load(Relaxed));
        }
    }
    o.family(
        "rpc_rdma_activations_total",
        "counter",
        "Connections switched to RDMA, per kind (upstream rc/uc framing, our lean framing).",
    );
    for (k, n) in src.rdma.activations() {
        o.sample("rpc_rdma_activations_total", &[("kind", k)], n);
    }
    o.family(
        "rpc_rdma_fallbacks_total",
        "counter",
        "Clients that offered RDMA and stayed on TCP, per reason.",
    );
    for (r, n) in src.rdma.fallbacks() {
        o.sample("rpc_rdma_fallbacks_total", &[("reason", r)], n);
    }
    o.0
}
