//! The measuring of `rpc-bench allreduce`: a pair lane (the bench's connections to both ranks,
//! a tensor on each, the relay emulating their link) and the floor lane (a raw ping-pong of the
//! same bytes over the same kind of link), visited in turn once per iteration, in rounds.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rpc_client::{CommInit, RpcTensor, TensorBuilder};
use rpc_proto::{Major, COMM_PORT_OFFSET};

use super::{
    back_to_back, check_partials, check_sums, per_allreduce, read_log, transport_in_log,
    wire_bytes, AllreduceConfig, PairSpec,
};
use crate::conn::{self, BenchConn};
use crate::links::{LinkKind, LinkProfile};
use crate::relay::{Relay, RelayOptions, Wire};
use crate::stats::Summary;
use crate::Origin;

/// How long both COMM_INITs may take (a stock rank 0 waits for its peer forever).
const INIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a relay keeps dialing rank 0's comm port (rank 0 listens only once asked).
const RELAY_UPSTREAM_WAIT: Duration = Duration::from_secs(15);
/// Relay ports are looked for within this distance of rank 1's RPC port (our server's default
/// `--comm-peer-ports` window is 100).
const RELAY_PORT_WINDOW: u16 = 99;

/// One result row: a pair (or its floor) over one link at one size.
#[derive(Debug, Clone)]
pub struct Row {
    /// Link between the servers (`none`: straight).
    pub link: String,
    /// Where the numbers come from (straight or through the emulated link).
    pub origin: Origin,
    /// Pair label.
    pub pair: String,
    /// The link's transport (see `--link-transport`).
    pub link_transport: String,
    /// F32 elements of the partial.
    pub n: u64,
    /// Bytes each rank sends per allreduce ([`wire_bytes`]).
    pub wire: u64,
    /// Bytes per allreduce the relay carried, rank 1 → rank 0 and back (emulated links).
    pub counted: Option<(u64, u64)>,
    /// Allreduce on both servers plus the synchronising round trip on both.
    pub with_sync: Summary,
    /// The synchronising round trip alone.
    pub sync: Summary,
    /// Per allreduce: median and p99 ([`per_allreduce`]).
    pub allreduce: (Duration, Duration),
    /// Back-to-back per allreduce ([`back_to_back`]).
    pub back_to_back: Option<Duration>,
    /// The floor: a raw ping-pong of `wire` bytes over the same link.
    pub floor: Summary,
    /// The correctness check of every round (the first failure).
    pub check: Result<(), String>,
}

/// What a run measured, and the machine's load before and after (filled by the command).
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// Per link, size, then pair.
    pub rows: Vec<Row>,
    /// `/proc/loadavg` before and after.
    pub load: [String; 2],
}

/// A pair's samples of one link and size over the rounds.
#[derive(Default)]
struct Acc {
    with_sync: Vec<Duration>,
    sync: Vec<Duration>,
    batches: Vec<Duration>,
    /// Relay bytes rank 1 → rank 0, back, and the allreduces they belong to.
    counted: Option<(u64, u64, u64)>,
    /// The link transport a server logged.
    logged: Option<String>,
    check: Option<Result<(), String>>,
}

/// The bench's side of one pair: a connection to each rank with a buffer for the largest
/// partial, and while a link is set up, the relay emulating it.
struct PairLane {
    label: String,
    addrs: [SocketAddr; 2],
    conns: [BenchConn; 2],
    buffers: [(u64, u64); 2],
    relay: Option<Relay>,
    /// The started servers' logs, and how far they were read.
    logs: Option<[PathBuf; 2]>,
    log_read: [usize; 2],
}

impl PairLane {
    async fn open(spec: &PairSpec, max_n: u64, device: u32) -> anyhow::Result<PairLane> {
        let mut conns = Vec::new();
        let mut buffers = Vec::new();
        for (rank, &addr) in spec.addrs.iter().enumerate() {
            let what = || format!("{} rank {rank} ({addr})", spec.label);
            let mut c = conn::connect(addr, None, false).await.with_context(what)?;
            if c.major() != Major::V8 {
                bail!(
                    "{}: speaks protocol {}; collectives need 8.0.0",
                    what(),
                    c.major()
                );
            }
            let b = c.alloc_buffer(device, 4 * max_n.max(1)).await?;
            let b = b.with_context(|| format!("{}: no buffer of {} B", what(), 4 * max_n))?;
            let base = c.buffer_get_base(b.handle).await?;
            conns.push(c);
            buffers.push((b.handle, base));
        }
        let conns = <[BenchConn; 2]>::try_from(conns).ok();
        let buffers = <[(u64, u64); 2]>::try_from(buffers).ok();
        Ok(PairLane {
            label: spec.label.clone(),
            addrs: spec.addrs,
            conns: conns.context("two connections")?,
            buffers: buffers.context("two buffers")?,
            relay: None,
            logs: spec.logs.clone(),
            log_read: [0; 2],
        })
    }

    /// An F32 tensor of `n` elements at the start of rank `rank`'s buffer.
    fn tensor(&self, rank: usize, n: u64) -> RpcTensor {
        let (handle, base) = self.buffers[rank];
        let ne = [u32::try_from(n).unwrap_or(u32::MAX)];
        TensorBuilder::f32(200 + rank as u64)
            .ne(&ne)
            .data(handle, base)
            .build()
    }

    /// COMM_INIT on both ranks as the stock client sends them (both out before either answer),
    /// rank 1 told to dial rank 0's port + 1000 or, over an emulated link, a relay listening on
    /// a port near its own + 1000 that forwards to it.
    async fn init(&mut self, link: &LinkProfile, device: u32) -> anyhow::Result<()> {
        let rank0_comm = self.addrs[0].port() as u32 + u32::from(COMM_PORT_OFFSET);
        let (host, port) = if link.kind == LinkKind::Native {
            (self.addrs[0].ip().to_string(), rank0_comm)
        } else {
            // The relay listens on 127.0.0.1: rank 1 must run on this machine.
            if !self.addrs.iter().all(|a| is_local(a.ip())) {
                bail!(
                    "{}: emulated links need both servers on this machine (the relay listens on \
                     127.0.0.1); use --links none",
                    self.label
                );
            }
            let listener = relay_listener(self.addrs)?;
            let port = u32::from(listener.local_addr()?.port());
            let upstream = SocketAddr::new(self.addrs[0].ip(), rank0_comm as u16);
            let opts = RelayOptions {
                protocol: false,
                zero_hello_caps: false,
                upstream_wait: RELAY_UPSTREAM_WAIT,
                ..RelayOptions::default()
            };
            self.relay = Some(Relay::on(listener, upstream, Wire::of(link), opts)?);
            ("127.0.0.1".to_string(), port)
        };
        let init = |rank, host: &str, port| -> anyhow::Result<CommInit> {
            Ok(CommInit {
                device,
                rank,
                world: 2,
                port,
                host: CommInit::host_field(host).context("rank 0's host is too long")?,
            })
        };
        // Rank 0 listens on its own port + 1000 (ours refuses any other).
        let (init0, init1) = (init(0, "", rank0_comm)?, init(1, &host, port)?);
        let [c0, c1] = &mut self.conns;
        let both = async { tokio::join!(c0.comm_init(init0), c1.comm_init(init1)) };
        let (ok0, ok1) = tokio::time::timeout(INIT_TIMEOUT, both)
            .await
            .with_context(|| {
                format!(
                    "{}: COMM_INIT not answered within {} s",
                    self.label,
                    INIT_TIMEOUT.as_secs()
                )
            })?;
        let (ok0, ok1) = (ok0?, ok1?);
        if !(ok0 && ok1) {
            bail!(
                "{} over {}: COMM_INIT answered rank 0 {ok0}, rank 1 {ok1} (rank 1 dials {host}:{port}; \
                 the servers' logs say why)",
                self.label,
                link.name
            );
        }
        Ok(())
    }

    /// COMM_FREE on both; the relay goes.
    async fn free(&mut self, device: u32) -> anyhow::Result<()> {
        for c in &mut self.conns {
            c.comm_free(device).await?;
        }
        // A round trip on each, so that both have left before the next COMM_INIT.
        self.sync().await?;
        self.relay = None;
        Ok(())
    }

    /// Zeroes both buffers (the timed allreduces then sum zeros: values stay put).
    async fn clear(&mut self) -> anyhow::Result<()> {
        for (c, &(handle, _)) in self.conns.iter_mut().zip(&self.buffers) {
            c.buffer_clear(handle, 0).await?;
        }
        Ok(())
    }

    /// The synchronising round trip alone: GET_TENSOR of one element on both servers at once.
    async fn sync(&mut self) -> anyhow::Result<Duration> {
        let (t0, t1) = (self.tensor(0, 1), self.tensor(1, 1));
        let [c0, c1] = &mut self.conns;
        let (mut b0, mut b1) = ([0u8; 4], [0u8; 4]);
        let start = Instant::now();
        let (r0, r1) = tokio::join!(
            c0.get_tensor_into(&t0, 0, &mut b0),
            c1.get_tensor_into(&t1, 0, &mut b1)
        );
        let d = start.elapsed();
        r0?;
        r1?;
        Ok(d)
    }

    /// `k` COMM_ALLREDUCEs of `n` elements on both servers, then the synchronising round trip
    /// on both (a server answers it only once its allreduces are done): the whole time.
    async fn allreduces(&mut self, n: u64, k: usize, device: u32) -> anyhow::Result<Duration> {
        let (t0, t1) = (self.tensor(0, n), self.tensor(1, n));
        let [c0, c1] = &mut self.conns;
        let (mut b0, mut b1) = ([0u8; 4], [0u8; 4]);
        let start = Instant::now();
        let (r0, r1) = tokio::join!(
            async {
                for _ in 0..k {
                    c0.comm_allreduce(device, &t0).await?;
                }
                c0.get_tensor_into(&t0, 0, &mut b0).await
            },
            async {
                for _ in 0..k {
                    c1.comm_allreduce(device, &t1).await?;
                }
                c1.get_tensor_into(&t1, 0, &mut b1).await
            }
        );
        let d = start.elapsed();
        r0?;
        r1?;
        Ok(d)
    }

    /// Rank 0 gets `x`, rank 1 `y`, one allreduce, both read back whole: `x + y` on both?
    /// (Leaves both buffers zeroed.)
    async fn check(&mut self, n: u64, device: u32) -> anyhow::Result<Result<(), String>> {
        let (x, y) = check_partials(n as usize);
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let (bx, by) = (bytes(&x), bytes(&y));
        let (t0, t1) = (self.tensor(0, n), self.tensor(1, n));
        let [c0, c1] = &mut self.conns;
        let (r0, r1) = tokio::join!(
            async {
                c0.set_tensor(&t0, 0, &bx, false).await?;
                c0.comm_allreduce(device, &t0).await?;
                c0.get_tensor(&t0, 0, 4 * n).await
            },
            async {
                c1.set_tensor(&t1, 0, &by, false).await?;
                c1.comm_allreduce(device, &t1).await?;
                c1.get_tensor(&t1, 0, 4 * n).await
            }
        );
        let floats = |b: Vec<u8>| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (r0, r1) = (floats(r0?), floats(r1?));
        self.clear().await?;
        Ok(check_sums(&x, &y, [&r0, &r1]))
    }

    /// The link transport the servers logged since the last call (ours logs it when it joins).
    fn logged_transport(&mut self) -> Option<String> {
        let logs = self.logs.as_ref()?;
        let mut seen = None;
        for (log, read) in logs.iter().zip(&mut self.log_read) {
            let text = read_log(log);
            let new = text.get(*read..).unwrap_or("");
            *read = text.len();
            seen = seen.or(transport_in_log(new));
        }
        seen
    }

    /// The relay's byte counts (rank 1 → rank 0, back), when there is one.
    fn counted(&self) -> Option<(u64, u64)> {
        let t = self.relay.as_ref()?.counters().snapshot();
        Some((t.c2s_bytes, t.s2c_bytes))
    }
}

/// Whether `ip` is an address of this machine (one a socket can be bound to).
fn is_local(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || TcpListener::bind((ip, 0)).is_ok()
}

/// A listener for the relay on 127.0.0.1 at R + 1000, R an RPC port near rank 1's (within our
/// server's default `--comm-peer-ports` window) that is neither rank's.
fn relay_listener(addrs: [SocketAddr; 2]) -> anyhow::Result<TcpListener> {
    let (p0, p1) = (addrs[0].port(), addrs[1].port());
    for k in 1..=RELAY_PORT_WINDOW {
        for r in [p1.checked_add(k), p1.checked_sub(k)].into_iter().flatten() {
            if r == p0 || r == 0 {
                continue;
            }
            let Some(port) = r.checked_add(COMM_PORT_OFFSET) else {
                continue;
            };
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                return Ok(l);
            }
        }
    }
    bail!("no free port within {RELAY_PORT_WINDOW} of {p1} (+ 1000) for the relay")
}

/// The floor of one link: a raw ping-pong of W bytes, rank-0-like side sends W and reads W, the
/// other reads W and sends W back (the stock link's order), each on its own OS thread with
/// blocking sockets (as the servers' link is), through a relay emulating the link when it is
/// one. Timed on the sending side's thread.
struct FloorLane {
    /// Tells the echo side how much to read before answering.
    echo: mpsc::Sender<usize>,
    ping: mpsc::Sender<usize>,
    done: mpsc::Receiver<std::io::Result<Duration>>,
    _relay: Option<Relay>,
}

impl FloorLane {
    fn start(link: &LinkProfile, max_w: usize) -> anyhow::Result<FloorLane> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let relay = if link.kind == LinkKind::Native {
            None
        } else {
            let opts = RelayOptions {
                protocol: false,
                zero_hello_caps: false,
                ..RelayOptions::default()
            };
            Some(Relay::start(addr, Wire::of(link), opts)?)
        };
        let dial = relay.as_ref().map_or(addr, Relay::addr);
        let mut echo_sock = TcpStream::connect(dial)?;
        let (mut ping_sock, _) = listener.accept()?;
        echo_sock.set_nodelay(true)?;
        ping_sock.set_nodelay(true)?;
        let (echo, echo_rx) = mpsc::channel::<usize>();
        let (ping, ping_rx) = mpsc::channel::<usize>();
        let (done_tx, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("floor-echo".into())
            .spawn(move || {
                let mut buf = vec![0u8; max_w];
                for w in echo_rx {
                    let r = echo_sock.read_exact(&mut buf[..w]);
                    if r.and_then(|_| echo_sock.write_all(&buf[..w])).is_err() {
                        return;
                    }
                }
            })?;
        std::thread::Builder::new()
            .name("floor-ping".into())
            .spawn(move || {
                let out: Vec<u8> = (0..max_w).map(|i| (i % 251) as u8).collect();
                let mut back = vec![0u8; max_w];
                for w in ping_rx {
                    let start = Instant::now();
                    let r = ping_sock.write_all(&out[..w]);
                    let r = r.and_then(|_| ping_sock.read_exact(&mut back[..w]));
                    let r = r.map(|_| start.elapsed());
                    let failed = r.is_err();
                    if done_tx.send(r).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(FloorLane {
            echo,
            ping,
            done,
            _relay: relay,
        })
    }

    /// One ping-pong of `w` bytes each way.
    fn once(&self, w: usize) -> anyhow::Result<Duration> {
        self.echo.send(w).context("floor: the echo side is gone")?;
        self.ping.send(w).context("floor: the ping side is gone")?;
        Ok(self.done.recv().context("floor: the ping side is gone")??)
    }
}

/// Runs the benchmark on `pairs` (addresses of running servers): per round, per link, every
/// pair's link set up, then per size the warm-up, the interleaved iterations (per pair: the
/// allreduce with its sync and the sync alone, in alternating order; the floor), back-to-back
/// batches and the correctness check; then the links are freed.
pub async fn run(cfg: &AllreduceConfig, pairs: &[PairSpec]) -> anyhow::Result<Results> {
    let links = cfg.runnable_links();
    if links.is_empty() {
        bail!("no link to measure: give none and/or emulated links (projected ones cannot run)");
    }
    if pairs.is_empty() {
        bail!("no pair of servers");
    }
    let sizes: Vec<u64> = cfg.sizes.iter().copied().filter(|&n| n > 0).collect();
    let max_n = sizes.iter().copied().max().context("no size")?;
    // Not the largest size's: 32767 elements cross as 131,068 bytes, 32768 as 65,536.
    let max_w = sizes.iter().map(|&n| wire_bytes(n)).max().unwrap_or(0) as usize;
    let rounds = cfg.rounds.clamp(1, cfg.iterations.max(1));
    let warmup = match cfg.warmup {
        0 => 0,
        w => w.div_ceil(rounds).max(w.min(3)),
    };
    let lanes_n = (pairs.len() + 1) as u64;
    let steps_per_size = (cfg.iterations + rounds * warmup) as u64 * lanes_n;
    let pb = cfg
        .common
        .out
        .progress_bar(links.len() as u64 * sizes.len() as u64 * steps_per_size);
    let mut lanes = Vec::new();
    for p in pairs {
        pb.set_message(format!("{}: connecting", p.label));
        lanes.push(PairLane::open(p, max_n, cfg.device).await?);
    }
    let mut acc: Vec<Vec<Vec<Acc>>> = (0..links.len())
        .map(|_| {
            (0..sizes.len())
                .map(|_| (0..pairs.len()).map(|_| Acc::default()).collect())
                .collect()
        })
        .collect();
    let mut floors: Vec<Vec<Vec<Duration>>> = vec![vec![Vec::new(); sizes.len()]; links.len()];
    for r in 0..rounds {
        let iters = cfg.iterations / rounds + usize::from(r < cfg.iterations % rounds);
        for (li, link) in links.iter().enumerate() {
            for lane in &mut lanes {
                pb.set_message(format!("{} over {}: COMM_INIT", lane.label, link.name));
                lane.init(link, cfg.device).await?;
            }
            let floor = FloorLane::start(link, max_w)?;
            for (si, &n) in sizes.iter().enumerate() {
                let label = format!("{} n={n} (round {}/{rounds})", link.name, r + 1);
                pb.set_message(label);
                let w = wire_bytes(n) as usize;
                for lane in &mut lanes {
                    lane.clear().await?;
                }
                for _ in 0..warmup {
                    for lane in &mut lanes {
                        lane.allreduces(n, 1, cfg.device).await?;
                        lane.sync().await?;
                        pb.inc(1);
                    }
                    floor.once(w)?;
                    pb.inc(1);
                }
                let before: Vec<_> = lanes.iter().map(PairLane::counted).collect();
                for i in 0..iters {
                    for (pi, lane) in lanes.iter_mut().enumerate() {
                        let a = &mut acc[li][si][pi];
                        if i % 2 == 0 {
                            a.with_sync.push(lane.allreduces(n, 1, cfg.device).await?);
                            a.sync.push(lane.sync().await?);
                        } else {
                            a.sync.push(lane.sync().await?);
                            a.with_sync.push(lane.allreduces(n, 1, cfg.device).await?);
                        }
                        pb.inc(1);
                    }
                    floors[li][si].push(floor.once(w)?);
                    pb.inc(1);
                }
                for (pi, lane) in lanes.iter_mut().enumerate() {
                    let a = &mut acc[li][si][pi];
                    if let (Some(b), Some(now)) = (before[pi], lane.counted()) {
                        let c = a.counted.get_or_insert((0, 0, 0));
                        *c = (c.0 + now.0 - b.0, c.1 + now.1 - b.1, c.2 + iters as u64);
                    }
                    for _ in 0..cfg.batches {
                        let k = cfg.batch.max(1);
                        a.batches.push(lane.allreduces(n, k, cfg.device).await?);
                    }
                    let check = lane.check(n, cfg.device).await?;
                    if a.check.as_ref().is_none_or(|c| c.is_ok()) {
                        a.check = Some(check);
                    }
                }
            }
            drop(floor);
            for (pi, lane) in lanes.iter_mut().enumerate() {
                if let Some(t) = lane.logged_transport() {
                    for a in &mut acc[li] {
                        a[pi].logged = Some(t.clone());
                    }
                }
                lane.free(cfg.device).await?;
            }
        }
    }
    pb.finish_and_clear();
    let mut rows = Vec::new();
    for (li, link) in links.iter().enumerate() {
        for (si, &n) in sizes.iter().enumerate() {
            let floor = Summary::of(&floors[li][si]);
            for (pi, pair) in pairs.iter().enumerate() {
                let a = &acc[li][si][pi];
                let (with_sync, sync) = (Summary::of(&a.with_sync), Summary::of(&a.sync));
                let counted = a
                    .counted
                    .map(|(up, down, k)| (up / k.max(1), down / k.max(1)));
                rows.push(Row {
                    link: link.name.clone(),
                    origin: match link.kind {
                        LinkKind::Native => Origin::Measured,
                        _ => Origin::MeasuredEmulated,
                    },
                    pair: pair.label.clone(),
                    link_transport: link_transport(cfg, pair, n, counted, a.logged.as_deref()),
                    n,
                    wire: wire_bytes(n),
                    counted,
                    allreduce: per_allreduce(&with_sync, &sync),
                    back_to_back: back_to_back(&a.batches, sync.p50, cfg.batch.max(1)),
                    with_sync,
                    sync,
                    floor: floor.clone(),
                    check: a.check.clone().unwrap_or(Ok(())),
                });
            }
        }
    }
    Ok(Results {
        rows,
        load: Default::default(),
    })
}

/// The link transport column: the caller's label, else what a server logged, else what the
/// relay's counts show, else TCP for started stock servers (loopback has no RDMA).
fn link_transport(
    cfg: &AllreduceConfig,
    pair: &PairSpec,
    n: u64,
    counted: Option<(u64, u64)>,
    logged: Option<&str>,
) -> String {
    if cfg.link_transport != "auto" {
        return cfg.link_transport.clone();
    }
    let relayed = counted.map(|(up, down)| up.min(down) >= wire_bytes(n));
    match (logged, relayed) {
        (Some(t), Some(true)) => format!("{t} (relayed)"),
        (Some(t), Some(false)) => format!("{t}: not through the relay"),
        (Some(t), None) => t.to_string(),
        (None, Some(true)) => "TCP (relayed)".into(),
        (None, Some(false)) => "not through the relay (RDMA?)".into(),
        (None, None) if pair.logs.is_some() => "TCP".into(),
        (None, None) => "as negotiated".into(),
    }
}
