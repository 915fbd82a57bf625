//! `rpc-bench allreduce` against two in-process `rpc-server`s on loopback: every row measured,
//! the correctness check passed, and the emulating relay on the server-to-server link carried
//! exactly the link bytes of each allreduce (F32, then bf16). Never a timing bound.

use rpc_bench::allreduce::{self, AllreduceConfig, PairSpec};
use rpc_tests::TestServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allreduce_benchmark_between_two_of_ours() {
    let (rank0, rank1) = (TestServer::start(), TestServer::start());
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        cfg: AllreduceConfig,
    }
    let pair = format!("ours={},{}", rank0.addr8, rank1.addr8);
    let cfg = <Cli as clap::Parser>::parse_from([
        "allreduce",
        "--pair",
        &pair,
        "--links",
        "none,custom:200:0,tb5-rdma",
        "--sizes",
        "4,32768",
        "--iterations",
        "4",
        "--warmup",
        "1",
        "--rounds",
        "2",
        "--batch",
        "3",
        "--batches",
        "1",
        "--no-progress",
    ])
    .cfg;
    let pairs = PairSpec::given(&cfg).unwrap();
    let res = allreduce::run(&cfg, &pairs).await.unwrap();
    // 2 runnable links (the projected one is left out) × 2 sizes × 1 pair.
    assert_eq!(res.rows.len(), 4, "{:#?}", res.rows);
    for r in &res.rows {
        assert_eq!(r.check, Ok(()), "{} n={}", r.link, r.n);
        assert_eq!(r.pair, "ours");
        assert_eq!((r.with_sync.n, r.sync.n, r.floor.n), (4, 4, 4));
        assert!(r.back_to_back.is_some());
        assert!(!r.allreduce.0.is_zero() || !r.with_sync.p50.is_zero());
        match r.link.as_str() {
            "none" => assert_eq!(
                (r.counted, r.link_transport.as_str()),
                (None, "as negotiated")
            ),
            _ => {
                // 4 elements cross as F32 (16 B), 32768 as bf16 (65536 B), each way.
                let w = if r.n == 4 { 16 } else { 65536 };
                assert_eq!((r.wire, r.counted), (w, Some((w, w))));
                assert_eq!(r.link_transport, "TCP (relayed)");
            }
        }
    }
    let md = allreduce::report::markdown(&cfg, &pairs, &res);
    assert!(md.contains("Correctness: all 4 rows ok"), "{md}");
    let row =
        "| custom-200us-0g | TCP (relayed) | ours | 32768 (bf16) | 64.0 KiB | 65536 / 65536 |";
    assert!(md.contains(row), "{md}");
}
