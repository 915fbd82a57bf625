//! `rpc-bench load`: how long a stock client takes to put a model on a worker, as users live it
//! (what it measures: docs/rpc-bench.md).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use bench_report::chart::{self, Panel};
use bench_report::process::{free_ports, run_tool, ServerProcess};
use bench_report::{human_bytes, median, Table};
use clap::Args;
use rpc_proto::Major;

use crate::cli::{Common, Stock};

use crate::links::{LinkKind, LinkProfile};
use crate::relay::Wire;
use crate::tools::through_relay;

/// Every server set-up, in table order; the first is the reference (`vs stock cold`): stock or
/// ours, cold (no cache) or warm (`-c`, filled by one untimed load first), or ours with
/// `--gguf MODEL` (what a name says is what [`start_server`] starts).
pub const MODES: [&str; 5] = [
    "stock cold",
    "stock warm (-c)",
    "ours cold",
    "ours warm (-c)",
    "ours --gguf",
];

fn slug(mode: &str) -> String {
    mode.replace([' ', '(', ')', '-'], "")
}

/// Settings of a load benchmark: its command line.
#[derive(Args, Debug, Clone)]
pub struct LoadConfig {
    /// GGUF model (e.g. `python3 tests/e2e/synth_models.py --only synth-llama-load-1g DIR`).
    #[arg(long)]
    pub model: PathBuf,
    /// Our rpc-server.
    #[arg(long, default_value = "target/release/rpc-server")]
    pub ours: PathBuf,
    /// `--proto 7|8`: which stock tools (ggml-rpc-server, llama-completion) and which port of our
    /// rpc-server (-p: 8.0.0, --proto7-port: 7.0.0); `--bin`.
    #[command(flatten)]
    pub stock: Stock,
    /// Server threads (-t), both servers.
    #[arg(short = 't', long, default_value_t = 2)]
    pub threads: u32,
    /// Rounds (each loads the model once per server and link); the median counts.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Timeout per client run, seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Logs and the servers' cache directories (the caches are removed at the end).
    #[arg(long, default_value = "target/rpc-bench-load")]
    pub workdir: PathBuf,
    /// Write a PNG chart (load time and effective GB/s per link and server).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// `--links`, `--csv`, `--md`, `--no-progress`.
    #[command(flatten)]
    pub common: Common,
}

/// One mode over one link.
#[derive(Debug, Clone)]
pub struct LoadRow {
    /// Server set-up.
    pub mode: &'static str,
    /// Link name.
    pub link: String,
    /// The client's load time of each round.
    pub loads: Vec<Duration>,
    /// Bytes client → server of the last round (through the relay; `None` on `none`).
    pub sent: Option<u64>,
}

/// Starts the server of `mode` on a free loopback port, with its own cache directory; ours
/// speaking `--proto` 7.0.0 on its `--proto7-port`.
fn start_server(cfg: &LoadConfig, mode: &'static str) -> anyhow::Result<ServerProcess> {
    let [port, port7] = free_ports()?;
    let exe = if mode.starts_with("ours") {
        cfg.ours.clone()
    } else {
        cfg.stock.dir().join("ggml-rpc-server")
    };
    let mut cmd = Command::new(&exe);
    cmd.args(["-p", &port.to_string(), "-t", &cfg.threads.to_string()]);
    let port = if mode.starts_with("ours") && cfg.stock.proto == Major::V7 {
        cmd.args(["--proto7-port", &port7.to_string()]);
        port7
    } else {
        port
    };
    if mode.ends_with("(-c)") {
        cmd.arg("-c");
    }
    if mode.ends_with("--gguf") {
        cmd.arg("--gguf").arg(&cfg.model);
    }
    let slug = slug(mode);
    let cache = cfg.workdir.join(format!("cache-{slug}"));
    std::fs::create_dir_all(&cache)?;
    let log = std::fs::File::create(cfg.workdir.join(format!("server-{slug}.log")))?;
    cmd.env("LLAMA_CACHE", &cache)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // Ours listens once its --gguf index is built (hashing the model): allow for that.
    ServerProcess::start(cmd, port, Duration::from_secs(300)).with_context(|| mode)
}

/// Loads the model with the stock client against `addr`; how long it took (see
/// [`parse_load_time`]).
fn load_once(cfg: &LoadConfig, addr: SocketAddr, tag: &str) -> anyhow::Result<Duration> {
    let (model, addr) = (cfg.model.display().to_string(), addr.to_string());
    let mut args: Vec<String> = vec!["-m".into(), model, "--rpc".into(), addr];
    let rest = "-ngl 99 -n 1 -p hello -c 256 -t 1 --temp 0 -s 1 -no-cnv --simple-io";
    args.extend(rest.split_whitespace().map(String::from));
    let exe = cfg.stock.dir().join("llama-completion");
    let timeout = Duration::from_secs(cfg.timeout);
    run_tool(&exe, &args, timeout, &cfg.workdir, tag)?;
    let log = std::fs::read_to_string(cfg.workdir.join(format!("{tag}.err")))?;
    parse_load_time(&log).with_context(|| format!("no load span in the client's log ({tag})"))
}

/// The client's load, from the timestamps of its own log (`M.SS.mmm.uuu` since start): from
/// `load the model and apply lora adapter` to `system_info`, printed as soon as the model is
/// loaded, the context made and the warm-up decode done, i.e. ready to serve. It spans what
/// llama.cpp's perf summary calls `load time` (model load start to the end of the first decode;
/// within ~0.2 s of it here); the summary itself is not used because the stock tool's
/// asynchronous logger loses its last lines at exit in about half the runs on this machine.
pub fn parse_load_time(log: &str) -> Option<Duration> {
    let stamp = |key: &str| -> Option<Duration> {
        let line = log.lines().find(|l| l.contains(key))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .next()?
            .split('.')
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        let [m, s, ms, us] = f[..] else { return None };
        Some(Duration::from_micros(
            ((m * 60 + s) * 1000 + ms) * 1000 + us,
        ))
    };
    let (start, ready) = (
        stamp("load the model and apply lora adapter")?,
        stamp("system_info:")?,
    );
    ready.checked_sub(start)
}

/// Runs the whole benchmark.
pub fn run(cfg: &LoadConfig) -> anyhow::Result<Vec<LoadRow>> {
    let tools = ["ggml-rpc-server", "llama-completion"].map(|t| cfg.stock.dir().join(t));
    let files = [&cfg.ours, &tools[0], &tools[1], &cfg.model];
    if let Some(f) = files.into_iter().find(|f| !f.is_file()) {
        bail!("{} not found", f.display());
    }
    let links: Vec<&LinkProfile> = cfg.common.links().iter().filter(|l| l.runnable()).collect();
    if links.is_empty() {
        bail!("no link to measure: give none and/or emulated links");
    }
    std::fs::create_dir_all(&cfg.workdir)?;
    let rounds = cfg.rounds.max(1);
    let steps = MODES.len() as u64 * (1 + u64::from(rounds) * links.len() as u64);
    let pb = cfg.common.out.progress_bar(steps);
    let mut servers = Vec::new();
    for mode in MODES {
        pb.set_message(format!("starting {}", mode));
        let s = start_server(cfg, mode)?;
        if mode.ends_with("(-c)") {
            pb.set_message(format!("{}: filling the cache", mode));
            load_once(cfg, s.addr, &format!("{}-fill", slug(mode)))?;
        }
        pb.inc(1);
        servers.push(s);
    }
    let mut rows: Vec<LoadRow> = links
        .iter()
        .flat_map(|l| {
            MODES.map(|mode| LoadRow {
                mode,
                link: l.name.clone(),
                loads: Vec::new(),
                sent: None,
            })
        })
        .collect();
    for r in 0..rounds {
        for (li, link) in links.iter().enumerate() {
            for (mi, (mode, server)) in MODES.iter().zip(&servers).enumerate() {
                let (round, link_name) = (r + 1, &link.name);
                pb.set_message(format!("round {round}/{rounds}: {} over {link_name}", mode));
                let tag = format!("{}-{link_name}-round{round}", slug(mode));
                let row = &mut rows[li * MODES.len() + mi];
                let relayed = link.kind != LinkKind::Native;
                let wire = relayed.then(|| Wire::of(link));
                let (load, traffic) =
                    through_relay(&[server.addr], wire, |a| load_once(cfg, a[0], &tag))?;
                row.loads.push(load);
                row.sent = relayed.then_some(traffic.c2s_bytes);
                pb.inc(1);
            }
        }
    }
    drop(servers);
    pb.finish_and_clear();
    for mode in MODES {
        let _ = std::fs::remove_dir_all(cfg.workdir.join(format!("cache-{}", slug(mode))));
    }
    Ok(rows)
}

/// The results: per link and mode, the median load time, effective GB/s and bytes sent.
pub fn table(rows: &[LoadRow], model_bytes: u64) -> Table {
    let secs = |r: &LoadRow| median(&r.loads).as_secs_f64();
    let stock = |r: &LoadRow| {
        rows.iter()
            .find(|s| s.link == r.link && s.mode == MODES[0])
            .map(secs)
    };
    Table::of(
        rows,
        &[
            ("link", &|r| r.link.clone()),
            ("server", &|r| r.mode.into()),
            ("load s (median)", &|r| format!("{:.2}", secs(r))),
            ("effective GB/s", &|r| {
                format!("{:.2}", model_bytes as f64 / 1e9 / secs(r).max(1e-9))
            }),
            ("vs stock cold", &|r| {
                stock(r).map_or("-".into(), |s| format!("{:.2}", secs(r) / s.max(1e-9)))
            }),
            ("bytes sent", &|r| {
                r.sent.map_or("-".into(), |b| human_bytes(b as f64))
            }),
            ("rounds (s)", &|r| {
                let each: Vec<String> = r
                    .loads
                    .iter()
                    .map(|d| format!("{:.2}", d.as_secs_f64()))
                    .collect();
                each.join(", ")
            }),
        ],
    )
}

/// `rpc-bench load`: runs the benchmark and writes its report.
pub fn command(cfg: LoadConfig) -> anyhow::Result<()> {
    let model_bytes = std::fs::metadata(&cfg.model)
        .with_context(|| format!("model {}", cfg.model.display()))?
        .len();
    let rows = run(&cfg)?;
    let mut md = format!(
        "## rpc-bench load\n\nModel `{}` ({:.2} GB), loaded by stock `llama-completion -ngl 99 -n 1` ({}, protocol {}); \
         servers `-t {}` on loopback, each with its own cache directory; warm = `-c` after one untimed load; \
         `none` = plain loopback, other links through the link emulator. Load s = the client's load from its own log \
         (model load start to ready: weights on the worker, context made, warm-up decode done), median of {} round(s); effective GB/s = model size ÷ load s.\n\n",
        cfg.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        model_bytes as f64 / 1e9,
        cfg.stock.dir().display(),
        cfg.stock.proto,
        cfg.threads,
        cfg.rounds.max(1),
    );
    let t = table(&rows, model_bytes);
    md.push_str(&t.markdown());
    let cold = |mode| rows.iter().find(|r| r.link == "none" && r.mode == mode);
    if let (Some(ours), Some(stock)) = (cold(MODES[2]), cold(MODES[0])) {
        let r = median(&ours.loads).as_secs_f64() / median(&stock.loads).as_secs_f64();
        md.push_str(&format!(
            "\nCold load over plain loopback, ours/stock: **{r:.2}**.\n"
        ));
    }
    md.push('\n');
    md.push_str(&cfg.common.links_section());
    cfg.common.out.emit(&md, &t)?;
    if let Some(png) = &cfg.png {
        let cats = chart::distinct(rows.iter().map(|r| &r.link));
        let modes = MODES.map(String::from);
        let panel = |title: &str, y: &str, f: &dyn Fn(Duration) -> f64| {
            let series = chart::series(&modes, &cats, false, |i, c| {
                let row = rows.iter().find(|r| r.link == c && r.mode == MODES[i]);
                row.map(|r| f(median(&r.loads)))
            });
            Panel::new(title, y, &cats, series)
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
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_client_load_span() {
        let log =
            "0.00.010.003 I llama_completion: load the model and apply lora adapter, if any\n\
                   0.07.828.616 I cmn  init: llama threadpool init, n_threads = 1\n\
                   1.10.000.258 I system_info: n_threads = 1 (n_threads_batch = 1) / 2\n";
        assert_eq!(
            parse_load_time(log),
            Some(Duration::from_micros(69_990_255))
        );
        assert_eq!(parse_load_time("0.01.000.000 I system_info: x\n"), None);
        let garbled =
            "x.00.010 I load the model and apply lora adapter\n0.01.000.000 I system_info:\n";
        assert_eq!(parse_load_time(garbled), None);
    }

    #[test]
    fn median_and_ratio() {
        let row = |mode, ms: &[u64]| LoadRow {
            mode,
            link: "none".into(),
            loads: ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            sent: None,
        };
        let rows = [row(MODES[0], &[3000, 1000, 2000]), row(MODES[2], &[1000])];
        assert_eq!(median(&rows[0].loads), Duration::from_millis(2000));
        let t = table(&rows, 2_000_000_000);
        assert_eq!(t.rows[0][3], "1.00"); // 2 GB in 2 s
        assert_eq!(t.rows[1][4], "0.50"); // ours 1 s vs stock 2 s
    }
}
