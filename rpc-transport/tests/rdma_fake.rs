//! The RDMA flavors on the in-process fake fabric, which enforces the hardware rules.

use std::time::Duration;

use rpc_transport::rdma::fake::{self, FakeDevice, FakeQp, Fault, Rules};
use rpc_transport::rdma::rc::{RcLink, RC_RX_SIZE, RC_TX_SIZE};
use rpc_transport::rdma::uc::{UcLink, UC_RING_SIZE, UC_STRIDE};
use rpc_transport::rdma::RdmaTransport;
use rpc_transport::Transport;
use tokio::net::{TcpListener, TcpStream};

fn rc_pair() -> (RcLink<FakeQp>, RcLink<FakeQp>, [(u64, u64); 0]) {
    let (a, b) = fake::pair(Rules::Rc, RC_TX_SIZE, RC_RX_SIZE, 256);
    let mut a = RcLink::new(a);
    let mut b = RcLink::new(b);
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    (a, b, [])
}

fn uc_pair() -> (UcLink<FakeQp>, UcLink<FakeQp>) {
    let (a, b) = fake::pair(Rules::Uc, UC_RING_SIZE, UC_RING_SIZE, 0);
    let mut a = UcLink::new(a);
    let mut b = UcLink::new(b);
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    (a, b)
}

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A request shaped like the stock client's (cmd, size, payload as separate send_data calls)
/// and a response (size, payload), through both flavors.
async fn request_response<A, B>(
    mut client: RdmaTransport<A>,
    mut server: RdmaTransport<B>,
    payload: usize,
) where
    A: rpc_transport::rdma::Flavored + 'static,
    B: rpc_transport::rdma::Flavored + 'static,
{
    let body = pattern(payload, 7);
    let size = (payload as u64).to_le_bytes();
    let srv = tokio::spawn(async move {
        let mut cmd = [0u8; 1];
        server.read_exact(&mut cmd).await.unwrap();
        let mut sz = [0u8; 8];
        server.read_exact(&mut sz).await.unwrap();
        let mut data = vec![0u8; u64::from_le_bytes(sz) as usize];
        server.read_exact(&mut data).await.unwrap();
        let reply = pattern(1 << 20, 3);
        server
            .send_message(&[&(reply.len() as u64).to_le_bytes(), &reply])
            .await
            .unwrap();
        (cmd[0], data, server)
    });
    client.send_message(&[&[6u8], &size, &body]).await.unwrap();
    let mut sz = [0u8; 8];
    client.read_exact(&mut sz).await.unwrap();
    let mut reply = vec![0u8; u64::from_le_bytes(sz) as usize];
    client.read_exact(&mut reply).await.unwrap();
    let (cmd, data, _server) = tokio::time::timeout(Duration::from_secs(10), srv)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cmd, 6);
    assert_eq!(data, body);
    assert_eq!(reply, pattern(1 << 20, 3));
}

#[tokio::test]
async fn rc_request_response_small_and_large() {
    for payload in [0usize, 64, 28 * 1024, 300 * 1024, 3 << 20] {
        let (a, b, _) = rc_pair();
        request_response(
            RdmaTransport::new(a, None, "rc"),
            RdmaTransport::new(b, None, "rc"),
            payload,
        )
        .await;
    }
}

#[tokio::test]
async fn rc_one_send_per_part_and_256k_pieces() {
    let (a, b, _) = rc_pair();
    let mut t = RdmaTransport::new(a, None, "rc");
    let mut r = RdmaTransport::new(b, None, "rc");
    let big = pattern(600 * 1024, 1);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 1 + 8 + 600 * 1024];
        r.read_exact(&mut buf).await.unwrap();
        (buf, r)
    });
    t.send_message(&[&[1u8], &[2u8; 8], &big]).await.unwrap();
    let (buf, _r) = reader.await.unwrap();
    assert_eq!(&buf[9..], &big[..]);
    // 1 + 1 + ceil(600 KiB / 256 KiB) = 5 SENDs, never coalesced.
    assert_eq!(t.counters().0, 5);
    // Empty parts produce no SEND (upstream: a zero-length payload sends nothing).
    t.send_message(&[&[0u8; 8], &[]]).await.unwrap();
    assert_eq!(t.counters().0, 6);
}

#[tokio::test]
async fn uc_request_response_small_and_large() {
    for payload in [0usize, 64, 28 * 1024, 131_064, 131_065, 3 << 20] {
        let (a, b) = uc_pair();
        request_response(
            RdmaTransport::new(a, None, "uc"),
            RdmaTransport::new(b, None, "uc"),
            payload,
        )
        .await;
    }
}

#[tokio::test]
async fn uc_every_send_is_a_full_stride() {
    let (a, b) = uc_pair();
    let mut t = RdmaTransport::new(a, None, "uc");
    let mut r = RdmaTransport::new(b, None, "uc");
    t.send_message(&[&[1u8], &[0u8; 8]]).await.unwrap(); // 9 bytes: coalesced into one frame
    let (sends, bytes) = t.link().verbs().sent();
    assert_eq!(sends, 1);
    assert_eq!(bytes, UC_STRIDE as u64);
    let mut buf = [0u8; 9];
    r.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf[0], 1);
}

#[tokio::test]
async fn uc_stride_rule_violation_fails_the_receiver() {
    // A peer that sends a 4 KiB frame into a 128 KiB receive breaks Apple's equal-frame rule.
    let (mut a, b) = fake::pair(Rules::Uc, UC_RING_SIZE, UC_RING_SIZE, 0);
    let mut b = UcLink::new(b);
    b.post_all_receives().unwrap();
    use rpc_transport::rdma::verbs::Verbs;
    a.send_mem()[..8].copy_from_slice(&[0x47, 0x45, 0x53, 0x52, 1, 0, 0, 0]);
    a.post_send(0, 0, 4096, false).unwrap();
    let mut r = RdmaTransport::new(b, None, "uc");
    let mut buf = [0u8; 1];
    let e = tokio::time::timeout(Duration::from_secs(5), r.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("completion error"), "{e}");
}

#[tokio::test]
async fn uc_corrupted_header_is_detected() {
    let (a, b) = uc_pair();
    a_inject_and_expect(a, b, Fault::Corrupt(0), "bad frame magic").await;
}

async fn a_inject_and_expect(a: UcLink<FakeQp>, b: UcLink<FakeQp>, f: Fault, needle: &str) {
    let mut t = RdmaTransport::new(a, None, "uc");
    t.link().verbs().inject(f);
    t.send_message(&[b"hello"]).await.unwrap();
    let mut r = RdmaTransport::new(b, None, "uc");
    let mut buf = [0u8; 5];
    let e = tokio::time::timeout(Duration::from_secs(5), r.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains(needle), "{e}");
}

#[tokio::test]
async fn send_completion_error_fails_the_connection() {
    let (a, _b, _) = rc_pair();
    let mut t = RdmaTransport::new(a, None, "rc");
    t.link().verbs().inject(Fault::Error);
    t.send_message(&[b"x"]).await.unwrap();
    // The failed completion surfaces at the next progress.
    let e = tokio::time::timeout(Duration::from_secs(5), t.send_message(&[b"y"]))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("completion error"), "{e}");
}

#[tokio::test]
async fn rc_dead_peer_fails_the_sender() {
    let (a, b, _) = rc_pair();

    let mut t = RdmaTransport::new(a, None, "rc");
    let mut b = b;
    b.verbs().kill();
    t.send_message(&[b"x"]).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), t.send_message(&[b"y"]))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("completion error"), "{e}");
}

#[tokio::test]
async fn uc_silent_peer_death_is_detected_through_the_tcp_anchor() {
    let (a, b) = uc_pair();
    let (ca, cb) = tcp_pair().await;
    let mut t = RdmaTransport::new(a, Some(ca), "uc");
    let mut b = b;
    b.verbs().kill();
    // UC: sends to a dead peer complete fine, and nothing ever arrives...
    t.send_message(&[b"ping"]).await.unwrap();
    // ...but the peer's process is gone, so its TCP socket is closed.
    drop(cb);
    let mut buf = [0u8; 4];
    let start = std::time::Instant::now();
    // A bare read reports end of stream, like a TCP close...
    let mut one = [0u8; 1];
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), t.read(&mut one))
            .await
            .expect("bounded")
            .unwrap(),
        0
    );
    // ...and a read inside a message is an error.
    let e = tokio::time::timeout(Duration::from_secs(5), t.read_exact(&mut buf))
        .await
        .expect("bounded")
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn queue_pair_budget_is_enforced() {
    let dev = FakeDevice::new(10);
    let held: Vec<_> = (0..10).map(|_| dev.reserve().unwrap()).collect();
    let e = dev.reserve().err().expect("11th QP must fail");
    assert_eq!(e.raw_os_error(), Some(16));
    drop(held);
    assert_eq!(dev.active_qps(), 0);
    assert!(dev.reserve().is_ok());
}

#[tokio::test]
async fn uc_idle_link_gets_bounded_keepalives_that_the_peer_ignores() {
    let (a, b) = uc_pair();
    let mut server = RdmaTransport::new(a, None, "uc");
    let mut client = RdmaTransport::new(b, None, "uc");
    // The server waits for a request for 2.5 s: the link is idle, so it sends keepalives,
    // at most 4 while the client does not read.
    let srv = tokio::spawn(async move {
        let mut req = [0u8; 5];
        server.read_exact(&mut req).await.unwrap();
        server.send_message(&[&req]).await.unwrap();
        server
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    client.send_message(&[b"hello"]).await.unwrap();
    let mut reply = [0u8; 5];
    client.read_exact(&mut reply).await.unwrap();
    assert_eq!(
        &reply, b"hello",
        "keepalive frames must be invisible to the byte stream"
    );
    let server = srv.await.unwrap();
    let k = server.keepalives();
    assert!((1..=4).contains(&k), "keepalives sent: {k}");
}
