//! The lean framing on the in-process fake fabric (which enforces the hardware rules): round
//! trips of many sizes over RC and UC queue pairs, SEND counts, Apple's frame rule, credits
//! (rxe-style UC that drops a SEND finding no receive), and faults: a dropped or corrupted frame
//! fails the connection and never delivers corrupt bytes.

use std::time::{Duration, Instant};

use rpc_transport::rdma::fake::{self, FakeQp, Fault, Rules};
use rpc_transport::rdma::lean::{Geometry, LeanLink, LEAN_HEADER, RESERVE};
use rpc_transport::rdma::{Flavored, RdmaTransport};
use rpc_transport::Transport;
use tokio::net::{TcpListener, TcpStream};

type Lean = RdmaTransport<LeanLink<FakeQp>>;

fn lean_pair(g: Geometry, rules: Rules) -> (Lean, Lean) {
    let max_inline = if rules == Rules::Rc { 256 } else { 0 };
    let (a, b) = fake::pair(rules, g.tx_size(), g.rx_size(), max_inline);
    let mut a = LeanLink::new(a, g);
    let mut b = LeanLink::new(b, g);
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    (
        RdmaTransport::new(a, None, "lean"),
        RdmaTransport::new(b, None, "lean"),
    )
}

fn both() -> [(Geometry, Rules); 2] {
    [(Geometry::RC, Rules::Rc), (Geometry::UC, Rules::Uc)]
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect()
}

const T: Duration = Duration::from_secs(20);

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

/// A stock-shaped request (cmd, size, payload as separate parts) and a response (size, payload).
async fn round_trip(mut client: Lean, mut server: Lean, req: usize, rsp: usize) -> (Lean, Lean) {
    let body = pattern(req, 7);
    let srv = tokio::spawn(async move {
        let mut cmd = [0u8; 1];
        server.read_exact(&mut cmd).await.unwrap();
        let mut sz = [0u8; 8];
        server.read_exact(&mut sz).await.unwrap();
        let mut data = vec![0u8; u64::from_le_bytes(sz) as usize];
        server.read_exact(&mut data).await.unwrap();
        let reply = pattern(rsp, 3);
        server
            .send_message(&[&(reply.len() as u64).to_le_bytes(), &reply])
            .await
            .unwrap();
        (cmd[0], data, server)
    });
    client
        .send_message(&[&[6u8], &(req as u64).to_le_bytes(), &body])
        .await
        .unwrap();
    let mut sz = [0u8; 8];
    client.read_exact(&mut sz).await.unwrap();
    let mut reply = vec![0u8; u64::from_le_bytes(sz) as usize];
    client.read_exact(&mut reply).await.unwrap();
    let (cmd, data, server) = tokio::time::timeout(T, srv).await.unwrap().unwrap();
    assert_eq!(cmd, 6);
    assert_eq!(data, body, "request of {req} bytes");
    assert_eq!(reply, pattern(rsp, 3), "response of {rsp} bytes");
    (client, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_of_many_sizes_rc_and_uc() {
    let uc = Geometry::UC.payload();
    let rc = Geometry::RC.payload();
    let sizes = [
        0,
        1,
        9,
        20,
        296,
        uc - 9,
        uc - 8,
        uc,
        uc + 1,
        2 * uc,
        65536,
        rc - 9,
        rc,
        rc + 1,
        (1 << 20) + 3,
        3 << 20,
    ];
    for (g, rules) in both() {
        let (mut c, mut s) = lean_pair(g, rules);
        for (i, &req) in sizes.iter().enumerate() {
            let rsp = sizes[sizes.len() - 1 - i];
            (c, s) = tokio::time::timeout(T, round_trip(c, s, req, rsp))
                .await
                .expect("bounded");
        }
        // Every SEND fitted one receive (the fabric fails the receive otherwise) and nothing
        // waited for a receive.
        assert_eq!(c.link().verbs().unmatched(), 0, "{rules:?}");
        assert_eq!(s.link().verbs().unmatched(), 0, "{rules:?}");
    }
}

#[tokio::test]
async fn rc_one_send_per_burst_and_inline_when_small() {
    let (mut c, mut s) = lean_pair(Geometry::RC, Rules::Rc);
    // A token as the stock client sends it: 9 SET_TENSOR, GRAPH_RECOMPUTE, GET_TENSOR, every
    // one as cmd / size / payload parts; relayed as one burst (one message).
    let set = pattern(305 + 1024, 1);
    let mut parts: Vec<&[u8]> = Vec::new();
    let size_set = (set.len() as u64).to_le_bytes();
    let size8 = 8u64.to_le_bytes();
    let size_get = 313u64.to_le_bytes();
    let get = [0u8; 313];
    for _ in 0..9 {
        parts.extend([&[6u8][..], &size_set[..], &set[..]]);
    }
    parts.extend([&[17u8][..], &size8[..], &[0u8; 8][..]]);
    parts.extend([&[7u8][..], &size_get[..], &get[..]]);
    let total: usize = parts.iter().map(|p| p.len()).sum();
    c.send_message(&parts).await.unwrap();
    assert_eq!(c.counters().0, 1, "one SEND for the whole burst");
    let mut got = vec![0u8; total];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, parts.concat());
    // The response: size prefix and payload in one SEND (upstream RC: 2 + pieces).
    let logits = pattern(28 * 1024, 9);
    s.send_message(&[&(logits.len() as u64).to_le_bytes(), &logits])
        .await
        .unwrap();
    assert_eq!(s.counters().0, 1);
    let mut r = vec![0u8; 8 + logits.len()];
    c.read_exact(&mut r).await.unwrap();
    assert_eq!(&r[8..], &logits[..]);
    // A small message goes inline.
    let before = c.link().verbs().sent_inline();
    c.send_message(&[&[15u8], &0u64.to_le_bytes()])
        .await
        .unwrap();
    assert_eq!(c.link().verbs().sent_inline(), before + 1);
    let mut b = [0u8; 9];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(b[0], 15);
}

#[tokio::test]
async fn uc_frames_are_one_4k_frame_each_with_no_padding() {
    let (mut c, mut s) = lean_pair(Geometry::UC, Rules::Uc);
    let p = Geometry::UC.payload();
    for n in [1usize, 9, 1000, p, p + 1, 10 * 1024, 100 * 1024 + 17] {
        let (sends0, bytes0) = c.link().verbs().sent();
        let msg = pattern(n, n as u8);
        c.send_message(&[&msg]).await.unwrap();
        let (sends1, bytes1) = c.link().verbs().sent();
        let frames = n.div_ceil(p) as u64;
        assert_eq!(sends1 - sends0, frames, "{n} bytes");
        // Exactly the payload plus one header per frame: no padding at all.
        assert_eq!(
            bytes1 - bytes0,
            (n + LEAN_HEADER * frames as usize) as u64,
            "{n} bytes"
        );
        let mut got = vec![0u8; n];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg);
    }
    // (Apple's equal-frame-count rule is enforced by the fabric: a violation fails the receive.)
    assert_eq!(c.link().verbs().unmatched(), 0);
}

/// Both directions at once, random sizes, pipelined messages without replies, a slow reader:
/// on rxe-style UC (a SEND without a receive is lost) credits must keep every SEND matched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_never_overrun_under_pipelined_bursts() {
    for (g, rules) in both() {
        let (mut c, mut s) = lean_pair(g, rules);
        c.link().verbs().drop_unmatched(true);
        let mut seed = 0x1234_5678u32;
        let mut rnd = move |m: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed % m
        };
        let sizes: Vec<usize> = (0..600)
            .map(|i| {
                if i % 50 == 0 {
                    300_000 + rnd(5000) as usize
                } else {
                    rnd(12_000) as usize
                }
            })
            .collect();
        let expect: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, i as u8))
            .collect();
        let exp2 = expect.clone();
        // The server reads every message slowly and answers every 100th (so credits must also
        // come back in credit-only frames).
        let srv = tokio::spawn(async move {
            for (i, e) in exp2.iter().enumerate() {
                if i % 7 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let mut sz = [0u8; 8];
                s.read_exact(&mut sz).await.unwrap();
                let mut m = vec![0u8; u64::from_le_bytes(sz) as usize];
                s.read_exact(&mut m).await.unwrap();
                assert_eq!(&m, e, "message {i}");
                if i % 100 == 99 {
                    let echo = pattern(m.len() % 20_000, 1);
                    s.send_message(&[&(echo.len() as u64).to_le_bytes(), &echo])
                        .await
                        .unwrap();
                }
            }
            s
        });
        for (i, m) in expect.iter().enumerate() {
            c.send_message(&[&(m.len() as u64).to_le_bytes(), m])
                .await
                .unwrap();
            if i % 100 == 99 {
                let mut sz = [0u8; 8];
                c.read_exact(&mut sz).await.unwrap();
                let mut e = vec![0u8; u64::from_le_bytes(sz) as usize];
                c.read_exact(&mut e).await.unwrap();
                assert_eq!(e, pattern(m.len() % 20_000, 1));
            }
        }
        let mut s = tokio::time::timeout(Duration::from_secs(60), srv)
            .await
            .expect("bounded")
            .unwrap();
        assert_eq!(
            c.link().verbs().unmatched(),
            0,
            "{rules:?}: a SEND found no receive"
        );
        assert_eq!(
            s.link().verbs().unmatched(),
            0,
            "{rules:?}: a SEND found no receive"
        );
        assert!(c.link().credits() <= g.rx_slots && s.link().credits() <= g.rx_slots);
        assert!(
            c.link().stats().credit_frames + s.link().stats().credit_frames > 0,
            "credits were returned"
        );
    }
}

/// A sender far ahead of a reader that does not read: it blocks on credits (never overruns),
/// and completes once the reader catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sender_blocks_on_credits_until_the_reader_reads() {
    let (mut c, mut s) = lean_pair(Geometry::UC, Rules::Uc);
    c.link().verbs().drop_unmatched(true);
    let n = 3000usize;
    let msg = pattern(2000, 5);
    let m2 = msg.clone();
    let snd = tokio::spawn(async move {
        for _ in 0..n {
            c.send_message(&[&m2]).await.unwrap();
        }
        c
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!snd.is_finished(), "the sender must wait for credits");
    let mut buf = vec![0u8; msg.len()];
    for _ in 0..n {
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, msg);
    }
    let mut c = tokio::time::timeout(T, snd)
        .await
        .expect("bounded")
        .unwrap();
    assert_eq!(c.link().verbs().unmatched(), 0);
}

/// Reads whatever arrives until an error; returns the bytes delivered and the error.
async fn drain(t: &mut Lean, max: usize) -> (Vec<u8>, std::io::Error) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), t.read(&mut buf))
            .await
            .expect("error within bounded time")
        {
            Ok(0) => panic!("end of stream instead of an error"),
            Ok(k) => {
                got.extend_from_slice(&buf[..k]);
                assert!(got.len() <= max);
            }
            Err(e) => return (got, e),
        }
    }
}

#[tokio::test]
async fn dropped_frame_is_detected_and_nothing_after_it_is_delivered() {
    let (mut c, mut s) = lean_pair(Geometry::UC, Rules::Uc);
    let msg = pattern(5 * Geometry::UC.payload(), 3);
    let p = Geometry::UC.payload();
    // Frame #0 arrives, frame #1 is lost, #2.. arrive.
    c.send_message(&[&msg[..p]]).await.unwrap();
    c.link().verbs().inject(Fault::Drop);
    c.send_message(&[&msg[p..]]).await.unwrap();
    let (got, e) = drain(&mut s, msg.len()).await;
    assert!(e.to_string().contains("frame lost"), "{e}");
    assert!(
        got.len() <= p && got[..] == msg[..got.len()],
        "only bytes of frames before the loss are delivered"
    );
    // Sticky: the connection stays failed.
    assert!(s.read(&mut [0u8; 1]).await.is_err());
    assert!(s.send_message(&[b"x"]).await.is_err());
}

#[tokio::test]
async fn lost_last_frame_is_revealed_by_the_idle_keepalive() {
    let (mut c, mut s) = lean_pair(Geometry::UC, Rules::Uc);
    c.link().verbs().inject(Fault::Drop);
    c.send_message(&[b"the only frame"]).await.unwrap();
    // The client waits for a reply that never comes; while idle it sends a keepalive whose
    // sequence number shows the server that a frame is missing.
    let cli = tokio::spawn(async move {
        let mut b = [0u8; 1];
        let _ = c.read(&mut b).await;
    });
    let start = Instant::now();
    let mut b = [0u8; 14];
    let e = tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut b))
        .await
        .expect("detected within bounded time")
        .unwrap_err();
    assert!(e.to_string().contains("frame lost"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
    cli.abort();
}

#[tokio::test]
async fn corrupted_payload_is_detected_and_never_delivered() {
    for (g, rules) in both() {
        let (mut c, mut s) = lean_pair(g, rules);
        let p = g.payload().min(10_000);
        let msg = pattern(3 * p, 8);
        c.send_message(&[&msg[..p]]).await.unwrap();
        // Flip one payload byte of the second frame.
        c.link().verbs().inject(Fault::Corrupt(LEAN_HEADER + 100));
        c.send_message(&[&msg[p..]]).await.unwrap();
        let (got, e) = drain(&mut s, msg.len()).await;
        assert!(
            e.to_string().contains("checksum mismatch"),
            "{rules:?}: {e}"
        );
        // (Good frames checked in the same poll as the corrupt one may be withheld too.)
        assert!(
            got.len() <= p && got[..] == msg[..got.len()],
            "{rules:?}: bytes of the corrupt frame were delivered"
        );
    }
}

#[tokio::test]
async fn corrupted_header_fields_are_detected() {
    // magic, seq, len, credits, crc itself
    for (at, needle) in [
        (0usize, "bad frame magic"),
        (5, "checksum"),
        (9, "checksum"),
        (12, "checksum"),
        (18, "checksum"),
    ] {
        let (mut c, mut s) = lean_pair(Geometry::UC, Rules::Uc);
        c.link().verbs().inject(Fault::Corrupt(at));
        c.send_message(&[b"hello world"]).await.unwrap();
        let (got, e) = drain(&mut s, 11).await;
        assert!(e.to_string().contains(needle), "byte {at}: {e}");
        assert!(got.is_empty());
    }
}

#[tokio::test]
async fn error_completion_fails_the_connection() {
    for (g, rules) in both() {
        let (mut c, _s) = lean_pair(g, rules);
        c.link().verbs().inject(Fault::Error);
        c.send_message(&[b"x"]).await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Err(e) = c.send_message(&[b"y"]).await {
                    return e;
                }
            }
        })
        .await
        .unwrap();
        assert!(e.to_string().contains("completion error"), "{rules:?}: {e}");
    }
}

#[tokio::test]
async fn dead_peer_is_detected_through_the_tcp_anchor() {
    let (c, s) = lean_pair(Geometry::UC, Rules::Uc);
    let (ta, tb) = tcp_pair().await;
    let mut c = RdmaTransport::new(c.into_link(), Some(ta), "lean");
    let mut s = s;
    s.link().verbs().kill();
    c.send_message(&[b"ping"]).await.unwrap();
    drop(tb);
    let mut one = [0u8; 1];
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), c.read(&mut one))
            .await
            .expect("bounded")
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn idle_links_send_keepalives_within_the_reserve_and_stay_usable() {
    let (mut c, mut s) = lean_pair(Geometry::RC, Rules::Rc);
    let srv = tokio::spawn(async move {
        let mut req = [0u8; 5];
        s.read_exact(&mut req).await.unwrap();
        s.send_message(&[&req]).await.unwrap();
        s
    });
    tokio::time::sleep(Duration::from_millis(1600)).await;
    c.send_message(&[b"hello"]).await.unwrap();
    let mut r = [0u8; 5];
    c.read_exact(&mut r).await.unwrap();
    assert_eq!(&r, b"hello", "keepalives are invisible to the byte stream");
    let mut s = srv.await.unwrap();
    let k = s.keepalives();
    assert!(k >= 1, "keepalives: {k}");
    assert!(s.link().credits() >= RESERVE);
    assert_eq!(s.link().stats().credit_frames, k);
}

#[tokio::test]
async fn flavored_reports_posted_frames() {
    let (mut c, _s) = lean_pair(Geometry::UC, Rules::Uc);
    let l = c.link();
    assert!(l.flushed());
    assert_eq!(l.write_part(b"abc").unwrap(), 3);
    assert!(!l.flushed(), "an open frame is not posted yet");
    l.end_message().unwrap();
    assert!(l.flushed());
}
