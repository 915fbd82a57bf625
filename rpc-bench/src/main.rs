//! `rpc-bench`: latency comparison of ggml RPC links (see the crate docs and README section
//! "Latency comparison (rpc-bench)").

#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bench_report::chart::{self, Panel};
use bench_report::{progress_bar, us, Table};
use clap::{Args, Parser, Subcommand};
use link_emu::check::{self as emucheck, CheckConfig, CheckRow};
use rpc_bench::conn::{RdmaSettings, Target};
use rpc_bench::e2e::{self, E2eConfig, E2eRow};
use rpc_bench::latency::{self, CaseKind, CaseResult, LatencyConfig};
use rpc_bench::links::{self, fmt_dur, LinkKind, LinkProfile, PROFILES_HELP};
use rpc_bench::tools::DEFAULT_BIN;
use rpc_bench::Origin;
use rpc_transport::cli::{RdmaClientArgs, TransportMode};

const ABOUT: &str = "Latency comparison for ggml RPC (protocol 7.0.0) links: per-command round trips, \
end-to-end tokens/s through stock llama.cpp with exact round trips and bytes per token, and user-space \
emulation of 2.5 GbE, 10 GbE and Thunderbolt 5 TCP links, next to analytic projections (incl. \
Thunderbolt 5 RDMA).";

#[derive(Parser, Debug)]
#[command(name = "rpc-bench", version, about = ABOUT, after_help = PROFILES_HELP)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Per-command round-trip latency (p50, p99, histogram): empty command, SET_TENSOR and
    /// GET_TENSOR of 4 KiB, 28 KiB (DeepSeek hidden state) and 1 MiB (logits).
    #[command(after_help = PROFILES_HELP)]
    Latency(LatencyArgs),
    /// Tokens/s and per-token latency of stock llama-bench through a worker over each link, with
    /// the exact network round trips and bytes per token.
    #[command(after_help = PROFILES_HELP)]
    E2e(E2eArgs),
    /// How long a stock client (llama-completion) takes to load a model onto a worker: the stock
    /// server and ours, cold and warm (-c), and ours with --gguf, over plain loopback and
    /// emulated links.
    #[command(after_help = PROFILES_HELP)]
    Load(LoadArgs),
    /// Validates the link emulator against its configured figures (ping RTT, bulk throughput,
    /// timer precision).
    #[command(after_help = PROFILES_HELP)]
    EmulatorCheck(CheckArgs),
    /// Prints the link profiles and the sources of their figures.
    Links,
    /// Runs the echo floor server (what `latency --echo-floor` starts as a child process):
    /// prints its port, serves until killed.
    #[command(hide = true)]
    EchoFloor,
}

#[derive(Args, Debug)]
struct Common {
    /// Link profiles, comma-separated: none, 2.5gbe, 10gbe, tb5-tcp, tb5-rdma (projected only),
    /// custom:RTT_US:GBIT_S, or all.
    #[arg(long, default_value = "all", value_parser = parse_links)]
    links: LinkList,
    /// Also write the table as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Also write the markdown report to a file.
    #[arg(long, value_name = "FILE")]
    md: Option<PathBuf>,
    /// No progress bar (default: shown when stderr is a terminal).
    #[arg(long)]
    no_progress: bool,
}

/// A parsed `--links` value.
#[derive(Debug, Clone)]
struct LinkList(Vec<LinkProfile>);

fn parse_links(s: &str) -> Result<LinkList, String> {
    links::parse_links(s)
        .map(LinkList)
        .map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
struct LatencyArgs {
    /// Server to measure, `[LABEL=]HOST:PORT` (repeat for several: `--server ours=127.0.0.1:50052
    /// --server stock=127.0.0.1:50053`).
    #[arg(long, required = true, value_name = "[LABEL=]HOST:PORT")]
    server: Vec<Target>,
    /// Transport. rdma negotiates upstream's RDMA inside HELLO (fails if it does not engage);
    /// auto falls back to TCP.
    #[arg(long, value_enum, default_value = "tcp")]
    transport: TransportMode,
    #[command(flatten)]
    rdma: RdmaClientArgs,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "4096,28672,1048576")]
    sizes: Vec<usize>,
    /// Measured iterations per case.
    #[arg(long, default_value_t = 300)]
    iterations: usize,
    /// Warm-up iterations per case (not measured), spread over the rounds.
    #[arg(long, default_value_t = 30)]
    warmup: usize,
    /// Rounds the iterations are split into; each round visits every server and link in turn.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Server device index.
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// Print a text histogram of every measured case.
    #[arg(long)]
    histograms: bool,
    /// Also measure the floor: a server in this process that reads each request and answers it
    /// with zeros, doing no work, over the same TCP code and poll window as rpc-server (row
    /// "echo floor"; loopback only).
    #[arg(long)]
    echo_floor: bool,
    /// Write a PNG chart (p50 per link: empty command and GET_TENSOR of each size).
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct E2eArgs {
    /// Server (worker) to measure, `[LABEL=]HOST:PORT`; repeat for several.
    #[arg(long, required = true, value_name = "[LABEL=]HOST:PORT")]
    server: Vec<Target>,
    /// GGUF model (e.g. the output of scripts/test-model.sh).
    #[arg(long)]
    model: PathBuf,
    /// Directory of the stock llama.cpp tools (llama-bench).
    #[arg(long, default_value = DEFAULT_BIN)]
    bin: PathBuf,
    /// Prompt tokens (llama-bench -p).
    #[arg(short = 'p', long, default_value_t = 64)]
    n_prompt: u32,
    /// Generated tokens (llama-bench -n).
    #[arg(short = 'n', long, default_value_t = 32)]
    n_gen: u32,
    /// Repetitions (llama-bench -r, at least 2).
    #[arg(short = 'r', long, default_value_t = 3)]
    reps: u32,
    /// Timing rounds: each runs none and every emulated link for every server in turn (results
    /// are averaged), so load from elsewhere on the machine spreads over all of them.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Client threads (llama-bench -t).
    #[arg(short = 't', long, default_value_t = 1)]
    threads: u32,
    /// llama-bench -ngl.
    #[arg(long, default_value = "99")]
    ngl: String,
    /// Measure every server twice, with the output layer on the worker (the logits cross the
    /// link every token) and on the client (`-ot '^(output|token_embd)\.weight$=CPU'`: only the hidden state
    /// crosses), interleaved, and say per link which is faster, by how much, with its flags.
    #[arg(long)]
    compare_output: bool,
    /// Extra llama-bench arguments (one string, split on whitespace), e.g. "-fa 1 -ub 256".
    #[arg(long, default_value = "")]
    bench_args: String,
    /// Also run with llama-bench connected straight to the server (no relay): the real link,
    /// e.g. RDMA with a llama.cpp built with GGML_RPC_RDMA between two machines.
    #[arg(long)]
    direct: bool,
    /// Timeout per llama-bench run, seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Where llama-bench's raw JSON and logs go.
    #[arg(long, default_value = "target/rpc-bench-logs")]
    logdir: PathBuf,
    /// Write a PNG chart of per-token latency per link.
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    /// Per-token SENDs/packets measured in the soft-RoCE VM by tests/vm/test-lean.sh, shown
    /// beside the computed RDMA wire cost (default: target/lean-vm/lean-table.txt if present).
    #[arg(long, value_name = "FILE")]
    vm_wire: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// GGUF model (e.g. `python3 tests/e2e/synth_models.py --only synth-llama-load-1g DIR`).
    #[arg(long)]
    model: PathBuf,
    /// Our rpc-server.
    #[arg(long, default_value = "target/release/rpc-server")]
    ours: PathBuf,
    /// Directory of the stock llama.cpp tools (ggml-rpc-server, llama-completion).
    #[arg(long, default_value = DEFAULT_BIN)]
    bin: PathBuf,
    /// Server threads (-t), both servers.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: u32,
    /// Rounds (each loads the model once per server and link); the median counts.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Timeout per client run, seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Logs and the servers' cache directories (the caches are removed at the end).
    #[arg(long, default_value_os_t = rpc_bench::load::default_workdir())]
    workdir: PathBuf,
    /// Write a PNG chart (load time and effective GB/s per link and server).
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RPC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
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
        Cmd::Latency(a) => cmd_latency(a),
        Cmd::E2e(a) => cmd_e2e(a),
        Cmd::Load(a) => cmd_load(a),
        Cmd::EmulatorCheck(a) => cmd_check(a),
        Cmd::EchoFloor => rpc_bench::echo::run_child(),
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

fn flat(links: &LinkList) -> Vec<LinkProfile> {
    let mut v: Vec<LinkProfile> = Vec::new();
    for l in &links.0 {
        if !v.iter().any(|x| x.name == l.name) {
            v.push(l.clone());
        }
    }
    v
}

fn progress(common: &Common) -> bool {
    !common.no_progress && std::io::stderr().is_terminal()
}

/// The link list as markdown bullet lines with their sources.
fn links_section(links: &[LinkProfile]) -> String {
    let mut s = String::from("Links (figures and sources):\n\n");
    for l in links {
        s.push_str(&format!(
            "- `{}` ({}, {}): {}\n",
            l.name,
            l.figures(),
            l.kind.label(),
            l.source
        ));
    }
    s
}

fn emit(common: &Common, md: &str, csv: &Table) -> anyhow::Result<()> {
    bench_report::emit(md, csv, common.md.as_deref(), common.csv.as_deref())
}

fn cmd_latency(a: LatencyArgs) -> anyhow::Result<()> {
    let links = flat(&a.common.links);
    let rdma = (a.transport != TransportMode::Tcp).then(|| RdmaSettings {
        flavor: a.rdma.rdma_flavor.flavor(),
        opts: a.rdma.rdma.options(),
        tcp_fallback: a.transport == TransportMode::Auto,
    });
    let mut targets = a.server.clone();
    let mut floor = None;
    if a.echo_floor {
        anyhow::ensure!(
            rdma.is_none(),
            "--echo-floor measures TCP over loopback; leave out --transport rdma"
        );
        let child = rpc_bench::echo::spawn_child()?;
        targets.push(Target {
            label: "echo floor".into(),
            addr: child.addr,
        });
        floor = Some(child);
    }
    let cfg = LatencyConfig {
        targets,
        links: links.clone(),
        sizes: a.sizes.clone(),
        iterations: a.iterations.max(1),
        warmup: a.warmup,
        rounds: a.rounds,
        device: a.device,
        rdma,
        progress: progress(&a.common),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = rt.block_on(latency::run(&cfg))?;
    drop(floor);
    let mut md = String::new();
    md.push_str(&format!(
        "## rpc-bench latency\n\n{} measured iterations per case in {} rounds (each round visits every server and \
         link in turn), after {} warm-up; servers: {}.\n\
         `numbers`: *measured* = client straight to the server; *measured (relay, no delay)* = through the \
         counting relay, the base of the projections; *measured (emulated link)* = through the user-space \
         link emulator; *projected* = relay p50 (direct p50 for projection-only links) + round trips × RTT + \
         wire bytes ÷ bandwidth.\n\n",
        cfg.iterations,
        cfg.rounds,
        cfg.warmup,
        cfg.targets.iter().map(|t| format!("{} ({})", t.label, t.addr)).collect::<Vec<_>>().join(", ")
    ));
    md.push_str(&latency::table(&rows).markdown());
    md.push('\n');
    md.push_str(&links_section(&links));
    if a.histograms {
        md.push_str("\nHistograms:\n\n```\n");
        md.push_str(&latency::histograms(&rows));
        md.push_str("```\n");
    }
    emit(&a.common, &md, &latency::csv_table(&rows))?;
    if let Some(png) = &a.png {
        latency_chart(png, &rows, &cfg)?;
        eprintln!("chart written to {}", png.display());
    }
    Ok(())
}

fn latency_chart(
    path: &std::path::Path,
    rows: &[CaseResult],
    cfg: &LatencyConfig,
) -> anyhow::Result<()> {
    let cats = chart::distinct(rows.iter().map(|r| &r.link));
    let servers: Vec<String> = cfg.targets.iter().map(|t| t.label.clone()).collect();
    let mut cases = vec![latency::Case {
        kind: CaseKind::Empty,
        bytes: 0,
    }];
    cases.extend(cfg.sizes.iter().map(|&b| latency::Case {
        kind: CaseKind::Get,
        bytes: b,
    }));
    let panels = cases
        .into_iter()
        .map(|case| Panel {
            title: case.name(),
            y_label: "round trip, us".into(),
            categories: cats.clone(),
            series: chart::measured_and_projected(
                &servers,
                &cats,
                |s, l| {
                    rows.iter()
                        .find(|r| r.server == s && r.link == l && r.case == case)
                },
                ("measured p50", &|r: &CaseResult| {
                    r.summary.as_ref().map(|s| s.p50.as_secs_f64() * 1e6)
                }),
                &|r: &CaseResult| r.projected.map(|p| p.as_secs_f64() * 1e6),
            ),
        })
        .collect::<Vec<_>>();
    chart::draw(
        path,
        "rpc-bench latency: p50 round trip per link (solid: measured, light: projected)",
        &panels,
        &["Emulated links run through rpc-bench's user-space link emulator; tb5-rdma is projected from published figures.".into()],
    )
}

fn cmd_e2e(a: E2eArgs) -> anyhow::Result<()> {
    let links = flat(&a.common.links);
    // --compare-output: every server once per placement, all interleaved in the same rounds.
    let variants: Vec<(&str, &[&str])> = if a.compare_output {
        e2e::OUTPUT_PLACEMENTS.to_vec()
    } else {
        vec![("", &[])]
    };
    let mut targets = Vec::new();
    let mut placements = Vec::new();
    for t in &a.server {
        let mut p = e2e::Placements {
            server: t.label.clone(),
            ngl: Vec::new(),
        };
        for (name, args) in &variants {
            let label = if a.compare_output {
                format!("{} ({name})", t.label)
            } else {
                t.label.clone()
            };
            let flags = std::iter::once(format!("-ngl {}", a.ngl))
                .chain(args.iter().map(|x| x.to_string()))
                .collect::<Vec<_>>()
                .join(" ");
            p.ngl.push((name.to_string(), label.clone(), flags));
            let args: Vec<String> = args.iter().map(|x| x.to_string()).collect();
            targets.push((
                Target {
                    label,
                    addr: t.addr,
                },
                args,
            ));
        }
        placements.push(p);
    }
    let cfg = E2eConfig {
        targets: targets.iter().map(|t| t.0.clone()).collect(),
        bin: a.bin.clone(),
        model: a.model.clone(),
        links: links.clone(),
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        reps: a.reps,
        threads: a.threads,
        ngl: a.ngl.clone(),
        target_args: targets.iter().map(|t| t.1.clone()).collect(),
        extra: a.bench_args.split_whitespace().map(String::from).collect(),
        direct: a.direct,
        rounds: a.rounds,
        timeout: Duration::from_secs(a.timeout),
        logdir: a.logdir.clone(),
        progress: progress(&a.common),
    };
    let (rows, notes) = e2e::run(&cfg)?;
    let mut md = String::new();
    md.push_str(&format!(
        "## rpc-bench e2e\n\nClient: stock `llama-bench -ngl {} -p {} -n {} -r {} -t {} {}` ({}), model `{}`; servers: {}; \
         timings averaged over {} rounds (each round runs every link for every server in turn).\n\
         Per token: pp = one {}-token batch ÷ {}, tg = one generated token. Round trips and bytes are counted \
         exactly by the relay (difference between -r 1 and -r {} runs). `numbers`: *measured (relay, no delay)* \
         is the base; *measured (emulated link)* ran through the user-space link emulator; *projected* = base + \
         round trips × RTT + bytes ÷ bandwidth (t/s in parentheses are projected).\n\n",
        cfg.ngl,
        cfg.n_prompt,
        cfg.n_gen,
        cfg.reps,
        cfg.threads,
        a.bench_args,
        cfg.bin.display(),
        cfg.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        cfg.targets.iter().map(|t| format!("{} ({})", t.label, t.addr)).collect::<Vec<_>>().join(", "),
        cfg.rounds,
        cfg.n_prompt,
        cfg.n_prompt,
        cfg.reps,
    ));
    md.push_str(&e2e::table(&rows).markdown());
    if a.compare_output {
        md.push_str(
            "\nWhere the output layer goes: on the worker the whole logits vector comes back every \
             token; on the client (its matrix kept in client memory by `-ot`) only the hidden state \
             does, and the client computes the logits. ms per generated token per placement, the \
             faster one, what it saves, and the flags to use.\n\n",
        );
        md.push_str(&e2e::placement_table(&rows, &placements).markdown());
    }
    md.push_str("\nCommands on the wire (counted through the relay):\n\n");
    md.push_str(&e2e::commands_table(&rows).markdown());
    let vm_path = a
        .vm_wire
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/lean-vm/lean-table.txt"));
    let vm = match std::fs::read_to_string(&vm_path) {
        Ok(text) => Some(e2e::VmWireTable::parse(&text)),
        Err(e) if a.vm_wire.is_some() => anyhow::bail!("--vm-wire {}: {e}", vm_path.display()),
        Err(_) => None,
    };
    md.push_str(
        "\nRDMA wire cost per generated token: the traffic above framed by each RDMA flavor \
         (`rpc_transport::rdma::wire`, checked SEND by SEND against the framings on the fake fabric). \
         Upstream RC: every `send_data()` part is a SEND; upstream UC (Apple): every message is whole \
         128 KiB strides; lean (ours, rpc-shim or rpc-client to rpc-server): no-response requests \
         coalesced into the next round trip, frames sized to the data.",
    );
    if vm.is_some() {
        md.push_str(&format!(
            " The VM columns come from `{}` (tests/vm/test-lean.sh: rxe counters in the soft-RoCE VM, \
             synthetic llama model, stock client, through the real rpc-shim for lean): a different model, \
             so compare ratios between framings.",
            vm_path.display()
        ));
    }
    md.push_str("\n\n");
    md.push_str(&e2e::wire_table(&rows, vm.as_ref()).markdown());
    md.push('\n');
    for l in &notes.lines {
        md.push_str(&format!("- {l}\n"));
    }
    md.push('\n');
    md.push_str(&links_section(&links));
    emit(&a.common, &md, &e2e::table(&rows))?;
    if let Some(png) = &a.png {
        e2e_chart(png, &rows, &cfg)?;
        eprintln!("chart written to {}", png.display());
    }
    Ok(())
}

fn e2e_chart(path: &std::path::Path, rows: &[E2eRow], cfg: &E2eConfig) -> anyhow::Result<()> {
    let cats = chart::distinct(rows.iter().map(|r| &r.link));
    let servers: Vec<String> = cfg.targets.iter().map(|t| t.label.clone()).collect();
    let mut panels = Vec::new();
    for (phase, title) in [
        (
            e2e::Phase::Tg(cfg.n_gen),
            format!("generation (tg{}): ms per token", cfg.n_gen),
        ),
        (
            e2e::Phase::Pp(cfg.n_prompt),
            format!("prompt processing (pp{}): ms per token", cfg.n_prompt),
        ),
    ] {
        panels.push(Panel {
            title,
            y_label: "ms per token".into(),
            categories: cats.clone(),
            series: chart::measured_and_projected(
                &servers,
                &cats,
                |s, l| {
                    rows.iter()
                        .find(|r| r.server == s && r.link == l && r.phase == phase)
                },
                ("measured", &|r: &E2eRow| {
                    r.measured_per_token().map(|d| d.as_secs_f64() * 1e3)
                }),
                &|r: &E2eRow| {
                    (r.origin != Origin::MeasuredRelay)
                        .then(|| r.projected_per_token())
                        .flatten()
                        .map(|d| d.as_secs_f64() * 1e3)
                },
            ),
        });
    }
    // The link's own share per generated token: deterministic, from the counted traffic.
    let link_cats: Vec<String> = cats
        .iter()
        .filter(|c| c.as_str() != "none" && c.as_str() != "direct")
        .cloned()
        .collect();
    let tg = e2e::Phase::Tg(cfg.n_gen);
    let names: Vec<String> = servers.iter().map(|s| format!("{s} projected")).collect();
    let series = chart::series(&names, &link_cats, true, |ti, l| {
        rows.iter()
            .find(|r| r.server == servers[ti] && r.link == l && r.phase == tg)
            .and_then(E2eRow::link_cost_per_token)
            .map(|d| d.as_secs_f64() * 1e3)
    });
    panels.push(Panel {
        title: format!(
            "link share of a generated token (tg{}): round trips x RTT + bytes / bandwidth",
            cfg.n_gen
        ),
        y_label: "ms per token".into(),
        categories: link_cats,
        series,
    });
    let mut footer = vec![format!(
        "Stock llama-bench -ngl {} through each link to the worker; solid = measured (none: loopback + counting relay; \
         others: user-space link emulator), light = projected.",
        cfg.ngl
    )];
    for l in cfg.links.iter().filter(|l| l.kind != LinkKind::Native) {
        footer.push(format!(
            "{}: {} ({}){}",
            l.name,
            l.figures(),
            l.kind.label(),
            if l.name == "tb5-rdma" {
                "; messages padded to 128 KiB strides (upstream Apple UC flavor)"
            } else {
                ""
            }
        ));
    }
    chart::draw(
        path,
        "rpc-bench e2e: per-token latency per link",
        &panels,
        &footer,
    )
}

fn cmd_load(a: LoadArgs) -> anyhow::Result<()> {
    use rpc_bench::load::{self, LoadConfig, Mode};
    let links = flat(&a.common.links);
    let cfg = LoadConfig {
        ours: a.ours.clone(),
        bin: a.bin.clone(),
        model: a.model.clone(),
        links: links.clone(),
        threads: a.threads,
        rounds: a.rounds,
        timeout: Duration::from_secs(a.timeout),
        workdir: a.workdir.clone(),
        progress: progress(&a.common),
    };
    let model_bytes = std::fs::metadata(&a.model)
        .with_context(|| format!("model {}", a.model.display()))?
        .len();
    let rows = load::run(&cfg)?;
    let mut md = format!(
        "## rpc-bench load\n\nModel `{}` ({:.2} GB), loaded by stock `llama-completion -ngl 99 -n 1` ({}); \
         servers `-t {}` on loopback, each with its own cache directory; warm = `-c` after one untimed load; \
         `none` = plain loopback, other links through the link emulator. Load s = the client's load from its own log \
         (model load start to ready: weights on the worker, context made, warm-up decode done), median of {} round(s); effective GB/s = model size ÷ load s.\n\n",
        a.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        model_bytes as f64 / 1e9,
        cfg.bin.display(),
        cfg.threads,
        cfg.rounds.max(1),
    );
    let t = load::table(&rows, model_bytes);
    md.push_str(&t.markdown());
    let ratio = |link: &str| {
        let m = |mode| {
            rows.iter()
                .find(|r| r.link == link && r.mode == mode)
                .map(|r| r.median())
        };
        Some(m(Mode::OursCold)?.as_secs_f64() / m(Mode::StockCold)?.as_secs_f64())
    };
    if let Some(r) = ratio("none") {
        md.push_str(&format!(
            "\nCold load over plain loopback, ours/stock: **{r:.2}**.\n"
        ));
    }
    md.push('\n');
    md.push_str(&links_section(&links));
    emit(&a.common, &md, &t)?;
    if let Some(png) = &a.png {
        let cats = chart::distinct(rows.iter().map(|r| &r.link));
        let modes: Vec<String> = Mode::ALL.iter().map(|m| m.name().to_string()).collect();
        let panel = |title: &str, y: &str, f: &dyn Fn(Duration) -> f64| Panel {
            title: title.into(),
            y_label: y.into(),
            categories: cats.clone(),
            series: chart::series(&modes, &cats, false, |i, c| {
                rows.iter()
                    .find(|r| r.link == c && r.mode == Mode::ALL[i])
                    .map(|r| f(r.median()))
            }),
        };
        let gb = model_bytes as f64 / 1e9;
        chart::draw(
            png,
            &format!("rpc-bench load: stock llama-completion loads a {gb:.2} GB model onto one worker"),
            &[
                panel("model load: client's log, load start to ready", "seconds", &|d| d.as_secs_f64()),
                panel("effective GB/s (model size / load time)", "GB/s", &|d| gb / d.as_secs_f64().max(1e-9)),
            ],
            &["none: plain loopback; other links: rpc-bench's user-space link emulator (on a busy machine the load is bound by the CPU as much as by the link).".into()],
        )?;
        eprintln!("chart written to {}", png.display());
    }
    Ok(())
}

fn cmd_check(a: CheckArgs) -> anyhow::Result<()> {
    let links = flat(&a.common.links);
    let cfg = CheckConfig {
        links: links.clone(),
        pings: a.pings.max(1),
        ping_bytes: a.ping_bytes.max(1),
        bulk_time: Duration::from_millis(a.bulk_ms),
        rounds: a.rounds,
    };
    let pb = progress_bar(cfg.steps(), progress(&a.common));
    let (rows, timer) = emucheck::run(&cfg, &pb)?;
    let mut md = String::from("## rpc-bench emulator-check\n\n");
    md.push_str(&format!(
        "{} rounds; per round and link {} ping-pongs of {} B through the relay (the round with the lowest \
         p50 counts) and a one-way bulk transfer of about {} ms at the \
         configured rate (the best round counts), throughput = bytes ÷ (time to the receiver's ack − RTT p50). Emulated part = ping p50 − \
         baseline p50. Tolerances: RTT ±max(10 %, 25 us), bandwidth 90–105 %.\n\n",
        cfg.rounds,
        cfg.pings,
        cfg.ping_bytes,
        a.bulk_ms
    ));
    let t = check_table(&rows);
    md.push_str(&t.markdown());
    md.push_str(&format!(
        "\nTimer (sleep, then spin for the last {}): overshoot of 2000 deadlines 20–1000 us away: p50 {}, p99 {}, max {}.\n",
        fmt_dur(rpc_bench::relay::SPIN_MARGIN),
        fmt_dur(timer.p50),
        fmt_dur(timer.p99),
        fmt_dur(timer.max)
    ));
    emit(&a.common, &md, &t)?;
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
