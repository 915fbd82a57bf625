//! `rpc-bench load`: how long a stock client takes to put a model on a worker, as users live it.
//!
//! Five servers run side by side on loopback, each with its own weight-cache directory
//! (`LLAMA_CACHE`): the stock `ggml-rpc-server` cold (no cache) and warm (`-c`, filled by one
//! untimed load first), ours cold and warm the same way, and ours with `--gguf MODEL` (the worker
//! reads the weights from its own copy of the file). The stock `llama-completion -ngl 99 -n 1`
//! loads the model onto each, straight (`none`: plain loopback) or through `link-emu`'s relay
//! emulating each link; what is measured is the client's load, from its own log: from the start
//! of the model load to ready (every tensor on the worker, uploads and SET_TENSOR_HASH included,
//! the context made, its warm-up decode done; see [`parse_load_time`]), and
//! the bytes it sent (counted by the relay). Effective GB/s = model file size ÷ load time. Rounds
//! visit every link and server in turn; the median of the rounds is reported.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use bench_report::{human_bytes, progress_bar, Table};

use crate::links::{LinkKind, LinkProfile};
use crate::relay::{Relay, RelayOptions, Wire};
use crate::tools::{run_tool, ServerProcess};

/// Server set-ups compared, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Stock server, no cache.
    StockCold,
    /// Stock server, `-c`, cache filled.
    StockWarm,
    /// Ours, no cache.
    OursCold,
    /// Ours, `-c`, cache filled.
    OursWarm,
    /// Ours, `--gguf MODEL`.
    OursGguf,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 5] = [
        Mode::StockCold,
        Mode::StockWarm,
        Mode::OursCold,
        Mode::OursWarm,
        Mode::OursGguf,
    ];

    /// `stock cold`, `ours --gguf`, ...
    pub fn name(self) -> &'static str {
        match self {
            Mode::StockCold => "stock cold",
            Mode::StockWarm => "stock warm (-c)",
            Mode::OursCold => "ours cold",
            Mode::OursWarm => "ours warm (-c)",
            Mode::OursGguf => "ours --gguf",
        }
    }

    fn warm(self) -> bool {
        matches!(self, Mode::StockWarm | Mode::OursWarm)
    }
}

/// Settings of a load benchmark.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Our `rpc-server`.
    pub ours: PathBuf,
    /// Directory of the stock tools (`ggml-rpc-server`, `llama-completion`).
    pub bin: PathBuf,
    /// The model.
    pub model: PathBuf,
    /// Links: `none` is plain loopback, emulated ones run through the relay (projection-only
    /// ones are skipped: a load cannot be projected from one round trip).
    pub links: Vec<LinkProfile>,
    /// Server threads (`-t`).
    pub threads: u32,
    /// Rounds.
    pub rounds: u32,
    /// Per client run.
    pub timeout: Duration,
    /// Logs and the servers' cache directories (removed at the end).
    pub workdir: PathBuf,
    /// Progress bar.
    pub progress: bool,
}

/// One mode over one link.
#[derive(Debug, Clone)]
pub struct LoadRow {
    /// Server set-up.
    pub mode: Mode,
    /// Link name.
    pub link: String,
    /// The client's load time of each round.
    pub loads: Vec<Duration>,
    /// Bytes client → server of the last round (through the relay; `None` on `none`).
    pub sent: Option<u64>,
}

impl LoadRow {
    /// Median load time.
    pub fn median(&self) -> Duration {
        let mut v = self.loads.clone();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default()
    }
}

/// Starts the server of `mode` on a free loopback port, with its own cache directory.
fn start_server(cfg: &LoadConfig, mode: Mode) -> anyhow::Result<ServerProcess> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let ours = !matches!(mode, Mode::StockCold | Mode::StockWarm);
    let exe = if ours {
        cfg.ours.clone()
    } else {
        cfg.bin.join("ggml-rpc-server")
    };
    let mut cmd = Command::new(&exe);
    cmd.args(["-p", &port.to_string(), "-t", &cfg.threads.to_string()]);
    if mode.warm() {
        cmd.arg("-c");
    }
    if mode == Mode::OursGguf {
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
    ServerProcess::start(cmd, port, Duration::from_secs(300))
        .with_context(|| mode.name().to_string())
}

/// Loads the model with the stock client against `addr`; how long it took (see
/// [`parse_load_time`]).
fn load_once(cfg: &LoadConfig, addr: SocketAddr, tag: &str) -> anyhow::Result<Duration> {
    let model = cfg.model.display().to_string();
    let addr = addr.to_string();
    let args: Vec<String> = [
        "-m",
        &model,
        "--rpc",
        &addr,
        "-ngl",
        "99",
        "-n",
        "1",
        "-p",
        "hello",
        "-c",
        "256",
        "-t",
        "1",
        "--temp",
        "0",
        "-s",
        "1",
        "-no-cnv",
        "--simple-io",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let exe = cfg.bin.join("llama-completion");
    run_tool(&exe, &args, cfg.timeout, &cfg.workdir, tag)?;
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
    for f in [
        cfg.ours.clone(),
        cfg.bin.join("ggml-rpc-server"),
        cfg.bin.join("llama-completion"),
        cfg.model.clone(),
    ] {
        if !f.is_file() {
            bail!("{} not found", f.display());
        }
    }
    let links: Vec<&LinkProfile> = cfg.links.iter().filter(|l| l.runnable()).collect();
    if links.is_empty() {
        bail!("no link to measure: give none and/or emulated links");
    }
    std::fs::create_dir_all(&cfg.workdir)?;
    let rounds = cfg.rounds.max(1);
    let steps = Mode::ALL.len() as u64 * (1 + u64::from(rounds) * links.len() as u64);
    let pb = progress_bar(steps, cfg.progress);
    let mut servers = Vec::new();
    for mode in Mode::ALL {
        pb.set_message(format!("starting {}", mode.name()));
        let s = start_server(cfg, mode)?;
        if mode.warm() {
            pb.set_message(format!("{}: filling the cache", mode.name()));
            load_once(cfg, s.addr, &format!("{}-fill", slug(mode)))?;
        }
        pb.inc(1);
        servers.push(s);
    }
    let mut rows: Vec<LoadRow> = links
        .iter()
        .flat_map(|l| {
            Mode::ALL.map(|mode| LoadRow {
                mode,
                link: l.name.clone(),
                loads: Vec::new(),
                sent: None,
            })
        })
        .collect();
    for r in 0..rounds {
        for (li, link) in links.iter().enumerate() {
            for (mi, (mode, server)) in Mode::ALL.iter().zip(&servers).enumerate() {
                pb.set_message(format!(
                    "round {}/{rounds}: {} over {}",
                    r + 1,
                    mode.name(),
                    link.name
                ));
                let tag = format!("{}-{}-round{}", slug(*mode), link.name, r + 1);
                let row = &mut rows[li * Mode::ALL.len() + mi];
                if link.kind == LinkKind::Native {
                    row.loads.push(load_once(cfg, server.addr, &tag)?);
                } else {
                    let relay = Relay::start(server.addr, Wire::of(link), RelayOptions::default())?;
                    row.loads.push(load_once(cfg, relay.addr(), &tag)?);
                    std::thread::sleep(Duration::from_millis(100));
                    row.sent = Some(relay.counters().snapshot().c2s_bytes);
                }
                pb.inc(1);
            }
        }
    }
    drop(servers);
    pb.finish_and_clear();
    for mode in Mode::ALL {
        let _ = std::fs::remove_dir_all(cfg.workdir.join(format!("cache-{}", slug(mode))));
    }
    Ok(rows)
}

fn slug(mode: Mode) -> String {
    mode.name().replace([' ', '(', ')', '-'], "")
}

/// The results: per link and mode, the median load time, effective GB/s and bytes sent.
pub fn table(rows: &[LoadRow], model_bytes: u64) -> Table {
    let secs = |r: &LoadRow| r.median().as_secs_f64();
    let stock = |r: &LoadRow| {
        rows.iter()
            .find(|s| s.link == r.link && s.mode == Mode::StockCold)
            .map(secs)
    };
    Table::of(
        rows,
        &[
            ("link", &|r| r.link.clone()),
            ("server", &|r| r.mode.name().into()),
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

/// The default work directory.
pub fn default_workdir() -> PathBuf {
    Path::new("target").join("rpc-bench-load")
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
        let rows = [
            row(Mode::StockCold, &[3000, 1000, 2000]),
            row(Mode::OursCold, &[1000]),
        ];
        assert_eq!(rows[0].median(), Duration::from_millis(2000));
        let t = table(&rows, 2_000_000_000);
        assert_eq!(t.rows[0][3], "1.00"); // 2 GB in 2 s
        assert_eq!(t.rows[1][4], "0.50"); // ours 1 s vs stock 2 s
    }
}
