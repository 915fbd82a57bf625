//! `rpc-bench e2e`: tokens/s and per-token latency of stock `llama-bench` through a worker, over
//! each link, with the exact network round trips and bytes per token (how: docs/rpc-bench.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use bench_report::process::run_tool;
use bench_report::{human_bytes, pooled};
use clap::Args;

use crate::cli::{Common, Stock};
use crate::conn::{server_major, Target};
use crate::links::LinkKind;
use crate::relay::Wire;
use crate::tools::through_relay_pairing;
use crate::traffic::Traffic;
use crate::Origin;

mod report;
pub use report::{command, commands_table, placement_table, table, wire_table};

/// Settings of an end-to-end run: its command line.
#[derive(Args, Debug, Clone)]
pub struct E2eConfig {
    /// Server (worker) to measure, `[LABEL=]HOST:PORT`; repeat for several. Several servers of
    /// one run (`llama-bench --rpc A,B`): `[LABEL=]HOST:PORT,HOST:PORT`.
    #[arg(long, required = true, value_name = "[LABEL=]HOST:PORT[,...]")]
    pub server: Vec<Target>,
    /// GGUF model (e.g. the output of scripts/test-model.sh).
    #[arg(long)]
    pub model: PathBuf,
    /// `--proto 7|8` (which stock llama-bench; every server must speak it) and `--bin`.
    #[command(flatten)]
    pub stock: Stock,
    /// How llama-bench splits the model over the servers of a target (`-sm`): `layer` (whole
    /// layers per server) or `tensor` (every weight split across the target's servers).
    #[arg(long, default_value = "layer", value_parser = ["layer", "tensor"])]
    pub split_mode: String,
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
    /// A target (its label; repeat for several) whose rank 0 listens for a tensor split's
    /// pairwise link (COMM_INIT) only on its own port + 1000, as our rpc-server does: its first
    /// server's relay takes that server's port on 127.0.0.2 (so the client names the server's own
    /// port + 1000) and a forwarder on 127.0.0.2 at that port + 1000 carries the link to rank 0
    /// (no delay, not counted). Without it such a pair answers COMM_INIT with 0 through the
    /// relays and the client reduces through itself; never give it for stock servers (their rank
    /// 0 listens on every interface, where the forwarder is) unless their rank 0 is moved to
    /// another port (an `rpc-bench relay --comm-rank0-port` as the first server).
    #[arg(long, value_name = "LABEL")]
    pub own_comm_port: Vec<String>,
    /// Extra llama-bench arguments (one string, split on whitespace), e.g. "-fa 1 -ub 256".
    #[arg(long, default_value = "")]
    pub bench_args: String,
    /// Also run with llama-bench connected straight to the server (no relay), once per round
    /// after the relayed links: the real link, e.g. RDMA with a llama.cpp built with
    /// GGML_RPC_RDMA between two machines.
    #[arg(long)]
    pub direct: bool,
    /// Timeout per llama-bench run, seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Where llama-bench's raw JSON (`*.out`) and logs (`*.err`) go.
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

/// The label of a server measured under one output placement.
pub fn placement_label(server: &str, placement: &str) -> String {
    format!("{server} ({placement})")
}

/// The servers as measured, each with its extra `llama-bench` arguments and whether it is one of
/// `--own-comm-port`: every `--server`, and with `--compare-output` once per output placement
/// ([`placement_label`]), interleaved in the same rounds.
fn measured(cfg: &E2eConfig) -> Vec<(Target, Vec<String>, bool)> {
    // Without --compare-output the first placement alone (no extra arguments).
    let n = if cfg.compare_output { usize::MAX } else { 1 };
    let mut out = Vec::new();
    for t in &cfg.server {
        for (name, args) in OUTPUT_PLACEMENTS.iter().take(n) {
            let label = match cfg.compare_output {
                true => placement_label(&t.label, name),
                false => t.label.clone(),
            };
            let args = args.iter().map(|a| a.to_string()).collect();
            let own = cfg.own_comm_port.contains(&t.label);
            out.push((Target { label, ..t.clone() }, args, own));
        }
    }
    out
}

/// Prompt processing of `n` tokens in one batch, or generation of `n` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Phase {
    Pp(u32),
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
    /// Per token: the measured time, the projected time, and the link's own share (projected:
    /// round trips × RTT + bytes ÷ bandwidth; `None` without a link profile: `none`, `direct`).
    pub fn per_token(&self) -> [Option<Duration>; 3] {
        let n = self.phase.tokens().max(1);
        [self.measured.map(|m| m.avg), self.projected, self.link_cost].map(|d| d.map(|d| d / n))
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

/// Runs `llama-bench` once against `addrs` (`--rpc`), with `extra` arguments.
fn llama_bench(
    cfg: &E2eConfig,
    extra: &[String],
    addrs: &[SocketAddr],
    p: u32,
    n: u32,
    reps: u32,
    tag: &str,
) -> anyhow::Result<Vec<BenchResult>> {
    let mut args: Vec<String> = vec!["-m".into(), cfg.model.display().to_string()];
    let (ngl, t, sm) = (&cfg.ngl, cfg.threads, &cfg.split_mode);
    let rpc: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let rpc = rpc.join(",");
    let fixed = format!("--rpc {rpc} -ngl {ngl} -sm {sm} -p {p} -n {n} -r {reps} -t {t} -o json");
    args.extend(fixed.split_whitespace().map(String::from));
    args.extend(cfg.bench_args.split_whitespace().map(String::from));
    args.extend(extra.iter().cloned());
    let exe = cfg.stock.dir().join("llama-bench");
    let timeout = Duration::from_secs(cfg.timeout);
    parse_llama_bench_json(&run_tool(&exe, &args, timeout, &cfg.logdir, tag)?)
}

/// The mean of one phase over several `llama-bench` runs (standard deviations combine the
/// within-run spread and the spread between runs).
fn averaged(runs: &[Vec<BenchResult>], phase: Phase) -> anyhow::Result<BenchResult> {
    let find = |run: &Vec<BenchResult>| run.iter().copied().find(|r| r.phase == phase);
    let all: Vec<BenchResult> = runs
        .iter()
        .map(|run| find(run).with_context(|| format!("llama-bench reported no {}", phase.name())))
        .collect::<anyhow::Result<_>>()?;
    let pool = |f: fn(&BenchResult) -> (f64, f64)| pooled(&all.iter().map(f).collect::<Vec<_>>());
    let (avg, sd) = pool(|r| (r.avg.as_secs_f64(), r.stddev.as_secs_f64()));
    let (tps, tps_sd) = pool(|r| (r.tps, r.tps_sd));
    let (avg, stddev) = (Duration::from_secs_f64(avg), Duration::from_secs_f64(sd));
    Ok(BenchResult {
        phase,
        avg,
        stddev,
        tps,
        tps_sd,
    })
}

/// Traffic of `reps − 1` repetitions, divided down to one.
fn differential(one: &Traffic, many: &Traffic, reps: u32) -> Traffic {
    many.since(one).div_by(u64::from(reps - 1))
}

/// Runs the whole end-to-end benchmark: its rows, and notes gathered while running (model load
/// traffic, consistency checks).
pub fn run(cfg: &E2eConfig) -> anyhow::Result<(Vec<E2eRow>, Vec<String>)> {
    if cfg.reps < 2 {
        bail!("--reps must be at least 2 (the round-trip counting compares 1 and R repetitions)");
    }
    let exe = cfg.stock.dir().join("llama-bench");
    if !exe.is_file() {
        bail!(
            "{} not found (--bin DIR: the directory of the stock llama.cpp tools; \
             the {} build: STOCK_PROTO={} STOCK_TARGETS=llama-bench scripts/stock-llama.sh)",
            exe.display(),
            cfg.stock.proto,
            cfg.stock.proto.number()
        );
    }
    if !cfg.model.is_file() {
        bail!("model {} not found", cfg.model.display());
    }
    // A stock client aborts on a server of the other major: say which port instead.
    for &addr in cfg.server.iter().flat_map(|t| &t.addrs) {
        let major = server_major(addr).with_context(|| format!("HELLO to {addr}"))?;
        if major != cfg.stock.proto {
            bail!(
                "{addr} speaks protocol {major}, llama-bench (--proto) {}: give the server's port \
                 of that protocol (our rpc-server: -p speaks 8.0.0, --proto7-port 7.0.0)",
                cfg.stock.proto
            );
        }
    }
    let labelled = |l: &&String| cfg.server.iter().any(|t| t.label == **l);
    if let Some(l) = cfg.own_comm_port.iter().find(|l| !labelled(l)) {
        bail!("--own-comm-port {l}: no --server has that label");
    }
    let targets = measured(cfg);
    let (pp, tg) = (Phase::Pp(cfg.n_prompt), Phase::Tg(cfg.n_gen));
    let (np, ng, reps, rounds) = (cfg.n_prompt, cfg.n_gen, cfg.reps, cfg.rounds.max(1));
    // The schedule, each step run for every server in turn (ours, stock, ours, stock, ...), so
    // load from elsewhere on a shared machine spreads over all servers alike: (log tag, progress
    // message, route (`None`: straight to the server), -p, -n, -r). First the four counting runs
    // through the relay without delay; then the timing rounds, each over `none` (the relay
    // without delay), every emulated link and with `--direct` straight to the servers (each
    // averaged over the rounds).
    let timing: Vec<(String, Option<Wire>)> =
        std::iter::once(("none".to_string(), Some(Wire::transparent())))
            .chain(
                cfg.common
                    .links()
                    .iter()
                    .filter(|l| l.kind == LinkKind::Emulated)
                    .map(|l| (l.name.clone(), Some(Wire::of(l)))),
            )
            .chain(cfg.direct.then(|| ("direct".to_string(), None)))
            .collect();
    let count = |ph: Phase, r: u32| {
        let (short, p, n) = match ph {
            Phase::Pp(_) => ("pp", np, 0),
            Phase::Tg(_) => ("tg", 0, ng),
        };
        let (tag, msg) = (
            format!("{short}-r{r}"),
            format!("counting {} -r {r}", ph.name()),
        );
        (tag, msg, Some(Wire::transparent()), p, n, r)
    };
    let mut steps = vec![count(pp, 1), count(pp, reps), count(tg, 1), count(tg, reps)];
    for r in 1..=rounds {
        steps.extend(timing.iter().map(|(name, wire)| {
            let msg = format!("{name} (round {r}/{rounds})");
            (format!("{name}-round{r}"), msg, *wire, np, ng, reps)
        }));
    }
    let pb = cfg
        .common
        .out
        .progress_bar((steps.len() * targets.len()) as u64);
    let slug = |t: &Target| -> String {
        t.label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    };
    // [step][target] -> results and traffic (none when straight to the server)
    let mut done: Vec<Vec<(Vec<BenchResult>, Traffic)>> = Vec::new();
    for (tag, msg, wire, p, n, r) in &steps {
        let mut per_target = Vec::new();
        for (target, extra, own) in &targets {
            pb.set_message(format!("{}: {msg}", target.label));
            let tag = format!("{}-{tag}", slug(target));
            per_target.push(through_relay_pairing(
                &target.addrs,
                *wire,
                *own,
                |addrs| llama_bench(cfg, extra, addrs, *p, *n, *r, &tag),
            )?);
            pb.inc(1);
        }
        done.push(per_target);
    }
    // Timing link `li` (the direct runs: the last) over the rounds, of target `ti`.
    let timed = |ti: usize, li: usize| -> Vec<Vec<BenchResult>> {
        (0..rounds as usize)
            .map(|r| done[4 + r * timing.len() + li][ti].0.clone())
            .collect()
    };
    let direct = |ti: usize| cfg.direct.then(|| timed(ti, timing.len() - 1));
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (ti, (target, _, _)) in targets.iter().enumerate() {
        let label = &target.label;
        let [pp1, ppr, tg1, tgr] = [0, 1, 2, 3].map(|si| &done[si][ti].1);
        let pp_t = differential(pp1, ppr, cfg.reps);
        let tg_t = differential(tg1, tgr, cfg.reps);
        for (name, one, many) in [(pp.name(), pp1, ppr), (tg.name(), tg1, tgr)] {
            let d = many.since(one);
            let k = u64::from(cfg.reps - 1);
            if d.round_trips % k != 0 || d.bytes() % k != 0 {
                notes.push(format!(
                    "{label}: {name}: the traffic of {k} extra repetitions ({} round trips, {} B) is not an exact \
                     multiple of one repetition; per-run figures are rounded down",
                    d.round_trips,
                    d.bytes()
                ));
            }
        }
        let (load, hb) = (*pp1, |b: u64| human_bytes(b as f64));
        let one = |t: &Traffic| {
            let (rt, b, c) = (t.round_trips, hb(t.bytes()), t.commands_summary(1.0));
            format!("{rt} round trips, {b} ({c})")
        };
        notes.push(format!(
            "{label}: a whole llama-bench process (model load + warmup + one {pp} run) made {} \
             connections and {} round trips, sent {} and received {}; one {pp} run: {}; one {tg} run: {}",
            load.connections,
            load.round_trips,
            hb(load.c2s_bytes),
            hb(load.s2c_bytes),
            one(&pp_t),
            one(&tg_t),
            pp = pp.name(),
            tg = tg.name(),
        ));
        let base = timed(ti, 0);
        let (base_pp, base_tg) = (averaged(&base, pp)?, averaged(&base, tg)?);
        let phases = [(pp, base_pp, pp_t), (tg, base_tg, tg_t)];
        // Per link: its timing runs (`None`: projected only), its profile, its numbers' origin.
        let mut groups = vec![("none".to_string(), Some(base), None, Origin::MeasuredRelay)];
        let emulated_lanes = 1..timing.len() - usize::from(cfg.direct);
        let mut emulated = emulated_lanes.map(|li| timed(ti, li));
        for link in cfg.common.links() {
            let (runs, origin) = match link.kind {
                LinkKind::Native => continue,
                LinkKind::Emulated => match emulated.next() {
                    Some(runs) => (Some(runs), Origin::MeasuredEmulated),
                    None => continue,
                },
                LinkKind::ProjectedOnly => (None, Origin::Projected),
            };
            groups.push((link.name.clone(), runs, Some(link), origin));
        }
        if let Some(runs) = direct(ti) {
            groups.push(("direct".into(), Some(runs), None, Origin::MeasuredDirect));
        }
        for (link, runs, profile, origin) in groups {
            for &(phase, base, traffic) in &phases {
                let t = &traffic;
                let cost = profile.map(|l| {
                    l.link_cost(t.round_trips as f64, t.bytes() as f64, t.uc_bytes() as f64)
                });
                rows.push(E2eRow {
                    server: label.clone(),
                    link: link.clone(),
                    phase,
                    measured: runs.as_deref().map(|r| averaged(r, phase)).transpose()?,
                    projected: cost.map(|c| base.avg + c),
                    traffic,
                    link_cost: cost,
                    origin,
                });
            }
        }
    }
    pb.finish_and_clear();
    Ok((rows, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

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
