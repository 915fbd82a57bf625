//! `--metrics` (`rpc-server/src/metrics.rs`): the exposition a scrape returns after a known
//! sequence of commands matches what the client sent, command by command; the HTTP responder
//! answers GET /metrics and nothing else.

use std::collections::HashMap;
use std::sync::Arc;

use rpc_server::metrics::{self, Sources};
use rpc_server::rdma::{RdmaConfig, TransportMode};
use rpc_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `name{labels}` → value, from an exposition (comments skipped).
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("sample line");
            (k.to_string(), v.parse().expect("sample value"))
        })
        .collect()
}

fn sources(s: &TestServer) -> Arc<Sources> {
    Arc::new(Sources {
        stats: s.stats.clone(),
        rdma: Arc::new(RdmaConfig::new(TransportMode::Tcp, Default::default(), 8)),
        config: s.config.clone(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_match_what_the_client_sent() {
    let dir = TempDir::new("metrics");
    let s = TestServer::start_with_cache(&dir.0);
    let mut c = connect(s.addr).await;
    let n = 16u32;
    let bytes = u64::from(n) * 4;
    let buf = alloc(&mut c, 3 * bytes).await;
    let (a, b, sum) = add_graph(&buf, n);
    let av: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let data = f32_bytes(&av);
    // A miss, an upload that is cached, then a hit.
    let hash = rpc_proto::fnv1a64(&data);
    assert!(!c
        .set_tensor_hash(&a, 0, hash)
        .await
        .expect("SET_TENSOR_HASH"));
    c.set_tensor(&a, 0, &data, true).await.expect("SET_TENSOR");
    c.set_tensor(&b, 0, &data, false).await.expect("SET_TENSOR");
    assert!(c
        .set_tensor_hash(&a, 0, hash)
        .await
        .expect("SET_TENSOR_HASH"));
    c.graph_compute(0, &[3], &[a, b, sum])
        .await
        .expect("GRAPH_COMPUTE");
    // Three "tokens": recompute, read the result.
    for _ in 0..3 {
        c.graph_recompute(0).await.expect("GRAPH_RECOMPUTE");
        c.get_tensor(&sum, 0, bytes).await.expect("GET_TENSOR");
    }
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);

    let m = parse(&metrics::render(&sources(&s)));
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("no sample {k}"));
    let cmd = |name: &str, what: &str| get(&format!("rpc_{what}{{command=\"{name}\"}}"));
    for (name, count) in [
        ("HELLO", 1.0),
        ("ALLOC_BUFFER", 1.0),
        ("BUFFER_GET_BASE", 1.0),
        ("SET_TENSOR", 2.0),
        ("SET_TENSOR_HASH", 2.0),
        ("GRAPH_COMPUTE", 1.0),
        ("GRAPH_RECOMPUTE", 3.0),
        ("GET_TENSOR", 3.0),
        ("DEVICE_COUNT", 1.0),
    ] {
        assert_eq!(cmd(name, "commands_total"), count, "{name}");
    }
    // Bytes on the wire: 9-byte frame header + payload in; 8-byte size prefix + payload out.
    let set_frame = 9 + rpc_proto::SET_TENSOR_HEADER_SIZE as u64 + bytes;
    assert_eq!(
        cmd("SET_TENSOR", "command_received_bytes_total"),
        (2 * set_frame) as f64
    );
    assert_eq!(
        cmd("GET_TENSOR", "command_sent_bytes_total"),
        (3 * (8 + bytes)) as f64
    );
    assert_eq!(cmd("SET_TENSOR", "command_sent_bytes_total"), 0.0);
    assert_eq!(cmd("DEVICE_COUNT", "command_sent_bytes_total"), 12.0);
    // Everything went over TCP: the per-transport totals are the per-command sums.
    let total = |what: &str| -> f64 {
        m.iter()
            .filter(|(k, _)| k.starts_with(&format!("rpc_command_{what}_bytes_total{{")))
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!(
        get("rpc_transport_received_bytes_total{transport=\"TCP\"}"),
        total("received")
    );
    assert_eq!(
        get("rpc_transport_sent_bytes_total{transport=\"TCP\"}"),
        total("sent")
    );
    // Computes and tokens: 1 compute + 3 recomputes; 3 tokens, each at least its recompute.
    assert_eq!(get("rpc_graph_compute_seconds_count"), 4.0);
    assert_eq!(get("rpc_token_seconds_count"), 3.0);
    assert_eq!(get("rpc_token_non_compute_seconds_count"), 3.0);
    assert_eq!(get("rpc_token_seconds_bucket{le=\"+Inf\"}"), 3.0);
    assert!(get("rpc_token_seconds_sum") >= get("rpc_token_non_compute_seconds_sum"));
    // Memory and cache.
    // The buffer and the stored graph (a few KiB of ggml context) are both charged.
    let held = get("rpc_memory_allocated_bytes");
    assert!(
        held > buf.size as f64 && held < (buf.size + (1 << 20)) as f64,
        "{held} held for a {}-byte buffer and one small graph",
        buf.size
    );
    assert_eq!(get("rpc_cache_misses_total"), 1.0);
    assert_eq!(get("rpc_cache_hits_total"), 1.0);
    assert_eq!(get("rpc_cache_served_bytes_total"), bytes as f64);
    assert_eq!(get("rpc_cache_stores_total"), 1.0);
    assert_eq!(get("rpc_connections_open"), 1.0);
    assert_eq!(get("rpc_rdma_fallbacks_total{reason=\"budget\"}"), 0.0);
}

async fn http(addr: std::net::SocketAddr, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = String::new();
    within("metrics reply", s.read_to_string(&mut out))
        .await
        .expect("read");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_answers_get_metrics_only() {
    let s = TestServer::start();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(metrics::serve(l, sources(&s)));
    let ok = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
    let body = ok.split("\r\n\r\n").nth(1).unwrap();
    let len: usize = ok
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(body.len(), len);
    assert!(parse(body).contains_key("rpc_connections_total"));
    let nope = http(addr, "GET /secret HTTP/1.1\r\n\r\n").await;
    assert!(nope.starts_with("HTTP/1.1 404"), "{nope}");
    let post = http(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n", "a".repeat(20_000));
    let big = http(addr, &huge).await;
    assert!(big.starts_with("HTTP/1.1 431"), "{big}");
}
