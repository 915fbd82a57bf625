//! `rpc-bench e2e`: tokens/s and per-token latency of stock `llama-bench` through a worker, over
//! each link, with the exact network round trips and bytes per token.
//!
//! Counting: `llama-bench` runs through the counting relay. One run with `-r 1` and one with
//! `-r R` differ by exactly `R − 1` repetitions of the test (model load, warmup and context
//! set-up cancel out), so `(count(R) − count(1)) ÷ (R − 1)` is the traffic of one pp or tg run,
//! and dividing by its token count gives the traffic per token. This works against any server,
//! since only the client ↔ server bytes are observed.
//!
//! Timing: `-p P -n N -r R` runs through the relay without delay (`none`) and through each
//! emulated link, in rounds that visit every link and server in turn (averaged); optionally (`--direct`) one run with no relay at all, e.g. with a
//! llama.cpp built with RDMA on two machines. Projections: `base + round trips × RTT + bytes ÷
//! bandwidth`, where `base` is the measured `none` time (compute + loopback + relay).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use rpc_transport::rdma::wire::Framing;

use bench_report::chart::{self, Panel};
use bench_report::{human_bytes, ms, progress_bar, Table};
use clap::Args;

use crate::cli::Common;
use crate::conn::Target;
use crate::links::{LinkKind, LinkProfile};
use crate::relay::{Relay, RelayOptions, Wire};
use crate::tools::{run_tool, DEFAULT_BIN};
use crate::traffic::{Traffic, WireTraffic};
use crate::Origin;

/// Settings of an end-to-end run: its command line.
#[derive(Args, Debug, Clone)]
pub struct E2eConfig {
    /// Server (worker) to measure, `[LABEL=]HOST:PORT`; repeat for several.
    #[arg(long, required = true, value_name = "[LABEL=]HOST:PORT")]
    pub server: Vec<Target>,
    /// GGUF model (e.g. the output of scripts/test-model.sh).
    #[arg(long)]
    pub model: PathBuf,
    /// Directory of the stock llama.cpp tools (llama-bench).
    #[arg(long, default_value = DEFAULT_BIN)]
    pub bin: PathBuf,
    /// Prompt tokens (llama-bench -p).
    #[arg(short = 'p', long, default_value_t = 64)]
    pub n_prompt: u32,
    /// Generated tokens (llama-bench -n).
    #[arg(short = 'n', long, default_value_t = 32)]
    pub n_gen: u32,
    /// Repetitions (llama-bench -r, at least 2).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: u32,
    /// Timing rounds: each runs none and every emulated link for every server in turn (results
    /// are averaged), so load from elsewhere on the machine spreads over all of them.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Client threads (llama-bench -t).
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: u32,
    /// llama-bench -ngl.
    #[arg(long, default_value = "99")]
    pub ngl: String,
    /// Measure every server twice, with the output layer on the worker (the logits cross the
    /// link every token) and on the client (`-ot '^(output|token_embd)\.weight$=CPU'`: only the hidden state
    /// crosses), interleaved, and say per link which is faster, by how much, with its flags.
    #[arg(long)]
    pub compare_output: bool,
    /// Extra llama-bench arguments (one string, split on whitespace), e.g. "-fa 1 -ub 256".
    #[arg(long, default_value = "")]
    pub bench_args: String,
    /// Also run with llama-bench connected straight to the server (no relay): the real link,
    /// e.g. RDMA with a llama.cpp built with GGML_RPC_RDMA between two machines.
    #[arg(long)]
    pub direct: bool,
    /// Timeout per llama-bench run, seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Where llama-bench's raw JSON and logs go.
    #[arg(long, default_value = "target/rpc-bench-logs")]
    pub logdir: PathBuf,
    /// Write a PNG chart of per-token latency per link.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Per-token SENDs/packets measured in the soft-RoCE VM by tests/vm/test-lean.sh, shown
    /// beside the computed RDMA wire cost (default: target/lean-vm/lean-table.txt if present).
    #[arg(long, value_name = "FILE")]
    pub vm_wire: Option<PathBuf>,
    /// `--links`, `--csv`, `--md`, `--no-progress`.
    #[command(flatten)]
    pub common: Common,
    /// The servers as measured: each `--server`, once per output placement with
    /// `--compare-output` (filled by [`command`]).
    #[arg(skip)]
    pub targets: Vec<Target>,
    /// More `llama-bench` arguments per entry of `targets` (the placement's flags).
    #[arg(skip)]
    pub target_args: Vec<Vec<String>>,
}

/// Prompt processing or generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Prompt processing of `n` tokens in one batch.
    Pp(u32),
    /// Generation of `n` tokens.
    Tg(u32),
}

impl Phase {
    /// `pp64`, `tg32`.
    pub fn name(&self) -> String {
        match self {
            Phase::Pp(n) => format!("pp{n}"),
            Phase::Tg(n) => format!("tg{n}"),
        }
    }

    /// Tokens per run.
    pub fn tokens(&self) -> u32 {
        match self {
            Phase::Pp(n) | Phase::Tg(n) => *n,
        }
    }
}

/// One `llama-bench` test result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchResult {
    /// pp or tg.
    pub phase: Phase,
    /// Mean time of one run (all its tokens).
    pub avg: Duration,
    /// Sample standard deviation of the run time.
    pub stddev: Duration,
    /// Mean tokens/s.
    pub tps: f64,
    /// Standard deviation of tokens/s.
    pub tps_sd: f64,
}

/// One row of results.
#[derive(Debug, Clone)]
pub struct E2eRow {
    /// Server label.
    pub server: String,
    /// Link name.
    pub link: String,
    /// pp or tg.
    pub phase: Phase,
    /// Measured result (`None` for projections).
    pub measured: Option<BenchResult>,
    /// Projected time of one run (`None` for the base itself).
    pub projected: Option<Duration>,
    /// Traffic of one run.
    pub traffic: Traffic,
    /// Link share of one run (projected), for rows with a link profile.
    pub link_cost: Option<Duration>,
    /// Origin of the measured numbers.
    pub origin: Origin,
}

impl E2eRow {
    /// Measured time per token.
    pub fn measured_per_token(&self) -> Option<Duration> {
        self.measured.map(|m| m.avg / self.phase.tokens().max(1))
    }

    /// Projected time per token.
    pub fn projected_per_token(&self) -> Option<Duration> {
        self.projected.map(|p| p / self.phase.tokens().max(1))
    }

    /// The link's own share of a token (projected: round trips × RTT + bytes ÷ bandwidth),
    /// `None` for rows without a link profile (`none`, `direct`).
    pub fn link_cost_per_token(&self) -> Option<Duration> {
        self.link_cost.map(|c| c / self.phase.tokens().max(1))
    }
}

/// Parses `llama-bench -o json` output.
pub fn parse_llama_bench_json(s: &str) -> anyhow::Result<Vec<BenchResult>> {
    let v: serde_json::Value =
        serde_json::from_str(s.trim()).context("llama-bench output is not JSON")?;
    let arr = v.as_array().context("llama-bench JSON is not an array")?;
    let mut out = Vec::new();
    for t in arr {
        let g = |k: &str| {
            t.get(k)
                .and_then(serde_json::Value::as_f64)
                .with_context(|| format!("field {k} missing"))
        };
        let (np, ng) = (g("n_prompt")? as u32, g("n_gen")? as u32);
        let phase = if ng == 0 {
            Phase::Pp(np)
        } else {
            Phase::Tg(ng)
        };
        out.push(BenchResult {
            phase,
            avg: Duration::from_nanos(g("avg_ns")? as u64),
            stddev: Duration::from_nanos(g("stddev_ns")? as u64),
            tps: g("avg_ts")?,
            tps_sd: g("stddev_ts")?,
        });
    }
    Ok(out)
}

/// Runs `llama-bench` once against `addr`.
fn llama_bench(
    cfg: &E2eConfig,
    ti: usize,
    addr: SocketAddr,
    p: u32,
    n: u32,
    reps: u32,
    tag: &str,
) -> anyhow::Result<Vec<BenchResult>> {
    let mut args: Vec<String> = vec!["-m".into(), cfg.model.display().to_string()];
    for (k, v) in [
        ("--rpc", addr.to_string()),
        ("-ngl", cfg.ngl.clone()),
        ("-p", p.to_string()),
        ("-n", n.to_string()),
        ("-r", reps.to_string()),
        ("-t", cfg.threads.to_string()),
        ("-o", "json".into()),
    ] {
        args.extend([k.to_string(), v]);
    }
    args.extend(cfg.bench_args.split_whitespace().map(String::from));
    args.extend(cfg.target_args.get(ti).into_iter().flatten().cloned());
    let exe = cfg.bin.join("llama-bench");
    let timeout = Duration::from_secs(cfg.timeout);
    let out = run_tool(&exe, &args, timeout, &cfg.logdir, tag)?;
    std::fs::write(cfg.logdir.join(format!("{tag}.json")), &out).ok();
    parse_llama_bench_json(&out)
}

/// Runs `llama-bench` through a relay and returns its results and the traffic it caused.
fn through_relay(
    cfg: &E2eConfig,
    ti: usize,
    wire: Wire,
    p: u32,
    n: u32,
    reps: u32,
    tag: &str,
) -> anyhow::Result<(Vec<BenchResult>, Traffic)> {
    let relay = Relay::start(cfg.targets[ti].addr, wire, RelayOptions::default())?;
    let before = relay.counters().snapshot();
    let res = llama_bench(cfg, ti, relay.addr(), p, n, reps, tag)?;
    // The client has exited; let the relay threads forward the last bytes.
    std::thread::sleep(Duration::from_millis(100));
    let traffic = relay.counters().snapshot().since(&before);
    Ok((res, traffic))
}

/// The mean of one phase over several `llama-bench` runs (standard deviations combine the
/// within-run spread and the spread between runs).
fn averaged(runs: &[Vec<BenchResult>], phase: Phase) -> anyhow::Result<BenchResult> {
    let all: Vec<BenchResult> = runs
        .iter()
        .map(|r| find(r, phase))
        .collect::<anyhow::Result<_>>()?;
    let n = all.len().max(1) as f64;
    let mean = |f: &dyn Fn(&BenchResult) -> f64| all.iter().map(f).sum::<f64>() / n;
    let avg = mean(&|r| r.avg.as_secs_f64());
    let tps = mean(&|r| r.tps);
    let var_avg =
        mean(&|r| r.stddev.as_secs_f64().powi(2)) + mean(&|r| (r.avg.as_secs_f64() - avg).powi(2));
    let var_tps = mean(&|r| r.tps_sd.powi(2)) + mean(&|r| (r.tps - tps).powi(2));
    Ok(BenchResult {
        phase,
        avg: Duration::from_secs_f64(avg),
        stddev: Duration::from_secs_f64(var_avg.sqrt()),
        tps,
        tps_sd: var_tps.sqrt(),
    })
}

fn find(res: &[BenchResult], phase: Phase) -> anyhow::Result<BenchResult> {
    res.iter()
        .copied()
        .find(|r| r.phase == phase)
        .with_context(|| format!("llama-bench reported no {}", phase.name()))
}

/// Traffic of `reps − 1` repetitions, divided down to one.
fn differential(one: &Traffic, many: &Traffic, reps: u32) -> Traffic {
    many.since(one).div_by(u64::from(reps - 1))
}

/// Notes gathered while running (model load traffic, consistency checks).
#[derive(Debug, Default, Clone)]
pub struct E2eNotes {
    /// Free-form lines.
    pub lines: Vec<String>,
}

/// Runs the whole end-to-end benchmark.
pub fn run(cfg: &E2eConfig) -> anyhow::Result<(Vec<E2eRow>, E2eNotes)> {
    if cfg.reps < 2 {
        bail!("--reps must be at least 2 (the round-trip counting compares 1 and R repetitions)");
    }
    let exe = cfg.bin.join("llama-bench");
    if !exe.is_file() {
        bail!(
            "{} not found (--bin DIR: the directory of the stock llama.cpp tools)",
            exe.display()
        );
    }
    if !cfg.model.is_file() {
        bail!("model {} not found", cfg.model.display());
    }
    let n_emulated = cfg
        .common
        .links()
        .iter()
        .filter(|l| l.kind == LinkKind::Emulated)
        .count() as u64;
    let runs = cfg.targets.len() as u64
        * (4 + u64::from(cfg.rounds.max(1)) * (1 + n_emulated) + u64::from(cfg.direct));
    let pb = progress_bar(runs, cfg.common.progress());
    let (pp, tg) = (Phase::Pp(cfg.n_prompt), Phase::Tg(cfg.n_gen));
    let mut rows = Vec::new();
    let mut notes = E2eNotes::default();
    // Every step runs for each server in turn (ours, stock, ours, stock, ...), so load from
    // elsewhere on a shared machine spreads over all servers alike.
    let slug = |t: &Target| -> String {
        t.label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    };
    let mut counted: Vec<[(Vec<BenchResult>, Traffic); 4]> =
        vec![Default::default(); cfg.targets.len()];
    let count_steps = [
        (cfg.n_prompt, 0, 1u32, "pp-r1"),
        (cfg.n_prompt, 0, cfg.reps, "pp-rR"),
        (0, cfg.n_gen, 1, "tg-r1"),
        (0, cfg.n_gen, cfg.reps, "tg-rR"),
    ];
    for (si, &(p, n, r, name)) in count_steps.iter().enumerate() {
        for (ti, target) in cfg.targets.iter().enumerate() {
            pb.set_message(format!(
                "{}: counting {} -r {r}",
                target.label,
                if p > 0 { pp.name() } else { tg.name() }
            ));
            let tag = format!(
                "{}-{}",
                slug(target),
                name.replace("rR", &format!("r{}", cfg.reps))
            );
            counted[ti][si] = through_relay(cfg, ti, Wire::transparent(), p, n, r, &tag)?;
            pb.inc(1);
        }
    }
    let emulated_links: Vec<&LinkProfile> = cfg
        .common
        .links()
        .iter()
        .filter(|l| l.kind == LinkKind::Emulated)
        .collect();
    // Timing: `none` (the relay without delay) and every emulated link, in rounds that visit
    // every link and server in turn; results are averaged over the rounds.
    let timing: Vec<(String, Wire)> = std::iter::once(("none".to_string(), Wire::transparent()))
        .chain(emulated_links.iter().map(|l| (l.name.clone(), Wire::of(l))))
        .collect();
    let rounds = cfg.rounds.max(1);
    // [target][timing link] -> results of each round
    let mut timed: Vec<Vec<Vec<Vec<BenchResult>>>> =
        vec![vec![Vec::new(); timing.len()]; cfg.targets.len()];
    for r in 0..rounds {
        for (li, (name, wire)) in timing.iter().enumerate() {
            for (ti, target) in cfg.targets.iter().enumerate() {
                pb.set_message(format!(
                    "{}: {name} (round {}/{rounds})",
                    target.label,
                    r + 1
                ));
                let tag = format!("{}-{name}-round{}", slug(target), r + 1);
                let (res, _) =
                    through_relay(cfg, ti, *wire, cfg.n_prompt, cfg.n_gen, cfg.reps, &tag)?;
                timed[ti][li].push(res);
                pb.inc(1);
            }
        }
    }
    let mut direct: Vec<Option<Vec<BenchResult>>> = vec![None; cfg.targets.len()];
    if cfg.direct {
        for (ti, target) in cfg.targets.iter().enumerate() {
            pb.set_message(format!("{}: direct", target.label));
            let tag = format!("{}-direct", slug(target));
            direct[ti] = Some(llama_bench(
                cfg,
                ti,
                target.addr,
                cfg.n_prompt,
                cfg.n_gen,
                cfg.reps,
                &tag,
            )?);
            pb.inc(1);
        }
    }
    for (ti, target) in cfg.targets.iter().enumerate() {
        let label = &target.label;
        let [(_, pp1), (_, ppr), (_, tg1), (_, tgr)] = &counted[ti];
        let pp_t = differential(pp1, ppr, cfg.reps);
        let tg_t = differential(tg1, tgr, cfg.reps);
        for (name, one, many) in [(pp.name(), pp1, ppr), (tg.name(), tg1, tgr)] {
            let d = many.since(one);
            let k = u64::from(cfg.reps - 1);
            if d.round_trips % k != 0 || d.bytes() % k != 0 {
                notes.lines.push(format!(
                    "{label}: {name}: the traffic of {k} extra repetitions ({} round trips, {} B) is not an exact \
                     multiple of one repetition; per-run figures are rounded down",
                    d.round_trips,
                    d.bytes()
                ));
            }
        }
        let load = *pp1;
        notes.lines.push(format!(
            "{label}: a whole llama-bench process (model load + warmup + one pp{} run) made {} connections and {} round trips, \
             sent {} and received {}; one pp{} run: {} round trips, {} ({}); one tg{} run: {} round trips, {} ({})",
            cfg.n_prompt,
            load.connections,
            load.round_trips,
            human_bytes(load.c2s_bytes as f64),
            human_bytes(load.s2c_bytes as f64),
            cfg.n_prompt,
            pp_t.round_trips,
            human_bytes(pp_t.bytes() as f64),
            pp_t.commands_summary(1.0),
            cfg.n_gen,
            tg_t.round_trips,
            human_bytes(tg_t.bytes() as f64),
            tg_t.commands_summary(1.0),
        ));
        let base_pp = averaged(&timed[ti][0], pp)?;
        let base_tg = averaged(&timed[ti][0], tg)?;
        let phases = [(pp, base_pp, pp_t), (tg, base_tg, tg_t)];
        let row = |link: &str, phase, measured, projected, traffic, link_cost, origin| E2eRow {
            server: label.clone(),
            link: link.into(),
            phase,
            measured,
            projected,
            traffic,
            link_cost,
            origin,
        };
        for &(phase, base, t) in &phases {
            rows.push(row(
                "none",
                phase,
                Some(base),
                None,
                t,
                None,
                Origin::MeasuredRelay,
            ));
        }
        let mut emulated_iter = timed[ti][1..].iter();
        for link in cfg.common.links() {
            let cost = |t: &Traffic| {
                link.link_cost(t.round_trips as f64, t.bytes() as f64, t.uc_bytes() as f64)
            };
            let res = match link.kind {
                LinkKind::Native => continue,
                LinkKind::Emulated => match emulated_iter.next() {
                    Some(res) => Some(res),
                    None => continue,
                },
                LinkKind::ProjectedOnly => None,
            };
            for &(phase, base, t) in &phases {
                let (measured, origin) = match res {
                    Some(res) => (Some(averaged(res, phase)?), Origin::MeasuredEmulated),
                    None => (None, Origin::Projected),
                };
                let projected = Some(base.avg + cost(&t));
                rows.push(row(
                    &link.name,
                    phase,
                    measured,
                    projected,
                    t,
                    Some(cost(&t)),
                    origin,
                ));
            }
        }
        if let Some(res) = &direct[ti] {
            for &(phase, _, t) in &phases {
                let m = Some(find(res, phase)?);
                rows.push(row(
                    "direct",
                    phase,
                    m,
                    None,
                    t,
                    None,
                    Origin::MeasuredDirect,
                ));
            }
        }
    }
    pb.finish_and_clear();
    Ok((rows, notes))
}

/// The results as a table (times per token; traffic per token).
pub fn table(rows: &[E2eRow]) -> Table {
    let n = |r: &E2eRow| f64::from(r.phase.tokens().max(1));
    let per_token = |d: Option<Duration>| d.map_or("-".into(), ms);
    Table::of(
        rows,
        &[
            ("server", &|r| r.server.clone()),
            ("link", &|r| r.link.clone()),
            ("test", &|r| r.phase.name()),
            ("t/s", &|r| match (r.measured, r.projected) {
                (Some(m), _) => format!("{:.2} ± {:.2}", m.tps, m.tps_sd),
                (None, Some(p)) => format!("({:.2})", n(r) / p.as_secs_f64().max(1e-12)),
                _ => "-".into(),
            }),
            ("ms/token measured", &|r| per_token(r.measured_per_token())),
            ("ms/token projected", &|r| {
                per_token(r.projected_per_token())
            }),
            ("link ms/token", &|r| per_token(r.link_cost_per_token())),
            ("round trips/token", &|r| {
                fmt_ratio(r.traffic.round_trips as f64 / n(r))
            }),
            ("bytes/token up", &|r| {
                format!("{:.0}", r.traffic.c2s_bytes as f64 / n(r))
            }),
            ("bytes/token down", &|r| {
                format!("{:.0}", r.traffic.s2c_bytes as f64 / n(r))
            }),
            ("numbers", &|r| r.origin.label().into()),
        ],
    )
}

/// One server measured under several placements of the output layer (`--compare-output`).
#[derive(Debug, Clone)]
pub struct Placements {
    /// The server's own label.
    pub server: String,
    /// (placement name, row label, its llama.cpp flags) per placement.
    pub ngl: Vec<(String, String, String)>,
}

/// The output-layer placements `--compare-output` measures: (name, extra `llama-bench`
/// arguments). llama.cpp offloads the output layer with the first layer `-ngl` counts (layer
/// `n_layer`), so no `-ngl` value keeps it on the client while the blocks are on the worker; an
/// override of the output matrix's buffer does: `output.weight`, or with tied embeddings (gemma)
/// `token_embd.weight`, whose duplicate is the output matrix (the input copy is on the client
/// anyway).
pub const OUTPUT_PLACEMENTS: [(&str, &[&str]); 2] = [
    ("output on the worker", &[]),
    (
        "output on the client",
        &["-ot", "^(output|token_embd)\\.weight$=CPU"],
    ),
];

/// Per server and link: ms per generated token under each placement (measured, or projected for
/// projection-only links) with the link's own share of it (round trips × RTT + bytes ÷
/// bandwidth, from the counted traffic), which is faster and by how much, and its flags.
pub fn placement_table(rows: &[E2eRow], placements: &[Placements]) -> Table {
    let mut head = vec!["server".to_string(), "link".to_string()];
    let ngls: Vec<&str> = placements
        .first()
        .map(|p| p.ngl.iter().map(|(n, _, _)| n.as_str()).collect())
        .unwrap_or_default();
    head.extend(
        ngls.iter()
            .map(|n| format!("{n}: tg ms/token (link share)")),
    );
    head.extend([
        "faster".into(),
        "saves ms/token".into(),
        "flags".into(),
        "numbers".into(),
    ]);
    let mut t = Table::new(&head.iter().map(String::as_str).collect::<Vec<_>>());
    for p in placements {
        let links = chart::distinct(
            rows.iter()
                .filter(|r| p.ngl.iter().any(|(_, l, _)| *l == r.server))
                .map(|r| &r.link),
        );
        for link in links {
            let found: Vec<Option<&E2eRow>> = p
                .ngl
                .iter()
                .map(|(_, label, _)| {
                    rows.iter().find(|r| {
                        &r.server == label && r.link == link && matches!(r.phase, Phase::Tg(_))
                    })
                })
                .collect();
            let per: Vec<Option<(Duration, Origin)>> = found
                .iter()
                .map(|r| {
                    let r = (*r)?;
                    Some((
                        r.measured_per_token().or(r.projected_per_token())?,
                        r.origin,
                    ))
                })
                .collect();
            let mut row = vec![p.server.clone(), link.clone()];
            row.extend(per.iter().zip(&found).map(|(v, r)| {
                let share = r
                    .and_then(E2eRow::link_cost_per_token)
                    .map_or(String::new(), |c| format!(" (link {})", ms(c)));
                v.map_or("-".into(), |(d, _)| format!("{}{share}", ms(d)))
            }));
            let known: Vec<(usize, Duration)> = per
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|(d, _)| (i, d)))
                .collect();
            let best = known.iter().min_by_key(|(_, d)| *d);
            let worst = known.iter().max_by_key(|(_, d)| *d);
            match (best, worst) {
                (Some(&(bi, b)), Some(&(_, w))) if known.len() > 1 => {
                    row.push(p.ngl[bi].0.clone());
                    row.push(format!(
                        "{} ({:.1} %)",
                        ms(w - b),
                        (w - b).as_secs_f64() / w.as_secs_f64().max(1e-12) * 100.0
                    ));
                    row.push(format!("`{}`", p.ngl[bi].2));
                }
                _ => row.extend(["-".into(), "-".into(), "-".into()]),
            }
            row.push(
                per.iter()
                    .flatten()
                    .next()
                    .map_or("-", |(_, o)| o.label())
                    .into(),
            );
            t.push(row);
        }
    }
    t
}

/// Commands of each server per generated token and per prompt batch (from the `none` rows).
pub fn commands_table(rows: &[E2eRow]) -> Table {
    // Per generated token, or per prompt batch (one run).
    let unit = |r: &E2eRow| match r.phase {
        Phase::Tg(n) => ("per generated token".to_string(), f64::from(n.max(1))),
        Phase::Pp(n) => (format!("per prompt batch of {n} tokens"), 1.0),
    };
    let n = |r: &E2eRow| unit(r).1;
    Table::of(
        rows.iter().filter(|r| r.link == "none"),
        &[
            ("server", &|r| r.server.clone()),
            ("unit", &|r| unit(r).0),
            ("commands", &|r| r.traffic.commands_summary(n(r))),
            ("round trips", &|r| {
                fmt_ratio(r.traffic.round_trips as f64 / n(r))
            }),
            ("bytes up", &|r| {
                human_bytes(r.traffic.c2s_bytes as f64 / n(r))
            }),
            ("bytes down", &|r| {
                human_bytes(r.traffic.s2c_bytes as f64 / n(r))
            }),
        ],
    )
}

/// RDMA wire cost per generated token under each framing, computed from the captured traffic
/// with [`rpc_transport::rdma::wire`] (the `none` tg rows), beside what `tests/vm/test-lean.sh`
/// measured in the soft-RoCE VM (rxe counters; another model, so compare ratios) when given.
pub fn wire_table(rows: &[E2eRow], measured: Option<&VmWireTable>) -> Table {
    // One row per server and framing.
    let cells: Vec<(&E2eRow, usize, Framing)> = rows
        .iter()
        .filter(|r| r.link == "none" && matches!(r.phase, Phase::Tg(_)))
        .flat_map(|r| {
            Framing::ALL
                .iter()
                .enumerate()
                .map(move |(i, f)| (r, i, *f))
        })
        .collect();
    let n = |r: &E2eRow| f64::from(r.phase.tokens().max(1));
    let per = |(r, i, _): &(&E2eRow, usize, Framing), f: fn(&WireTraffic) -> u64| {
        f(&r.traffic.wire[*i]) as f64 / n(r)
    };
    let vm = |&(_, _, f): &(&E2eRow, usize, Framing), pick: fn((f64, f64)) -> f64| {
        measured
            .and_then(|m| m.get(f))
            .map_or("-".into(), |m| format!("{:.1}", pick(m)))
    };
    Table::of(
        cells,
        &[
            ("server", &|c| c.0.server.clone()),
            ("framing", &|c| c.2.name().into()),
            ("SENDs/token", &|c| {
                let credits = per(c, |w| w.credit_sends);
                let credits = if credits > 0.0 {
                    format!(" (≤ {credits:.1} credit-only)")
                } else {
                    String::new()
                };
                format!("{:.1}{credits}", per(c, |w| w.sends))
            }),
            ("packets/token (MTU 1024)", &|c| {
                format!("{:.1}", per(c, |w| w.packets[0]))
            }),
            ("packets/token (MTU 4096)", &|c| {
                format!("{:.1}", per(c, |w| w.packets[1]))
            }),
            ("bytes on the wire/token", &|c| {
                human_bytes(per(c, |w| w.bytes))
            }),
            ("vs upstream UC packets", &|c| {
                let apple = c.0.traffic.wire[1].packets[0] as f64 / n(c.0);
                if apple > 0.0 {
                    format!("1/{:.0}", apple / per(c, |w| w.packets[0]).max(1e-9))
                } else {
                    "-".into()
                }
            }),
            ("VM measured SENDs/token", &|c| vm(c, |m| m.0)),
            ("VM measured packets/token (MTU 1024)", &|c| vm(c, |m| m.1)),
            ("source", &|c| {
                if c.2.is_lean() {
                    "computed: no-response requests coalesced into the next round trip".into()
                } else {
                    "computed: upstream's framing of each message".into()
                }
            }),
        ],
    )
}

/// The per-token table `tests/vm/test-lean.sh` writes (`target/lean-vm/lean-table.txt`):
/// `config SENDs/token packets/token` for a-rc, a-uc (stock client, upstream flavors) and
/// b-rc, b-uc (through rpc-shim, lean framing).
#[derive(Debug, Clone, Default)]
pub struct VmWireTable {
    rows: Vec<(String, f64, f64)>,
}

impl VmWireTable {
    /// Parses the table; lines that are not `name number number` are skipped.
    pub fn parse(text: &str) -> VmWireTable {
        let rows = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (c, s, p) = (
                    it.next()?,
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                );
                Some((c.to_string(), s, p))
            })
            .collect();
        VmWireTable { rows }
    }

    /// (SENDs/token, packets/token) measured for a framing.
    pub fn get(&self, f: Framing) -> Option<(f64, f64)> {
        let key = match f {
            Framing::UpstreamRc => "a-rc",
            Framing::AppleUc => "a-uc",
            Framing::LeanRc => "b-rc",
            Framing::LeanUc => "b-uc",
        };
        self.rows.iter().find(|r| r.0 == key).map(|r| (r.1, r.2))
    }
}

/// `rpc-bench e2e`: runs the benchmark and writes its report.
pub fn command(mut cfg: E2eConfig) -> anyhow::Result<()> {
    // --compare-output: every server once per placement, all interleaved in the same rounds.
    let variants: Vec<(&str, &[&str])> = if cfg.compare_output {
        OUTPUT_PLACEMENTS.to_vec()
    } else {
        vec![("", &[])]
    };
    let mut targets = Vec::new();
    let mut placements = Vec::new();
    for t in &cfg.server {
        let mut p = Placements {
            server: t.label.clone(),
            ngl: Vec::new(),
        };
        for (name, args) in &variants {
            let label = if cfg.compare_output {
                format!("{} ({name})", t.label)
            } else {
                t.label.clone()
            };
            let flags = std::iter::once(format!("-ngl {}", cfg.ngl))
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
    (cfg.targets, cfg.target_args) = targets.into_iter().unzip();
    let cfg = cfg;
    let (rows, notes) = run(&cfg)?;
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
        cfg.bench_args,
        cfg.bin.display(),
        cfg.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        cfg.targets.iter().map(|t| format!("{} ({})", t.label, t.addr)).collect::<Vec<_>>().join(", "),
        cfg.rounds,
        cfg.n_prompt,
        cfg.n_prompt,
        cfg.reps,
    ));
    md.push_str(&table(&rows).markdown());
    if cfg.compare_output {
        md.push_str(
            "\nWhere the output layer goes: on the worker the whole logits vector comes back every \
             token; on the client (its matrix kept in client memory by `-ot`) only the hidden state \
             does, and the client computes the logits. ms per generated token per placement, the \
             faster one, what it saves, and the flags to use.\n\n",
        );
        md.push_str(&placement_table(&rows, &placements).markdown());
    }
    md.push_str("\nCommands on the wire (counted through the relay):\n\n");
    md.push_str(&commands_table(&rows).markdown());
    let vm_path = cfg
        .vm_wire
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/lean-vm/lean-table.txt"));
    let vm = match std::fs::read_to_string(&vm_path) {
        Ok(text) => Some(VmWireTable::parse(&text)),
        Err(e) if cfg.vm_wire.is_some() => anyhow::bail!("--vm-wire {}: {e}", vm_path.display()),
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
    md.push_str(&wire_table(&rows, vm.as_ref()).markdown());
    md.push('\n');
    for l in &notes.lines {
        md.push_str(&format!("- {l}\n"));
    }
    md.push('\n');
    md.push_str(&cfg.common.links_section());
    cfg.common.emit(&md, &table(&rows))?;
    if let Some(png) = &cfg.png {
        draw_chart(png, &rows, &cfg)?;
        eprintln!("chart written to {}", png.display());
    }
    Ok(())
}

fn draw_chart(path: &Path, rows: &[E2eRow], cfg: &E2eConfig) -> anyhow::Result<()> {
    let cats = chart::distinct(rows.iter().map(|r| &r.link));
    let servers: Vec<String> = cfg.targets.iter().map(|t| t.label.clone()).collect();
    let mut panels = Vec::new();
    for (phase, title) in [
        (
            Phase::Tg(cfg.n_gen),
            format!("generation (tg{}): ms per token", cfg.n_gen),
        ),
        (
            Phase::Pp(cfg.n_prompt),
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
    let tg = Phase::Tg(cfg.n_gen);
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
    for l in cfg
        .common
        .links()
        .iter()
        .filter(|l| l.kind != LinkKind::Native)
    {
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

fn fmt_ratio(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as u64)
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_vm_lean_table() {
        let t = VmWireTable::parse("config      SENDs/token    packets/token\na-rc  26.0  53.1\na-uc 9.0 1152.0\nb-rc 4.6 13.2\ngarbage\n");
        assert_eq!(t.get(Framing::UpstreamRc), Some((26.0, 53.1)));
        assert_eq!(t.get(Framing::AppleUc), Some((9.0, 1152.0)));
        assert_eq!(t.get(Framing::LeanRc), Some((4.6, 13.2)));
        assert_eq!(t.get(Framing::LeanUc), None);
    }

    #[test]
    fn parses_llama_bench_json() {
        let s = r#"[
          {"n_prompt": 64, "n_gen": 0, "avg_ns": 200000000, "stddev_ns": 1000, "avg_ts": 320.5, "stddev_ts": 3.1, "samples_ns": [1]},
          {"n_prompt": 0, "n_gen": 32, "avg_ns": 1600000000, "stddev_ns": 2000, "avg_ts": 20.0, "stddev_ts": 0.5}
        ]"#;
        let r = parse_llama_bench_json(s).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].phase, Phase::Pp(64));
        assert_eq!(r[1].phase, Phase::Tg(32));
        assert_eq!(r[1].avg, Duration::from_millis(1600));
        assert!(parse_llama_bench_json("nope").is_err());
    }

    #[test]
    fn placement_table_names_the_faster_placement() {
        let row = |server: &str, link: &str, ms_per_run: u64| E2eRow {
            server: server.into(),
            link: link.into(),
            phase: Phase::Tg(4),
            measured: Some(BenchResult {
                phase: Phase::Tg(4),
                avg: Duration::from_millis(ms_per_run),
                stddev: Duration::ZERO,
                tps: 0.0,
                tps_sd: 0.0,
            }),
            projected: None,
            traffic: Traffic::default(),
            link_cost: (link != "none").then(|| Duration::from_millis(ms_per_run / 10)),
            origin: Origin::MeasuredEmulated,
        };
        // Worker: 40 ms per token on 2.5gbe, client: 30; on none the worker wins (8 vs 10).
        let rows = [
            row("a (w)", "none", 32),
            row("a (c)", "none", 40),
            row("a (w)", "2.5gbe", 160),
            row("a (c)", "2.5gbe", 120),
        ];
        let p = Placements {
            server: "a".into(),
            ngl: vec![
                ("worker".into(), "a (w)".into(), "-ngl 99".into()),
                ("client".into(), "a (c)".into(), "-ngl 99 -ot x".into()),
            ],
        };
        let t = placement_table(&rows, &[p]);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0][1..5], ["none", "8.000", "10.000", "worker"]);
        assert_eq!(t.rows[0][5], "2.000 (20.0 %)");
        assert_eq!(
            t.rows[1][1..5],
            [
                "2.5gbe",
                "40.000 (link 4.000)",
                "30.000 (link 3.000)",
                "client"
            ]
        );
        assert_eq!(t.rows[1][5], "10.000 (25.0 %)");
        assert_eq!(t.rows[1][6], "`-ngl 99 -ot x`");
    }

    #[test]
    fn differential_divides_extra_repetitions() {
        let one = Traffic {
            round_trips: 100,
            c2s_bytes: 1000,
            ..Traffic::default()
        };
        let many = Traffic {
            round_trips: 164,
            c2s_bytes: 3000,
            ..Traffic::default()
        };
        let d = differential(&one, &many, 3);
        assert_eq!(d.round_trips, 32);
        assert_eq!(d.c2s_bytes, 1000);
    }
}
