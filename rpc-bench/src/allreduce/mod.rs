//! `rpc-bench allreduce`: the time of one COMM_ALLREDUCE between two ggml RPC servers (8.0's
//! tensor-split collective) per partial size and server-to-server link, ours and stock 8.0 pairs
//! side by side, beside the floor of that link: a raw ping-pong of the same bytes (method:
//! docs/rpc-bench.md).
//!
//! The bench is the client of both servers: it sets an F32 tensor of n elements on each, pairs
//! them with COMM_INIT as the stock client does (rank 1 dialing rank 0's port + 1000, or a relay
//! emulating the link on a port near its own), then times allreduces ([`lanes`]); the report
//! and chart are in [`report`].

pub mod lanes;
pub mod report;

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use rpc_proto::{Major, COMM_BF16_MIN_ELEMENTS, COMM_PORT_OFFSET};

use crate::cli::Common;
use crate::conn::Target;
use crate::links::LinkProfile;
use crate::stats::Summary;
use crate::tools::default_bin;

pub use lanes::run;

/// Which servers a started pair runs: rank 0's, then rank 1's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairKind {
    /// Two of ours.
    Ours,
    /// Two stock 8.0 `ggml-rpc-server`s.
    Stock,
    /// Ours as rank 0, stock as rank 1.
    OursStock,
    /// Stock as rank 0, ours as rank 1.
    StockOurs,
}

impl PairKind {
    /// Every kind, in table order.
    pub const ALL: [PairKind; 4] = [
        PairKind::Ours,
        PairKind::Stock,
        PairKind::OursStock,
        PairKind::StockOurs,
    ];

    /// `ours`, `stock`, `ours-stock`, `stock-ours` (rank 0 first): its `--pairs` name and label.
    pub fn label(self) -> &'static str {
        match self {
            PairKind::Ours => "ours",
            PairKind::Stock => "stock",
            PairKind::OursStock => "ours-stock",
            PairKind::StockOurs => "stock-ours",
        }
    }

    /// Whether rank `rank`'s server is ours.
    pub fn ours(self, rank: usize) -> bool {
        matches!(
            (self, rank),
            (PairKind::Ours, _) | (PairKind::OursStock, 0) | (PairKind::StockOurs, 1)
        )
    }
}

/// A parsed `--pairs` value, each kind once.
#[derive(Debug, Clone)]
pub struct PairKinds(pub Vec<PairKind>);

fn parse_pairs(s: &str) -> Result<PairKinds, String> {
    let mut v = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let kinds = match name {
            "all" => PairKind::ALL.to_vec(),
            _ => match PairKind::ALL.iter().find(|k| k.label() == name) {
                Some(&k) => vec![k],
                None => {
                    return Err(format!(
                        "'{name}': a pair is ours, stock, ours-stock, stock-ours or all"
                    ))
                }
            },
        };
        for k in kinds {
            if !v.contains(&k) {
                v.push(k);
            }
        }
    }
    if v.is_empty() {
        return Err("no pair given".into());
    }
    Ok(PairKinds(v))
}

/// Settings of an allreduce run: its command line.
#[derive(Args, Debug, Clone)]
pub struct AllreduceConfig {
    /// A pair of running 8.0 servers, `[LABEL=]RANK0_HOST:PORT,RANK1_HOST:PORT` (repeat for
    /// several; a pair labelled `stock` is the reference of `vs stock`). Rank 1 is told to dial
    /// rank 0 at the address given here. Without any, the bench starts `--pairs` on loopback.
    #[arg(long = "pair", value_name = "[LABEL=]HOST:PORT,HOST:PORT")]
    pub pair: Vec<Target>,
    /// Pairs to start on loopback when no --pair is given, comma-separated, rank 0 first: ours,
    /// stock, ours-stock, stock-ours, or all.
    #[arg(long, default_value = "ours,stock", value_parser = parse_pairs)]
    pub pairs: PairKinds,
    /// Our rpc-server.
    #[arg(long, default_value = "target/release/rpc-server")]
    pub ours: PathBuf,
    /// Directory of the stock 8.0 `ggml-rpc-server`; default: $STOCK_BIN8, else the build
    /// `STOCK_PROTO=8 scripts/stock-llama.sh` cached.
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// Address the started servers listen on (-H): loopback, or e.g. the soft-RoCE VM's rxe0
    /// address, where the servers' link can negotiate RDMA.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Compute threads (-t) of every started server.
    #[arg(short = 't', long, default_value_t = 1)]
    pub threads: u32,
    /// Extra flags for our started servers (one string, split at spaces).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub ours_args: String,
    /// Partial sizes, F32 elements (≥ 32768 travel as bf16 between the servers).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "2048,4096,8192,16384,32768,65536"
    )]
    pub sizes: Vec<u64>,
    /// Measured allreduces (and as many synchronising round trips alone) per pair, link and
    /// size.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Warm-up iterations per pair, link and size (not measured), spread over the rounds.
    #[arg(long, default_value_t = 30)]
    pub warmup: usize,
    /// Back-to-back: allreduces sent before the one synchronising round trip.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Back-to-back batches per pair, link, size and round.
    #[arg(long, default_value_t = 3)]
    pub batches: usize,
    /// Rounds the iterations are split into; each round visits every link, and within a link
    /// every pair and the floor, one iteration each in turn.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Server device index.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Label of the servers' link transport for the table (the servers choose it in their caps
    /// exchange); `auto`: what a started server of ours logged when it joined (`transport=`),
    /// else over an emulated link `TCP (relayed)` when the relay carried every partial's bytes,
    /// else `TCP` for started stock pairs (no RDMA on loopback), else `as negotiated`.
    #[arg(long, default_value = "auto")]
    pub link_transport: String,
    /// Logs of the started servers.
    #[arg(long, default_value = "target/rpc-bench-allreduce")]
    pub workdir: PathBuf,
    /// Write a PNG chart (median per allreduce per size, one panel per link, the floor beside).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// `--links` (here: the link between the two servers; default none,tb5-tcp,2.5gbe),
    /// `--csv`, `--md`, `--no-progress`.
    #[command(flatten)]
    pub common: Common,
}

impl AllreduceConfig {
    /// The stock tools' directory.
    pub fn stock_dir(&self) -> PathBuf {
        self.bin.clone().unwrap_or_else(|| default_bin(Major::V8))
    }

    /// The links that run (projected-only profiles are left out).
    pub fn runnable_links(&self) -> Vec<LinkProfile> {
        let links = self.common.links().iter();
        links.filter(|l| l.runnable()).cloned().collect()
    }
}

/// Whether a partial of `n` F32 elements crosses the server-to-server link as bf16 (the stock
/// wire's rule, spec §C).
pub fn travels_as_bf16(n: u64) -> bool {
    n >= COMM_BF16_MIN_ELEMENTS
}

/// Bytes each rank sends (and receives) per allreduce of `n` F32 elements: 2 per element as
/// bf16, else 4.
pub fn wire_bytes(n: u64) -> u64 {
    if travels_as_bf16(n) {
        2 * n
    } else {
        4 * n
    }
}

/// Per-allreduce time from interleaved samples: `with_sync` (allreduce on both servers, then a
/// synchronising round trip on both) and `sync` (that round trip alone). Each `with_sync` sample
/// less the sync's median (subtracting the median, not the paired sample, keeps the allreduce's
/// spread instead of adding the sync's): its median and p99.
pub fn per_allreduce(with_sync: &Summary, sync: &Summary) -> (Duration, Duration) {
    (
        with_sync.p50.saturating_sub(sync.p50),
        with_sync.p99.saturating_sub(sync.p50),
    )
}

/// Back-to-back time per allreduce: the median over batches of (batch time − the sync's median)
/// ÷ `k` allreduces per batch.
pub fn back_to_back(batches: &[Duration], sync_p50: Duration, k: usize) -> Option<Duration> {
    if batches.is_empty() || k == 0 {
        return None;
    }
    let per: Vec<Duration> = batches
        .iter()
        .map(|t| t.saturating_sub(sync_p50) / k as u32)
        .collect();
    Some(bench_report::median(&per))
}

/// The partials of the correctness check: rank 0's `x` and rank 1's `y`, small multiples of ½,
/// exact in bf16, so `x + y` is exact on both ranks whichever way the partials travel.
pub fn check_partials(n: usize) -> (Vec<f32>, Vec<f32>) {
    let x = (0..n).map(|i| (i % 17) as f32 - 8.0).collect();
    let y = (0..n).map(|i| (i % 13) as f32 * 0.5 + 1.0).collect();
    (x, y)
}

/// Whether both ranks hold `x + y`; else where the first difference is.
pub fn check_sums(x: &[f32], y: &[f32], ranks: [&[f32]; 2]) -> Result<(), String> {
    for (r, got) in ranks.iter().enumerate() {
        if got.len() != x.len() {
            return Err(format!(
                "rank {r}: {} elements back, not {}",
                got.len(),
                x.len()
            ));
        }
        let bad = (0..x.len()).find(|&i| got[i] != x[i] + y[i]);
        if let Some(i) = bad {
            return Err(format!(
                "rank {r}, element {i}: {} instead of {} + {} (did the servers exchange?)",
                got[i], x[i], y[i]
            ));
        }
    }
    Ok(())
}

/// The link's transport as a started server of ours logs it when it joins
/// (`joined pairwise comm ... transport="TCP"`): the last such line's value. Stock servers do not
/// say.
pub fn transport_in_log(log: &str) -> Option<String> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("joined pairwise comm"))?;
    let v = line.split_once("transport=")?.1;
    let v = match v.strip_prefix('"') {
        Some(q) => q.split('"').next()?,
        None => v.split_whitespace().next()?,
    };
    (!v.is_empty()).then(|| v.to_string())
}

/// A pair of servers: rank 0's address, then rank 1's, and the logs of started ones.
#[derive(Debug, Clone)]
pub struct PairSpec {
    /// Name in tables and charts.
    pub label: String,
    /// Rank 0, rank 1.
    pub addrs: [SocketAddr; 2],
    /// Their logs (started servers).
    pub logs: Option<[PathBuf; 2]>,
}

impl PairSpec {
    /// The pairs of `--pair`.
    pub fn given(cfg: &AllreduceConfig) -> anyhow::Result<Vec<PairSpec>> {
        cfg.pair
            .iter()
            .map(|t| match t.addrs[..] {
                [a, b] => Ok(PairSpec {
                    label: t.label.clone(),
                    addrs: [a, b],
                    logs: None,
                }),
                _ => bail!("{}: a pair is two servers, RANK0,RANK1", t.label),
            })
            .collect()
    }
}

/// Whether `port` on `ip` can be bound now.
fn bindable(ip: IpAddr, port: u32) -> bool {
    u16::try_from(port).is_ok_and(|p| TcpListener::bind((ip, p)).is_ok())
}

/// Two adjacent free RPC ports on `ip` whose comm ports (+ 1000) are free too.
fn pick_ports(ip: IpAddr) -> anyhow::Result<[u16; 2]> {
    for _ in 0..200 {
        let p = TcpListener::bind((ip, 0))?.local_addr()?.port();
        let p0 = u32::from(p);
        let off = u32::from(COMM_PORT_OFFSET);
        if [p0, p0 + 1, p0 + off, p0 + 1 + off]
            .into_iter()
            .all(|q| bindable(ip, q))
        {
            return Ok([p, p + 1]);
        }
    }
    bail!("found no two adjacent free ports on {ip} with free ports 1000 above them")
}

/// A server the bench started; killed on drop.
pub struct Started {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Started {
    /// Starts `cmd` (to listen on `addr`) and waits up to `ready` until it accepts a connection.
    fn start(mut cmd: Command, addr: SocketAddr, ready: Duration) -> anyhow::Result<Started> {
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
        let mut s = Started { child, addr };
        let t = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if let Some(st) = s.child.try_wait()? {
                bail!(
                    "{:?} exited ({st}) before listening on {addr}",
                    cmd.get_program()
                );
            }
            if t.elapsed() > ready {
                bail!(
                    "{:?} did not listen on {addr} within {} s",
                    cmd.get_program(),
                    ready.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(s)
    }
}

/// Starts the servers of `kind` on `--host`, ranks on adjacent ports (so that every relay port
/// near them is within our server's default `--comm-peer-ports` window), logs in the workdir.
fn start_pair(cfg: &AllreduceConfig, kind: PairKind) -> anyhow::Result<(Vec<Started>, PairSpec)> {
    std::fs::create_dir_all(&cfg.workdir)?;
    let ports = pick_ports(cfg.host)?;
    let mut servers = Vec::new();
    let mut logs = Vec::new();
    for (rank, port) in ports.into_iter().enumerate() {
        let ours = kind.ours(rank);
        let exe = if ours {
            cfg.ours.clone()
        } else {
            cfg.stock_dir().join("ggml-rpc-server")
        };
        if !exe.is_file() {
            bail!(
                "{} not found ({})",
                exe.display(),
                if ours {
                    "cargo build --release -p rpc-server, or --ours"
                } else {
                    "STOCK_PROTO=8 scripts/stock-llama.sh, or --bin"
                }
            );
        }
        let mut cmd = Command::new(&exe);
        cmd.args(["-H", &cfg.host.to_string(), "-p", &port.to_string()]);
        cmd.args(["-t", &cfg.threads.to_string()]);
        if ours {
            cmd.args(cfg.ours_args.split_whitespace());
        }
        let log = cfg.workdir.join(format!("{}-rank{rank}.log", kind.label()));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let what = || format!("{} rank {rank} ({})", kind.label(), exe.display());
        let addr = SocketAddr::new(cfg.host, port);
        servers.push(Started::start(cmd, addr, Duration::from_secs(60)).with_context(what)?);
        logs.push(log);
    }
    let spec = PairSpec {
        label: kind.label().into(),
        addrs: [servers[0].addr, servers[1].addr],
        logs: Some([logs[0].clone(), logs[1].clone()]),
    };
    Ok((servers, spec))
}

/// `rpc-bench allreduce`: starts the pairs (or takes `--pair`), runs, reports.
pub fn command(mut cfg: AllreduceConfig) -> anyhow::Result<()> {
    cfg.iterations = cfg.iterations.max(1);
    let load_before = load_average();
    let mut processes = Vec::new();
    let pairs = if cfg.pair.is_empty() {
        let mut v = Vec::new();
        for &kind in &cfg.pairs.0 {
            let (procs, spec) = start_pair(&cfg, kind)?;
            processes.extend(procs);
            v.push(spec);
        }
        v
    } else {
        PairSpec::given(&cfg)?
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut results = rt.block_on(run(&cfg, &pairs))?;
    results.load = [load_before, load_average()];
    drop(processes);
    let md = report::markdown(&cfg, &pairs, &results);
    cfg.common
        .out
        .emit(&md, &report::csv_table(&results.rows))?;
    if let Some(png) = &cfg.png {
        report::draw_chart(png, &cfg, &pairs, &results.rows)?;
    }
    let failed = results.rows.iter().filter(|r| r.check.is_err()).count();
    if failed > 0 {
        bail!("{failed} rows failed the correctness check (x + y read back from both ranks)");
    }
    Ok(())
}

/// `/proc/loadavg`'s first three fields (Linux), else empty.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The log text of a started server (empty when there is none).
pub fn read_log(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_follow_the_bf16_rule() {
        assert_eq!(wire_bytes(4), 16);
        assert_eq!(wire_bytes(2048), 8192);
        assert_eq!(wire_bytes(16384), 65536);
        assert_eq!(wire_bytes(32767), 131_068, "spec §C: still F32");
        assert_eq!(wire_bytes(32768), 65_536, "spec §C: bf16 from 32768 on");
        assert_eq!(wire_bytes(65536), 131_072);
        assert!(!travels_as_bf16(32767) && travels_as_bf16(32768));
    }

    fn us(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&x| Duration::from_micros(x)).collect()
    }

    #[test]
    fn per_allreduce_subtracts_the_sync_median() {
        let with_sync = Summary::of(&us(&(100..200).collect::<Vec<_>>()));
        let sync = Summary::of(&us(&[30, 40, 50, 60, 1000]));
        let (p50, p99) = per_allreduce(&with_sync, &sync);
        assert_eq!(p50, Duration::from_micros(149 - 50));
        assert_eq!(p99, Duration::from_micros(198 - 50));
        // Never negative.
        let (p50, _) = per_allreduce(&sync, &with_sync);
        assert_eq!(p50, Duration::ZERO);
    }

    #[test]
    fn back_to_back_is_per_allreduce() {
        let b = back_to_back(&us(&[1050, 2050, 1250]), Duration::from_micros(50), 10);
        assert_eq!(b, Some(Duration::from_micros(120)));
        assert_eq!(back_to_back(&[], Duration::ZERO, 10), None);
        assert_eq!(back_to_back(&us(&[5]), Duration::ZERO, 0), None);
    }

    #[test]
    fn check_partials_are_exact_in_bf16_and_caught_when_wrong() {
        let (x, y) = check_partials(100);
        for v in x.iter().chain(&y) {
            let bf16 = f32::from_bits(v.to_bits() & 0xffff_0000);
            assert_eq!(*v, bf16, "{v} is not exact in bf16");
        }
        let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert_eq!(check_sums(&x, &y, [&sum, &sum]), Ok(()));
        // A server that did nothing keeps its own partial.
        let err = check_sums(&x, &y, [&sum, &y]).unwrap_err();
        assert!(err.starts_with("rank 1, element 0"), "{err}");
        assert!(check_sums(&x, &y, [&sum, &sum[..9]]).is_err());
    }

    #[test]
    fn pairs_parse() {
        let k = parse_pairs("ours,stock,ours").unwrap().0;
        assert_eq!(k, [PairKind::Ours, PairKind::Stock]);
        assert_eq!(parse_pairs("all").unwrap().0, PairKind::ALL);
        assert!(parse_pairs("theirs").is_err() && parse_pairs("").is_err());
        assert!(PairKind::OursStock.ours(0) && !PairKind::OursStock.ours(1));
        assert!(!PairKind::StockOurs.ours(0) && PairKind::StockOurs.ours(1));
        assert!(!PairKind::Stock.ours(0) && PairKind::Ours.ours(1));
    }

    #[test]
    fn link_transport_from_logs() {
        let ours = "INFO rpc_server::link: comm link: RDMA cannot engage (no device); offering TCP\n\
            INFO rpc_session::collectives: joined pairwise comm device=0 rank=1 transport=\"TCP\" session.pid=7\n";
        assert_eq!(transport_in_log(ours).as_deref(), Some("TCP"));
        let later =
            format!("{ours}INFO joined pairwise comm device=0 rank=1 transport=RDMA/RC x=1\n");
        assert_eq!(transport_in_log(&later).as_deref(), Some("RDMA/RC"));
        let stock = "[comm_init] device 0 joined pairwise comm as rank 0\n";
        assert_eq!(transport_in_log(stock), None);
        assert_eq!(transport_in_log(""), None);
    }
}
