//! `rpc-bench`: latency comparison of ggml RPC links (see the crate docs and docs/rpc-bench.md).

#![forbid(unsafe_code)]

use std::time::Duration;

use bench_report::{us, Table};
use clap::{Args, Parser, Subcommand};
use link_emu::check::{self as emucheck, CheckConfig, CheckRow};
use rpc_bench::cli::Common;
use rpc_bench::links::{fmt_dur, LinkKind, LinkProfile, PROFILES_HELP};
use rpc_bench::{allreduce, e2e, latency, load, relay_cmd};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(name = "rpc-bench", version, about, after_help = PROFILES_HELP)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Per-command round-trip latency (p50, p99, histogram): empty command, SET_TENSOR and
    /// GET_TENSOR of 4 KiB, 28 KiB (DeepSeek hidden state) and 1 MiB (logits).
    #[command(after_help = PROFILES_HELP)]
    Latency(latency::LatencyConfig),
    /// Tokens/s and per-token latency of stock llama-bench through a worker over each link, with
    /// the exact network round trips and bytes per token.
    #[command(after_help = PROFILES_HELP)]
    E2e(e2e::E2eConfig),
    /// How long a stock client (llama-completion) takes to load a model onto a worker: the stock
    /// server and ours, cold and warm (-c), and ours with --gguf, over plain loopback and
    /// emulated links.
    #[command(after_help = PROFILES_HELP)]
    Load(load::LoadConfig),
    /// Time per COMM_ALLREDUCE (8.0's tensor-split collective) between two servers, per partial
    /// size and server-to-server link (loopback, emulated), ours and stock 8.0 pairs, beside a
    /// raw ping-pong of the same bytes on the same link.
    #[command(after_help = PROFILES_HELP, mut_arg("links", |a| a.default_value("none,tb5-tcp,2.5gbe")))]
    Allreduce(allreduce::AllreduceConfig),
    /// Validates the link emulator against its configured figures (ping RTT, bulk throughput,
    /// timer precision).
    #[command(after_help = PROFILES_HELP)]
    EmulatorCheck(CheckArgs),
    /// Prints the link profiles and the sources of their figures.
    Links,
    /// One emulating relay (e.g. between rpc-shim --one-endpoint and a worker), with the
    /// servers' own link at port + 1000 (--comm-link): serves until killed, prints where it
    /// listens, writes its counters to --stats.
    #[command(after_help = PROFILES_HELP)]
    Relay(relay_cmd::RelayConfig),
    /// Runs the echo floor server (what `latency --echo-floor` starts as a child process):
    /// prints its port, serves until killed.
    #[command(hide = true)]
    EchoFloor {
        /// Which floor: rpc-server's TCP code, or a plain blocking loop.
        #[arg(long, value_enum, default_value = "transport")]
        floor: rpc_bench::echo::Floor,
    },
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Ping-pongs per profile.
    #[arg(long, default_value_t = 500)]
    pings: usize,
    /// Ping size in bytes.
    #[arg(long, default_value_t = 64)]
    ping_bytes: usize,
    /// Target duration of each bulk transfer, milliseconds.
    #[arg(long, default_value_t = 300)]
    bulk_ms: u64,
    /// Rounds over all links; the least disturbed round of each link counts.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[command(flatten)]
    common: Common,
}

fn main() {
    let filter = EnvFilter::try_from_env("RPC_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Latency(a) => latency::command(a),
        Cmd::E2e(a) => e2e::command(a),
        Cmd::Load(a) => load::command(a),
        Cmd::Allreduce(a) => allreduce::command(a),
        Cmd::EmulatorCheck(a) => cmd_check(a),
        Cmd::Relay(a) => relay_cmd::command(a),
        Cmd::EchoFloor { floor } => rpc_bench::echo::run_child(floor),
        Cmd::Links => {
            let t = Table::of(
                LinkProfile::all_named(),
                &[
                    ("link", &|l| l.name.clone()),
                    ("figures", &|l| l.figures()),
                    ("kind", &|l| l.kind.label().into()),
                    ("source", &|l| l.source.into()),
                ],
            );
            print!("{}", t.markdown());
            Ok(())
        }
    }
}

fn cmd_check(a: CheckArgs) -> anyhow::Result<()> {
    let cfg = CheckConfig {
        links: a.common.links().to_vec(),
        pings: a.pings.max(1),
        ping_bytes: a.ping_bytes.max(1),
        bulk_time: Duration::from_millis(a.bulk_ms),
        rounds: a.rounds,
    };
    let pb = a.common.out.progress_bar(cfg.steps());
    let (rows, timer) = emucheck::run(&cfg, &pb)?;
    let mut md = format!(
        "## rpc-bench emulator-check\n\n{} rounds; per round and link {} ping-pongs of {} B through the relay (the round with the lowest \
         p50 counts) and a one-way bulk transfer of about {} ms at the \
         configured rate (the best round counts), throughput = bytes ÷ (time to the receiver's ack − RTT p50). Emulated part = ping p50 − \
         baseline p50. Tolerances: RTT ±max(10 %, 25 us), bandwidth 90–105 %.\n\n",
        cfg.rounds,
        cfg.pings,
        cfg.ping_bytes,
        a.bulk_ms
    );
    let t = check_table(&rows);
    md.push_str(&t.markdown());
    md.push_str(&format!(
        "\nTimer (sleep, then spin for the last {}): overshoot of 2000 deadlines 20–1000 us away: p50 {}, p99 {}, max {}.\n",
        fmt_dur(rpc_bench::relay::SPIN_MARGIN),
        fmt_dur(timer.p50),
        fmt_dur(timer.p99),
        fmt_dur(timer.max)
    ));
    a.common.out.emit(&md, &t)?;
    Ok(())
}

/// The emulator check's results as a table.
fn check_table(rows: &[CheckRow]) -> Table {
    let verdict = |b: bool| if b { "ok" } else { "OUT OF TOLERANCE" };
    // Emulated-only figures are `-` on the native link.
    let emulated = |r: &CheckRow, v: String| {
        if r.link.kind == LinkKind::Native {
            "-".into()
        } else {
            v
        }
    };
    Table::of(
        rows,
        &[
            ("link", &|r| r.link.name.clone()),
            ("configured RTT us", &|r| us(r.link.rtt)),
            ("ping RTT p50 us", &|r| us(r.rtt.p50)),
            ("p99 us", &|r| us(r.rtt.p99)),
            ("emulated part us", &|r| emulated(r, us(r.rtt_excess))),
            ("configured Gbit/s", &|r| {
                r.link
                    .gbps
                    .map_or("unlimited".into(), |g| format!("{g:.3}"))
            }),
            ("bulk Gbit/s", &|r| format!("{:.3}", r.gbps)),
            ("bulk MiB", &|r| (r.bulk_bytes >> 20).to_string()),
            ("RTT", &|r| emulated(r, verdict(r.rtt_ok).into())),
            ("bandwidth", &|r| {
                r.bw_ok.map_or("-".into(), |b| verdict(b).into())
            }),
            ("notes", &|r| r.note.clone()),
        ],
    )
}
