//! rpc-bench against an in-process `rpc-server`: the counting relay's exact figures, the latency
//! benchmark end to end, and gross correctness of the link emulator. Never a timing upper bound:
//! the machines running this are noisy.

use std::time::Duration;

use rpc_bench::latency::{self, Case, LatencyConfig, Origin};
use rpc_bench::links::LinkKind;
use rpc_bench::relay::{Relay, RelayOptions, Wire};
use rpc_client::{Client, Command, TensorBuilder};
use rpc_tests::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_counts_round_trips_and_bytes_exactly() {
    let server = TestServer::start();
    let relay = Relay::start(server.addr, Wire::transparent(), RelayOptions::default()).unwrap();
    let mut c = Client::connect(relay.addr()).await.unwrap();
    let buf = c.alloc_buffer(0, 4096).await.unwrap().unwrap();
    let base = c.buffer_get_base(buf.handle).await.unwrap();
    let t = TensorBuilder::f32(1)
        .ne(&[1024])
        .data(buf.handle, base)
        .build();
    let before = relay.counters().snapshot();
    c.set_tensor(&t, 0, &[7u8; 4096], false).await.unwrap(); // no reply
    c.buffer_clear(buf.handle, 0).await.unwrap(); // no reply
    c.set_tensor(&t, 0, &[7u8; 4096], false).await.unwrap();
    let got = c.get_tensor(&t, 0, 4096).await.unwrap();
    assert_eq!(got, vec![7u8; 4096]);
    let after = relay.counters().snapshot();
    let d = after.since(&before);
    assert_eq!(d.count(Command::SetTensor), 2);
    assert_eq!(d.count(Command::BufferClear), 1);
    assert_eq!(d.count(Command::GetTensor), 1);
    assert_eq!(d.round_trips, 1, "only GET_TENSOR waits for a reply");
    assert_eq!(d.c2s_bytes, 2 * (9 + 305 + 4096) + (9 + 9) + (9 + 312));
    assert_eq!(d.c2s_msgs, 4);
    assert_eq!(d.s2c_bytes, 8 + 4096);
    assert_eq!(d.s2c_msgs, 1);
    // The whole connection: HELLO, ALLOC_BUFFER and BUFFER_GET_BASE waited too.
    assert_eq!(after.round_trips, 4);
    assert_eq!(after.connections, 1);
    assert_eq!(after.count(Command::Hello), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_benchmark_runs_all_lane_kinds() {
    let server = TestServer::start();
    // The settings are the command line.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        cfg: LatencyConfig,
    }
    let server_arg = format!("ours={}", server.addr);
    let cfg = <Cli as clap::Parser>::parse_from([
        "latency",
        "--server",
        &server_arg,
        "--links",
        "none,custom:300:0,tb5-rdma",
        "--sizes",
        "4096",
        "--iterations",
        "5",
        "--warmup",
        "1",
        "--rounds",
        "2",
        "--no-progress",
    ])
    .cfg;
    let rows = latency::run(&cfg).await.unwrap();
    // 4 cases (empty, GET_ALIGNMENT, SET, GET) × (direct, relay, emulated, projected).
    assert_eq!(rows.len(), 16);
    let find = |link: &str, case: Case| {
        rows.iter()
            .find(|r| r.link == link && r.case == case)
            .unwrap()
    };
    // Exact wire bytes per iteration, counted by the relay.
    assert_eq!(find("relay", Case::Empty).bytes, Some(9 + 8 + 4));
    assert_eq!(find("relay", Case::Alignment).bytes, Some(9 + 4 + 8 + 8));
    assert_eq!(
        find("relay", Case::Set(4096)).bytes,
        Some(9 + 305 + 4096 + 9 + 8 + 4)
    );
    assert_eq!(
        find("relay", Case::Get(4096)).bytes,
        Some(9 + 312 + 8 + 4096)
    );
    assert_eq!(find("none", Case::Empty).origin, Origin::Measured);
    // Gross correctness of the emulator: a round trip through a 300 µs link takes at least that.
    let emu = find("custom-300us-0g", Case::Empty);
    assert_eq!(emu.origin, Origin::MeasuredEmulated);
    let s = emu.summary.as_ref().unwrap();
    assert_eq!(s.n, 5);
    assert!(
        s.min >= Duration::from_micros(300),
        "emulated RTT {:?} below the configured 300 us",
        s.min
    );
    assert!(emu.projected.unwrap() >= Duration::from_micros(300));
    let rdma = find("tb5-rdma", Case::Get(4096));
    assert_eq!(rdma.origin, Origin::Projected);
    assert!(rdma.summary.is_none() && rdma.projected.is_some());
    assert!(cfg
        .common
        .links()
        .iter()
        .any(|l| l.kind == LinkKind::ProjectedOnly));
    let md = latency::table(&rows).markdown();
    assert!(md.contains("projected") && md.contains("measured (emulated link)"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_without_a_device_fails_clearly() {
    let server = TestServer::start();
    let settings = rpc_transport::rdma::negotiate::ClientConfig {
        lean: false,
        ..Default::default()
    };
    // Either this machine has no RDMA (error before HELLO) or the server declines: never a hang.
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        rpc_bench::conn::connect(server.addr, Some(&settings), false),
    )
    .await;
    let err = match r.expect("RDMA negotiation hung") {
        Ok(_) => return, // a machine with a usable RDMA device on loopback: nothing to check here
        Err(e) => e.to_string(),
    };
    assert!(err.contains("RDMA"), "unclear error: {err}");
}
