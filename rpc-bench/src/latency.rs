//! `rpc-bench latency`: round-trip latency per command and size, against any server (cases,
//! lanes and rounds: docs/rpc-bench.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use bench_report::chart::{self, Panel};
use bench_report::{human_bytes, us, ProgressBar, Table};
use clap::Args;
use rpc_client::{Client, RpcTensor, TensorBuilder};
use rpc_proto::{
    Command, Major, PayloadSize, Request, Response, CONN_CAPS_SIZE, FRAME_HEADER_SIZE,
    RESPONSE_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};
use rpc_transport::cli::{RdmaClientArgs, TransportMode};
use rpc_transport::rdma::negotiate::ClientConfig;
use rpc_transport::Transport;

use crate::cli::Common;

use crate::conn::{self, BenchConn, Target};
use crate::echo::Floor;
use crate::links::{LinkKind, LinkProfile};
use crate::relay::{Relay, RelayOptions, Wire};
use crate::stats::Summary;
use crate::traffic::Traffic;
pub use crate::Origin;

/// What one iteration does (as [`Case::name`] says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Case {
    Empty,
    Alignment,
    Set(usize),
    Get(usize),
}

impl Case {
    /// Payload bytes (0 for the empty command).
    pub fn bytes(self) -> usize {
        match self {
            Case::Empty | Case::Alignment => 0,
            Case::Set(n) | Case::Get(n) => n,
        }
    }

    /// `empty (DEVICE_COUNT)`, `tiny (GET_ALIGNMENT)`, `SET_TENSOR 28.0 KiB + DEVICE_COUNT`,
    /// `GET_TENSOR 1.00 MiB`.
    pub fn name(self) -> String {
        let size = human_bytes(self.bytes() as f64);
        match self {
            Case::Empty => "empty (DEVICE_COUNT)".into(),
            Case::Alignment => "tiny (GET_ALIGNMENT)".into(),
            Case::Set(_) => format!("SET_TENSOR {size} + DEVICE_COUNT"),
            Case::Get(_) => format!("GET_TENSOR {size}"),
        }
    }

    /// The cases for these sizes: the two tiny ones first, then set and get per size.
    pub fn all(sizes: &[usize]) -> Vec<Case> {
        let sized = sizes.iter().flat_map(|&n| [Case::Set(n), Case::Get(n)]);
        [Case::Empty, Case::Alignment]
            .into_iter()
            .chain(sized)
            .collect()
    }
}

/// How the servers' lanes take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Alternate {
    /// One iteration of every server's lane in turn (the first lane rotating): every server
    /// measured under the same moment's machine state; each server waits while the client
    /// visits the others, as a worker does between a client's requests.
    Iteration,
    /// Each server on its own within a round (its lanes in turn), the servers one after
    /// another: back-to-back round trips against one server.
    Round,
}

/// Settings of a latency run: its command line.
#[derive(Args, Debug, Clone)]
pub struct LatencyConfig {
    /// Server to measure, `[LABEL=]HOST:PORT` (repeat for several: `--server ours=127.0.0.1:50052
    /// --server stock=127.0.0.1:50053`).
    #[arg(long, required = true, value_name = "[LABEL=]HOST:PORT")]
    pub server: Vec<Target>,
    /// Transport. rdma negotiates upstream's RDMA inside HELLO (fails if it does not engage);
    /// auto falls back to TCP.
    #[arg(long, value_enum, default_value = "tcp")]
    pub transport: TransportMode,
    /// The RDMA flavor and device flags.
    #[command(flatten)]
    pub rdma: RdmaClientArgs,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "4096,28672,1048576")]
    pub sizes: Vec<usize>,
    /// Measured iterations per case.
    #[arg(long, default_value_t = 300)]
    pub iterations: usize,
    /// Warm-up iterations per case (not measured), spread over the rounds.
    #[arg(long, default_value_t = 30)]
    pub warmup: usize,
    /// Rounds the iterations are split into; each round visits every server and link in turn.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// How servers take turns: `iteration` (one round trip per server in turn) or `round`
    /// (back-to-back round trips against each server, servers one after another per round).
    #[arg(long, value_enum, default_value = "iteration")]
    pub alternate: Alternate,
    /// Server device index.
    #[arg(long, default_value_t = 0)]
    pub device: u32,
    /// Print a text histogram of every measured case.
    #[arg(long)]
    pub histograms: bool,
    /// Also measure the floor: two do-nothing servers in a child process each, which read each
    /// request and answer it with zeros: one over rpc-server's TCP code and poll policy (row
    /// "echo (our transport)"), one a plain blocking read/write loop, the stock server's shape
    /// (row "echo (blocking)"); loopback only.
    #[arg(long)]
    pub echo_floor: bool,
    /// Write a PNG chart (p50 per link: empty command and GET_TENSOR of each size).
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// `--links`, `--csv`, `--md`, `--no-progress`.
    #[command(flatten)]
    pub common: Common,
}

impl LatencyConfig {
    /// What to offer in HELLO: upstream's RDMA framing of the flavor, as a stock client does
    /// (`None`: TCP).
    pub fn rdma_config(&self) -> Option<ClientConfig> {
        (self.transport != TransportMode::Tcp).then(|| ClientConfig {
            flavor: self.rdma.rdma_flavor.flavor(),
            lean: false,
            opts: self.rdma.rdma.options(),
            ..ClientConfig::default()
        })
    }
}

/// One row of results.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Server label.
    pub server: String,
    /// Link name (`relay` for the counting relay without delay).
    pub link: String,
    /// Transport used (TCP, RDMA/RC, RDMA/UC).
    pub transport: String,
    /// The case.
    pub case: Case,
    /// Samples (`None` for projections).
    pub summary: Option<Summary>,
    /// Projected round-trip time (`None` where there is no projection).
    pub projected: Option<Duration>,
    /// Bytes on the wire per iteration (both directions), when counted.
    pub bytes: Option<u64>,
    /// Where the numbers come from.
    pub origin: Origin,
}

/// How one lane reaches the server: straight (TCP or RDMA, [`Origin::Measured`]), or through a
/// relay over the link `profile` (none: the counting relay without delay).
struct LaneSpec {
    link: String,
    origin: Origin,
    profile: Option<LinkProfile>,
}

/// What a lane measured over all rounds: its transport, and per case the samples and the
/// relay's count of the measured iterations.
#[derive(Default)]
struct LaneResult {
    transport: String,
    samples: Vec<Vec<Duration>>,
    traffic: Vec<Option<Traffic>>,
}

/// One open way of reaching a server: straight, through the counting relay, or through an
/// emulated link.
struct Lane {
    conn: BenchConn,
    relay: Option<Relay>,
    /// A 1-D f32 tensor over the lane's whole buffer (each case copies its size at offset 0).
    tensor: RpcTensor,
}

impl Lane {
    async fn open(
        spec: &LaneSpec,
        target: SocketAddr,
        cfg: &LatencyConfig,
    ) -> anyhow::Result<Lane> {
        let wire = spec.profile.as_ref().map_or(Wire::transparent(), Wire::of);
        let relay = (spec.origin != Origin::Measured)
            .then(|| Relay::start(target, wire, RelayOptions::default()));
        let relay = relay.transpose()?;
        let mut conn = match &relay {
            Some(r) => conn::connect(r.addr(), None, false).await?,
            None => {
                let fallback = cfg.transport == TransportMode::Auto;
                conn::connect(target, cfg.rdma_config().as_ref(), fallback).await?
            }
        };
        let max = cfg.sizes.iter().copied().max().unwrap_or(4).max(4);
        let b = conn.alloc_buffer(cfg.device, max as u64).await?;
        let b = b.with_context(|| format!("the server could not allocate a {max}-byte buffer"))?;
        let base = conn.buffer_get_base(b.handle).await?;
        let ne = [(max / 4) as u32];
        let tensor = TensorBuilder::f32(100).ne(&ne).data(b.handle, base).build();
        Ok(Lane {
            conn,
            relay,
            tensor,
        })
    }

    async fn once(&mut self, case: &Case, data: &[u8], out: &mut [u8]) -> anyhow::Result<Duration> {
        let t = &self.tensor;
        let start = Instant::now();
        match *case {
            Case::Get(n) => self.conn.get_tensor_into(t, 0, &mut out[..n]).await?,
            Case::Set(n) => {
                self.conn.set_tensor(t, 0, &data[..n], false).await?;
                self.conn.device_count().await?;
            }
            Case::Empty => {
                self.conn.device_count().await?;
            }
            Case::Alignment => {
                self.conn.get_alignment(0).await?;
            }
        }
        Ok(start.elapsed())
    }
}

/// How long opening a lane may take before the server is taken to serve one connection at a
/// time (the stock `ggml-rpc-server` does).
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Measures `lanes` interleaved into `acc` (`acc[server][spec]`; lane `i` is `ids[i]`): per
/// case, the warm-up of each, then one iteration of each in turn, the first lane of a turn
/// rotating so that no lane always follows the same one.
async fn measure(
    lanes: &mut [Lane],
    acc: &mut [Vec<LaneResult>],
    ids: &[(usize, usize)],
    cases: &[Case],
    (iterations, warmup): (usize, usize),
    pb: &ProgressBar,
    label: &str,
) -> anyhow::Result<()> {
    let max = cases.iter().map(|c| c.bytes()).max().unwrap_or(0).max(4);
    let data: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    let mut out = vec![0u8; data.len()];
    for (lane, &(ti, si)) in lanes.iter().zip(ids) {
        let acc = &mut acc[ti][si];
        acc.transport = lane.conn.transport().name().to_string();
        acc.samples.resize(cases.len(), Vec::new());
        acc.traffic.resize(cases.len(), None);
    }
    let n = lanes.len();
    for (ci, case) in cases.iter().enumerate() {
        pb.set_message(format!("{label}: {}", case.name()));
        for lane in lanes.iter_mut() {
            for _ in 0..warmup {
                lane.once(case, &data, &mut out).await?;
                pb.inc(1);
            }
        }
        let count = |l: &Lane| l.relay.as_ref().map(|r| r.counters().snapshot());
        let before: Vec<_> = lanes.iter().map(count).collect();
        for it in 0..iterations {
            for k in 0..n {
                let li = (it + k) % n;
                let (ti, si) = ids[li];
                let took = lanes[li].once(case, &data, &mut out).await?;
                acc[ti][si].samples[ci].push(took);
                pb.inc(1);
            }
        }
        for ((lane, &(ti, si)), b) in lanes.iter().zip(ids).zip(before) {
            if let (Some(now), Some(b)) = (count(lane), b) {
                let t = acc[ti][si].traffic[ci].get_or_insert_with(Traffic::default);
                *t = t.plus(&now.since(&b));
            }
        }
    }
    Ok(())
}

/// The lanes open at once, as `(server, spec)` pairs, one group after another. A server that
/// serves one connection at a time (`concurrent[server]` false) has one lane per group. With
/// [`Alternate::Iteration`] a group holds lanes of every server; with [`Alternate::Round`] of one.
fn lane_groups(
    concurrent: &[bool],
    specs: usize,
    alternate: Alternate,
) -> Vec<Vec<(usize, usize)>> {
    let per_server = |ti: usize| -> Vec<Vec<(usize, usize)>> {
        match concurrent[ti] {
            true => vec![(0..specs).map(|si| (ti, si)).collect()],
            false => (0..specs).map(|si| vec![(ti, si)]).collect(),
        }
    };
    let servers = 0..concurrent.len();
    match alternate {
        Alternate::Round => servers.flat_map(per_server).collect(),
        Alternate::Iteration => {
            let each: Vec<_> = servers.map(per_server).collect();
            let groups = each.iter().map(Vec::len).max().unwrap_or(0);
            (0..groups)
                .map(|g| {
                    each.iter()
                        .filter_map(|s| s.get(g))
                        .flatten()
                        .copied()
                        .collect()
                })
                .collect()
        }
    }
}

/// Whether the server answers a second connection while `first` is open. The stock
/// `ggml-rpc-server` serves one connection at a time, and dies of SIGPIPE when a client leaves
/// before its reply, so the probe never abandons a request: if no HELLO reply comes in time, it
/// closes `first`, waits for the (now accepted) probe's reply, and only then closes the probe.
async fn concurrent_probe(target: SocketAddr, first: Lane) -> anyhow::Result<bool> {
    let mut probe = Client::connect_raw(target).await?;
    let caps = [0; CONN_CAPS_SIZE];
    probe.request(&Request::Hello { caps }).await?;
    let concurrent = match tokio::time::timeout(OPEN_TIMEOUT, probe.response(Command::Hello)).await
    {
        Ok(r) => r.map(|_| true)?,
        Err(_) => {
            drop(first);
            let late =
                tokio::time::timeout(Duration::from_secs(60), probe.response(Command::Hello));
            let why =
                || format!("{target} did not answer a second connection after the first closed");
            late.await.with_context(why)??;
            false
        }
    };
    probe.shutdown().await?;
    Ok(concurrent)
}

/// Runs the whole latency benchmark, in rounds as the module says (a server that serves one
/// connection at a time gets each lane closed before the next opens).
pub async fn run(cfg: &LatencyConfig) -> anyhow::Result<Vec<CaseResult>> {
    let cases = Case::all(&cfg.sizes);
    let rdma = cfg.transport != TransportMode::Tcp;
    let links = cfg.common.links();
    let emulated = links.iter().filter(|l| l.kind == LinkKind::Emulated);
    if rdma && emulated.clone().next().is_some() {
        anyhow::bail!(
            "link emulation is a TCP relay: with --transport rdma use --links none (plus projected profiles such as tb5-rdma)"
        );
    }
    let spec = |link: &str, origin, profile: Option<&LinkProfile>| LaneSpec {
        link: link.into(),
        origin,
        profile: profile.cloned(),
    };
    let mut specs = Vec::new();
    if links.iter().any(|l| l.kind == LinkKind::Native) {
        specs.push(spec("none", Origin::Measured, None));
    }
    if links.iter().any(|l| l.kind != LinkKind::Native) && !rdma {
        specs.push(spec("relay", Origin::MeasuredRelay, None));
    }
    specs.extend(emulated.map(|l| spec(&l.name, Origin::MeasuredEmulated, Some(l))));
    if specs.is_empty() {
        anyhow::bail!(
            "nothing to measure: give at least one of none, 2.5gbe, 10gbe, tb5-tcp, custom:..."
        );
    }
    let rounds = cfg.rounds.clamp(1, cfg.iterations.max(1));
    let warmup = if cfg.warmup == 0 {
        0
    } else {
        cfg.warmup.div_ceil(rounds).max(cfg.warmup.min(3))
    };
    let total =
        (cfg.server.len() * specs.len() * cases.len() * (cfg.iterations + rounds * warmup)) as u64;
    let pb = cfg.common.out.progress_bar(total);
    // Which servers take concurrent connections.
    let mut concurrent = Vec::new();
    for target in &cfg.server {
        pb.set_message(format!("{}: connecting", target.label));
        let first = Lane::open(&specs[0], target.addrs[0], cfg).await?;
        let c = specs.len() == 1 || concurrent_probe(target.addrs[0], first).await?;
        if !c {
            tracing::info!(
                "{} serves one connection at a time: its links are measured one after another",
                target.label
            );
        }
        concurrent.push(c);
    }
    let mut results: Vec<Vec<LaneResult>> = cfg
        .server
        .iter()
        .map(|_| specs.iter().map(|_| LaneResult::default()).collect())
        .collect();
    let groups = lane_groups(&concurrent, specs.len(), cfg.alternate);
    for r in 0..rounds {
        let iters = cfg.iterations / rounds + usize::from(r < cfg.iterations % rounds);
        for ids in &groups {
            let mut lanes = Vec::new();
            for &(ti, si) in ids {
                lanes.push(Lane::open(&specs[si], cfg.server[ti].addrs[0], cfg).await?);
            }
            let mut names: Vec<String> = Vec::new();
            for &(ti, _) in ids {
                if !names.contains(&cfg.server[ti].label) {
                    names.push(cfg.server[ti].label.clone());
                }
            }
            let label = format!("{} (round {}/{rounds})", names.join(", "), r + 1);
            let w = (iters, warmup);
            measure(&mut lanes, &mut results, ids, &cases, w, &pb, &label).await?;
        }
    }
    let mut rows = Vec::new();
    for (target, res) in cfg.server.iter().zip(&results) {
        rows.extend(rows_for(target, &specs, res, &cases, cfg));
    }
    pb.finish_and_clear();
    Ok(rows)
}

/// `rpc-bench latency`: runs the benchmark and writes its report.
pub fn command(mut cfg: LatencyConfig) -> anyhow::Result<()> {
    cfg.iterations = cfg.iterations.max(1);
    let mut floor = None;
    if cfg.echo_floor {
        anyhow::ensure!(
            cfg.transport == TransportMode::Tcp,
            "--echo-floor measures TCP over loopback; leave out --transport rdma"
        );
        let mut children = Vec::new();
        for f in [Floor::Transport, Floor::Blocking] {
            let child = crate::echo::spawn_child(f)?;
            cfg.server.push(Target {
                label: f.label().into(),
                addrs: vec![child.addr],
            });
            children.push(child);
        }
        floor = Some(children);
    }
    if let Some(t) = cfg.server.iter().find(|t| t.addrs.len() > 1) {
        anyhow::bail!("{}: latency measures one server per --server", t.label);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = rt.block_on(run(&cfg))?;
    drop(floor);
    let turns = match cfg.alternate {
        Alternate::Iteration => "one round trip of every server's lane in turn",
        Alternate::Round => {
            "each server's round trips back to back, its lanes in turn, servers one after another"
        }
    };
    let mut md = format!(
        "## rpc-bench latency\n\n{} measured iterations per case in {} rounds (each round visits every server and \
         link in turn; within a round: {turns}), after {} warm-up; servers: {}.\n\
         `numbers`: *measured* = client straight to the server; *measured (relay, no delay)* = through the \
         counting relay, the base of the projections; *measured (emulated link)* = through the user-space \
         link emulator; *projected* = relay p50 (direct p50 for projection-only links) + round trips × RTT + \
         wire bytes ÷ bandwidth.\n\n",
        cfg.iterations,
        cfg.rounds,
        cfg.warmup,
        cfg.server.iter().map(|t| format!("{} ({})", t.label, t.addrs[0])).collect::<Vec<_>>().join(", ")
    );
    let servers: Vec<String> = cfg.server.iter().map(|t| t.label.clone()).collect();
    if let Some(t) = side_by_side(&rows, &servers) {
        md.push_str("Side by side (straight to each server, p50 / p99 in us):\n\n");
        md.push_str(&t.markdown());
        md.push_str("\nEvery row:\n\n");
    }
    md.push_str(&table(&rows).markdown());
    md.push('\n');
    md.push_str(&cfg.common.links_section());
    if cfg.histograms {
        md.push_str("\nHistograms:\n\n```\n");
        md.push_str(&histograms(&rows));
        md.push_str("```\n");
    }
    cfg.common.out.emit(&md, &csv_table(&rows))?;
    if let Some(png) = &cfg.png {
        draw_chart(png, &rows, &cfg)?;
    }
    Ok(())
}

fn draw_chart(path: &Path, rows: &[CaseResult], cfg: &LatencyConfig) -> anyhow::Result<()> {
    let cats = chart::distinct(rows.iter().map(|r| &r.link));
    let servers: Vec<String> = cfg.server.iter().map(|t| t.label.clone()).collect();
    // The empty round trip and GET_TENSOR of each size.
    let panels = Case::all(&cfg.sizes)
        .into_iter()
        .filter(|c| !matches!(c, Case::Set(_)))
        .map(|case| {
            let find = |s: &str, l: &str| {
                (rows.iter()).find(|r| r.server == s && r.link == l && r.case == case)
            };
            let p50 = |r: &CaseResult| r.summary.as_ref().map(|s| s.p50.as_secs_f64() * 1e6);
            let projected = |r: &CaseResult| r.projected.map(|p| p.as_secs_f64() * 1e6);
            let series = chart::measured_and_projected(
                &servers,
                &cats,
                find,
                ("measured p50", &p50),
                &projected,
            );
            Panel::new(&case.name(), "round trip, us", &cats, series)
        })
        .collect::<Vec<_>>();
    chart::draw(
        path,
        "rpc-bench latency: p50 round trip per link (solid: measured, light: projected)",
        &panels,
        &["Emulated links run through rpc-bench's user-space link emulator; tb5-rdma is projected from published figures.".into()],
    )
}

/// Result rows of one server (measured lanes, then projection-only links).
fn rows_for(
    target: &Target,
    specs: &[LaneSpec],
    lanes: &[LaneResult],
    cases: &[Case],
    cfg: &LatencyConfig,
) -> Vec<CaseResult> {
    let mut rows = Vec::new();
    let summaries: Vec<Vec<Summary>> = lanes
        .iter()
        .map(|l| l.samples.iter().map(|s| Summary::of(s)).collect())
        .collect();
    let direct_i = specs.iter().position(|l| l.origin == Origin::Measured);
    let relay_i = specs.iter().position(|l| l.origin == Origin::MeasuredRelay);
    for (li, (spec, lane)) in specs.iter().zip(lanes).enumerate() {
        for (ci, case) in cases.iter().enumerate() {
            let per = lane.traffic[ci]
                .as_ref()
                .map(|t| per_iter(t, cfg.iterations));
            let base = relay_i.map(|ri| summaries[ri][ci].p50);
            let projected = (spec.profile.as_ref().zip(base).zip(per))
                .map(|((p, base), (bytes, rt, uc))| p.project(base, rt, bytes, uc));
            rows.push(CaseResult {
                server: target.label.clone(),
                link: spec.link.clone(),
                transport: lane.transport.clone(),
                case: *case,
                summary: Some(summaries[li][ci].clone()),
                projected,
                bytes: per.map(|p| p.0 as u64),
                origin: spec.origin,
            });
        }
    }
    for link in cfg
        .common
        .links()
        .iter()
        .filter(|l| l.kind == LinkKind::ProjectedOnly)
    {
        // Base: the direct measurement when there is one, else the relay's.
        let Some(bi) = direct_i.or(relay_i) else {
            continue;
        };
        for (ci, case) in cases.iter().enumerate() {
            let (bytes, rt, uc) = match relay_i.and_then(|ri| lanes[ri].traffic[ci].as_ref()) {
                Some(t) => per_iter(t, cfg.iterations),
                None => analytic_traffic(case),
            };
            rows.push(CaseResult {
                server: target.label.clone(),
                link: link.name.clone(),
                transport: "RDMA (projected)".into(),
                case: *case,
                summary: None,
                projected: Some(link.project(summaries[bi][ci].p50, rt, bytes, uc)),
                bytes: Some(bytes as u64),
                origin: Origin::Projected,
            });
        }
    }
    rows
}

/// (bytes, round trips, UC-padded bytes) per iteration.
fn per_iter(t: &Traffic, iterations: usize) -> (f64, f64, f64) {
    let n = iterations.max(1) as f64;
    (
        t.bytes() as f64 / n,
        t.round_trips as f64 / n,
        t.uc_bytes() as f64 / n,
    )
}

/// Bytes per iteration from the protocol's sizes (used when nothing was counted, e.g. RDMA):
/// every message of the case (request frames, then size-prefixed replies), one round trip.
fn analytic_traffic(case: &Case) -> (f64, f64, f64) {
    let (head, reply) = (FRAME_HEADER_SIZE as u64, RESPONSE_HEADER_SIZE as u64);
    let device_count = [
        head,
        reply + Response::fixed_size(Command::DeviceCount).unwrap_or(0),
    ];
    let (PayloadSize::Exact(get) | PayloadSize::AtLeast(get)) =
        Command::GetTensor.request_size(Major::CURRENT);
    let n = case.bytes() as u64;
    let msgs = match case {
        Case::Empty => device_count.to_vec(),
        Case::Alignment => vec![
            head + 4,
            reply + Response::fixed_size(Command::GetAlignment).unwrap_or(0),
        ],
        Case::Set(_) => [
            &[head + SET_TENSOR_HEADER_SIZE as u64 + n][..],
            &device_count,
        ]
        .concat(),
        Case::Get(_) => vec![head + get, reply + n],
    };
    let uc = msgs
        .iter()
        .map(|&len| LinkProfile::tb5_rdma().wire_bytes(len) as f64);
    (msgs.iter().sum::<u64>() as f64, 1.0, uc.sum())
}

/// The measured rows straight to each server (link `none`) as one row per case and a p50 and
/// p99 column per server, in `servers` order; `None` when no such row was measured.
pub fn side_by_side(rows: &[CaseResult], servers: &[String]) -> Option<Table> {
    let direct: Vec<&CaseResult> = rows
        .iter()
        .filter(|r| r.origin == Origin::Measured && r.summary.is_some())
        .collect();
    let mut cases: Vec<Case> = Vec::new();
    for r in &direct {
        if !cases.contains(&r.case) {
            cases.push(r.case);
        }
    }
    if cases.is_empty() {
        return None;
    }
    let mut headers = vec!["case".to_string()];
    for s in servers {
        headers.push(format!("{s} p50"));
        headers.push(format!("{s} p99"));
    }
    let mut t = Table::new(&headers.iter().map(String::as_str).collect::<Vec<_>>());
    for case in cases {
        let mut row = vec![case.name()];
        for s in servers {
            let hit = direct.iter().find(|r| &r.server == s && r.case == case);
            let sum = hit.and_then(|r| r.summary.as_ref());
            row.push(sum.map_or("-".into(), |s| us(s.p50)));
            row.push(sum.map_or("-".into(), |s| us(s.p99)));
        }
        t.push(row);
    }
    Some(t)
}

/// The results as a table.
pub fn table(rows: &[CaseResult]) -> Table {
    let stat = |r: &CaseResult, g: fn(&Summary) -> Duration| {
        r.summary.as_ref().map_or("-".to_string(), |s| us(g(s)))
    };
    Table::of(
        rows,
        &[
            ("server", &|r| r.server.clone()),
            ("link", &|r| r.link.clone()),
            ("transport", &|r| r.transport.clone()),
            ("case", &|r| r.case.name()),
            ("wire bytes", &|r| {
                r.bytes.map_or("-".into(), |b| b.to_string())
            }),
            ("p50 us", &|r| stat(r, |s| s.p50)),
            ("p99 us", &|r| stat(r, |s| s.p99)),
            ("mean us", &|r| stat(r, |s| s.mean)),
            ("min us", &|r| stat(r, |s| s.min)),
            ("projected us", &|r| r.projected.map_or("-".into(), us)),
            ("numbers", &|r| r.origin.label().into()),
        ],
    )
}

/// CSV with the histogram of each measured row.
pub fn csv_table(rows: &[CaseResult]) -> Table {
    let mut t = table(rows);
    let n = |s: &Summary| s.n.to_string();
    t.add_columns(
        rows,
        &[
            ("n", &|r| r.summary.as_ref().map_or("0".into(), n)),
            ("histogram", &|r| {
                r.summary
                    .as_ref()
                    .map_or("".into(), Summary::histogram_compact)
            }),
        ],
    );
    t
}

/// Text histograms of the measured rows.
pub fn histograms(rows: &[CaseResult]) -> String {
    let mut out = String::new();
    for r in rows {
        let Some(s) = &r.summary else { continue };
        out.push_str(&format!(
            "{} / {} / {}: p50 {} us, p99 {} us\n",
            r.server,
            r.link,
            r.case.name(),
            us(s.p50),
            us(s.p99)
        ));
        for l in s.histogram_lines(40) {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_groups_alternate_servers_and_keep_one_stock_lane_at_a_time() {
        // Server 0 takes concurrent connections, server 1 (stock) one at a time; two links.
        let it = lane_groups(&[true, false], 2, Alternate::Iteration);
        assert_eq!(it, vec![vec![(0, 0), (0, 1), (1, 0)], vec![(1, 1)]]);
        let round = lane_groups(&[true, false], 2, Alternate::Round);
        assert_eq!(
            round,
            vec![vec![(0, 0), (0, 1)], vec![(1, 0)], vec![(1, 1)]]
        );
        // One link: every server in one group, each server's lane once.
        let one = lane_groups(&[false, true, false], 1, Alternate::Iteration);
        assert_eq!(one, vec![vec![(0, 0), (1, 0), (2, 0)]]);
    }

    #[test]
    fn side_by_side_puts_each_server_in_its_columns() {
        let row = |server: &str, case, p50| CaseResult {
            server: server.into(),
            link: "none".into(),
            transport: "TCP".into(),
            case,
            summary: Some(Summary::of(&[Duration::from_micros(p50)])),
            projected: None,
            bytes: None,
            origin: Origin::Measured,
        };
        let rows = [
            row("ours", Case::Empty, 10),
            row("stock", Case::Empty, 20),
            row("ours", Case::Alignment, 11),
        ];
        let t = side_by_side(&rows, &["ours".into(), "stock".into()]).unwrap();
        let md = t.markdown();
        assert!(
            md.contains("| case | ours p50 | ours p99 | stock p50 | stock p99 |"),
            "{md}"
        );
        assert!(
            md.contains("| empty (DEVICE_COUNT) | 10.0 | 10.0 | 20.0 | 20.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| tiny (GET_ALIGNMENT) | 11.0 | 11.0 | - | - |"),
            "{md}"
        );
    }

    #[test]
    fn analytic_traffic_matches_the_counted_bytes() {
        // The same figures the relay counts in tests/against_server.rs.
        let bytes = |case| analytic_traffic(&case).0;
        assert_eq!(bytes(Case::Empty), (9 + 8 + 4) as f64);
        assert_eq!(bytes(Case::Set(4096)), (9 + 305 + 4096 + 9 + 8 + 4) as f64);
        assert_eq!(bytes(Case::Get(4096)), (9 + 312 + 8 + 4096) as f64);
        assert_eq!(bytes(Case::Alignment), (9 + 4 + 8 + 8) as f64);
        let uc = analytic_traffic(&Case::Get(4096)).2;
        let wire = |len| LinkProfile::tb5_rdma().wire_bytes(len) as f64;
        assert_eq!(uc, wire(9 + 312) + wire(8 + 4096));
    }
}
