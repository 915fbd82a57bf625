//! The server's command loop (`connection::run`, the code that runs after an RDMA activation)
//! over the lean framing on the fake fabric, driven by `rpc-client` through a relay (TCP → lean,
//! as rpc-shim does): full service (HELLO answered by the relay, buffers, tensors of every size
//! class, graphs, large GET_TENSOR), over RC and over rxe-style UC (a SEND without a posted
//! receive is lost, so credits must hold), with no SEND ever unmatched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use rpc_proto::Limits;

/// The protocol major of the relayed connections.
const MAJOR: rpc_proto::Major = rpc_proto::Major::V8;
use rpc_server::stats::Stats;
use rpc_session::{Session, SessionConfig};
use rpc_tests::*;
use rpc_transport::rdma::fake::{self, FakeQp, Rules};
use rpc_transport::rdma::lean::{Geometry, LeanLink};
use rpc_transport::rdma::RdmaTransport;
use rpc_transport::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

type Lean = RdmaTransport<LeanLink<FakeQp>>;

fn lean_pair(rules: Rules) -> (Lean, Lean) {
    let g = if rules == Rules::Rc {
        Geometry::RC
    } else {
        Geometry::UC
    };
    let (a, b) = fake::pair(
        rules,
        g.tx_size(),
        g.rx_size(),
        if rules == Rules::Rc { 256 } else { 0 },
    );
    a.drop_unmatched(true);
    let mut a = LeanLink::new(a, g);
    let mut b = LeanLink::new(b, g);
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    (
        RdmaTransport::new(a, None, "lean"),
        RdmaTransport::new(b, None, "lean"),
    )
}

/// One client connection: HELLO answered here, then bytes relayed to a server command loop
/// running over the far end of a lean link. Returns when either side ends; checks credits.
async fn relay(mut tcp: TcpStream, rules: Rules, done: Arc<AtomicUsize>) {
    let mut hello = [0u8; 9 + 24];
    if tcp.read_exact(&mut hello).await.is_err() {
        return;
    }
    // The major announced here is the one the session below speaks.
    let mut rsp = Vec::new();
    rpc_proto::Response::hello(MAJOR, [0; 24]).encode(&mut rsp);
    tcp.write_all(&rsp).await.unwrap();
    let (mut up, mut srv) = lean_pair(rules);
    let config = Arc::new(SessionConfig {
        devices: vec![cpu_device()],
        n_threads: 1,
        cache: None,
        local: None,
    });
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(async move {
        let r = rpc_server::connection::run(
            &mut srv,
            Session::new(
                config,
                MAJOR,
                Arc::new(rpc_session::MemoryBudget::unlimited()),
            ),
            Limits::default(),
            Arc::new(Stats::default()),
            Default::default(),
            shutdown,
        )
        .await;
        (r.map_err(|e| e.to_string()), srv)
    });
    let (mut rd, mut wr) = tcp.into_split();
    let mut a = vec![0u8; 1 << 20];
    let mut b = vec![0u8; 1 << 20];
    loop {
        tokio::select! {
            r = rd.read(&mut a) => match r {
                Ok(n) if n > 0 => up.send_message(&[&a[..n]]).await.unwrap(),
                _ => break,
            },
            r = up.read(&mut b) => match r {
                Ok(n) if n > 0 => wr.write_all(&b[..n]).await.unwrap(),
                _ => break,
            },
        }
    }
    // The client is gone: stop the server loop (it waits for the next request) and check that
    // no SEND in either direction ever found no receive posted.
    stop.send(true).unwrap();
    let (r, mut srv) = within("server loop stops", server).await.unwrap();
    r.unwrap();
    assert!(up.counters().0 > 0 && srv.counters().0 > 0);
    assert_eq!(
        up.link().verbs().unmatched(),
        0,
        "{rules:?}: relay -> server"
    );
    assert_eq!(
        srv.link().verbs().unmatched(),
        0,
        "{rules:?}: server -> relay"
    );
    done.fetch_add(1, SeqCst);
}

/// A relay listening on 127.0.0.1; `done` counts connections that ended with every check passed.
async fn start(rules: Rules, done: Arc<AtomicUsize>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(relay(c, rules, done.clone()));
        }
    });
    addr
}

async fn full_service(rules: Rules) {
    let done = Arc::new(AtomicUsize::new(0));
    let addr = start(rules, done.clone()).await;
    assert_healthy(addr).await;
    within("large tensors over lean", async {
        let mut c = connect(addr).await;
        let n = 3 << 20;
        let buf = alloc(&mut c, n as u64).await;
        let t = buf.f32(1, &[(n / 4) as u32], 0).build();
        for (size, seed) in [
            (1usize, 1u64),
            (4076, 2),
            (4077, 3),
            (65536, 4),
            (262_144, 5),
            (n, 6),
        ] {
            let data = pattern(size, seed);
            c.set_tensor(&t, 0, &data, false).await.expect("SET_TENSOR");
            let back = c.get_tensor(&t, 0, size as u64).await.expect("GET_TENSOR");
            assert_eq!(back, data, "{rules:?}: {size} bytes");
        }
    })
    .await;
    // Both connections ended and passed the relay's checks.
    within("relays finish", async {
        while done.load(SeqCst) < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_loop_over_lean_rc() {
    full_service(Rules::Rc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_loop_over_lean_uc_with_rxe_drops() {
    full_service(Rules::Uc).await;
}
