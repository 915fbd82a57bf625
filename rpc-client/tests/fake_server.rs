//! The client against a scripted fake server: handshake checks, exact bytes on the wire,
//! response-size checks and error mapping.

use rpc_client::{Client, ClientError, TensorBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Starts a one-connection fake server running `script`, returns its address.
async fn fake<F, Fut>(script: F) -> std::net::SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        script(s).await;
    });
    addr
}

async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    s.read_exact(&mut v).await.unwrap();
    v
}

/// Reads the client's HELLO (checking it) and answers `major.minor.patch` with `caps`.
async fn answer_hello(s: &mut TcpStream, v: [u8; 3], caps: [u8; 24]) {
    let req = read_n(s, 9 + 24).await;
    assert_eq!(req[0], 14, "HELLO command byte");
    assert_eq!(&req[1..9], &24u64.to_le_bytes(), "HELLO size");
    assert_eq!(&req[9..], &[0u8; 24], "client caps are all zero");
    let mut rsp = 28u64.to_le_bytes().to_vec();
    rsp.extend_from_slice(&[v[0], v[1], v[2], 0]);
    rsp.extend_from_slice(&caps);
    s.write_all(&rsp).await.unwrap();
}

#[tokio::test]
async fn hello_accepts_7_0_any_patch_and_keeps_caps() {
    let mut caps = [0u8; 24];
    caps[0] = 9;
    let addr = fake(move |mut s| async move {
        answer_hello(&mut s, [7, 0, 5], caps).await;
        let _ = read_n(&mut s, 1).await;
    })
    .await;
    let c = Client::connect(addr).await.unwrap();
    assert_eq!(c.server_version(), Some((7, 0, 5)));
    assert_eq!(c.server_caps(), &caps);
}

#[tokio::test]
async fn hello_rejects_other_versions() {
    for v in [[7u8, 1, 0], [8, 1, 0], [9, 0, 0], [6, 0, 0], [5, 1, 0]] {
        let addr = fake(move |mut s| async move { answer_hello(&mut s, v, [0; 24]).await }).await;
        match Client::connect(addr).await {
            Err(ClientError::VersionMismatch {
                major,
                minor,
                patch,
            }) => {
                assert_eq!([major, minor, patch], v)
            }
            other => panic!("{v:?}: {other:?}"),
        }
    }
}

/// Both majors are spoken: the connection takes the one the server announces.
#[tokio::test]
async fn hello_accepts_both_majors() {
    for (v, major) in [
        ([7u8, 0, 3], rpc_client::Major::V7),
        ([8, 0, 0], rpc_client::Major::V8),
    ] {
        let addr = fake(move |mut s| async move { answer_hello(&mut s, v, [0; 24]).await }).await;
        let c = Client::connect(addr).await.unwrap();
        assert_eq!(c.major(), major);
        assert_eq!(c.server_version(), Some((v[0], v[1], v[2])));
    }
}

#[tokio::test]
async fn wrong_response_size_is_a_bad_response() {
    let addr = fake(|mut s| async move {
        answer_hello(&mut s, [7, 0, 0], [0; 24]).await;
        assert_eq!(read_n(&mut s, 9).await, [15, 0, 0, 0, 0, 0, 0, 0, 0]);
        // DEVICE_COUNT answered with 8 bytes instead of 4.
        s.write_all(&8u64.to_le_bytes()).await.unwrap();
        s.write_all(&[1, 0, 0, 0, 0, 0, 0, 0]).await.unwrap();
        let _ = read_n(&mut s, 1).await;
    })
    .await;
    let mut c = Client::connect(addr).await.unwrap();
    assert!(matches!(
        c.device_count().await,
        Err(ClientError::BadResponse(_))
    ));
}

#[tokio::test]
async fn wrong_get_tensor_size_is_a_bad_response() {
    let addr = fake(|mut s| async move {
        answer_hello(&mut s, [7, 0, 0], [0; 24]).await;
        let req = read_n(&mut s, 9 + 312).await;
        assert_eq!(req[0], 8);
        s.write_all(&15u64.to_le_bytes()).await.unwrap();
        s.write_all(&[0; 15]).await.unwrap();
        let _ = read_n(&mut s, 1).await;
    })
    .await;
    let mut c = Client::connect(addr).await.unwrap();
    let t = TensorBuilder::f32(1).ne(&[4]).build();
    assert!(matches!(
        c.get_tensor(&t, 0, 16).await,
        Err(ClientError::BadResponse(_))
    ));
}

#[tokio::test]
async fn server_closing_is_reported_as_closed() {
    let addr = fake(|mut s| async move {
        answer_hello(&mut s, [7, 0, 0], [0; 24]).await;
        let _ = read_n(&mut s, 9).await;
        // Close without answering.
    })
    .await;
    let mut c = Client::connect(addr).await.unwrap();
    let e = c.device_count().await.unwrap_err();
    assert!(e.is_closed(), "{e:?}");
}

#[tokio::test]
async fn no_response_commands_only_write_and_frames_are_exact() {
    let t = TensorBuilder::f32(0x77).ne(&[2]).data(0xAB, 0x1000).build();
    let tw = t.to_wire();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let addr = fake(move |mut s| async move {
        answer_hello(&mut s, [7, 0, 0], [0; 24]).await;
        // FREE_BUFFER, BUFFER_CLEAR, SET_TENSOR, GRAPH_COMPUTE, GRAPH_RECOMPUTE, INIT_TENSOR,
        // MEMSET_TENSOR, then DEVICE_COUNT: only the last one is answered.
        let mut want = Vec::new();
        want.extend([4u8]);
        want.extend(8u64.to_le_bytes());
        want.extend(0x1234u64.to_le_bytes());
        want.extend([5u8]);
        want.extend(9u64.to_le_bytes());
        want.extend(0x1234u64.to_le_bytes());
        want.extend([0xCD]);
        want.extend([6u8]);
        want.extend((305u64 + 8).to_le_bytes());
        want.extend(tw);
        want.extend([1u8]);
        want.extend(4u64.to_le_bytes());
        want.extend([1, 2, 3, 4, 5, 6, 7, 8]);
        want.extend([10u8]);
        want.extend((12u64 + 8 + 296).to_le_bytes());
        want.extend(0u32.to_le_bytes());
        want.extend(1u32.to_le_bytes());
        want.extend(0x77u64.to_le_bytes());
        want.extend(1u32.to_le_bytes());
        want.extend(tw);
        want.extend([16u8]);
        want.extend(4u64.to_le_bytes());
        want.extend(0u32.to_le_bytes());
        want.extend([12u8]);
        want.extend(296u64.to_le_bytes());
        want.extend(tw);
        want.extend([17u8]);
        want.extend(313u64.to_le_bytes());
        want.extend(tw);
        want.extend(2u64.to_le_bytes());
        want.extend(6u64.to_le_bytes());
        want.extend([0xEE]);
        want.extend([15u8]);
        want.extend(0u64.to_le_bytes());
        let got = read_n(&mut s, want.len()).await;
        assert_eq!(got, want);
        s.write_all(&4u64.to_le_bytes()).await.unwrap();
        s.write_all(&3u32.to_le_bytes()).await.unwrap();
        tx.send(()).unwrap();
        let _ = read_n(&mut s, 1).await;
    })
    .await;
    let mut c = Client::connect(addr).await.unwrap();
    c.free_buffer(0x1234).await.unwrap();
    c.buffer_clear(0x1234, 0xCD).await.unwrap();
    c.set_tensor(&t, 4, &[1, 2, 3, 4, 5, 6, 7, 8], true)
        .await
        .unwrap();
    c.graph_compute(0, &[0x77], &[t]).await.unwrap();
    c.graph_recompute(0).await.unwrap();
    c.init_tensor(&t).await.unwrap();
    c.memset_tensor(&t, 2, 6, 0xEE).await.unwrap();
    assert_eq!(c.device_count().await.unwrap(), 3);
    rx.await.unwrap();
}
