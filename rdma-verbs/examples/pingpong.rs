//! RC / UC ping-pong over real verbs, modelled on `ibv_rc_pingpong` /
//! `ibv_uc_pingpong` but using the two upstream llama.cpp flavors' exact
//! setup:
//!
//! * RC (Linux flavor, rdma-transports.md §3): separate send/recv CQs,
//!   `psn = qpn & 0xffffff`, caps `{u32 qpn, u32 psn, gid[16]}`,
//!   INIT → post receives → RTR (`max_dest_rd_atomic 1, min_rnr_timer 1`) →
//!   RTS (`timeout 14, retry_cnt 7, rnr_retry 7, max_rd_atomic 1`).
//! * UC (Apple flavor, §4): one CQ, psn 0, caps `{u32 qpn, u16 lid, u16 0, gid}`,
//!   INIT → RTR → RTS → post receives, MRs `LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE`.
//!
//! Both exchange the 24-byte caps over TCP (client first, like HELLO), then a
//! readiness byte 0x2A each way, then time `iters` round trips of `size`
//! bytes (stop-and-wait, inline when `size <= granted max_inline`), checking
//! every completion status, length and sequence number, and the full payload
//! every 64th iteration.
//!
//!     pingpong --both --ip 10.77.0.1 --qp rc --size 64 --iters 200
//!     pingpong --server --dev rxe0 --gid-idx 1 ...   /   pingpong --client 127.0.0.1 ...
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdma_verbs::*;

type Res<T> = std::result::Result<T, String>;

#[derive(Clone, Debug)]
enum Mode {
    Server,
    Client(String),
    Both,
}

#[derive(Clone, Debug)]
struct Opts {
    mode: Mode,
    dev: Option<String>,
    gid_idx: Option<u32>,
    ip: Option<IpAddr>,
    ib_port: u8,
    qp: QpType,
    size: usize,
    iters: u32,
    rx_depth: u32,
    tcp_port: u16,
    events: bool,
    inline: bool,
    timeout: Duration,
}

fn usage() -> ! {
    eprintln!(
        "usage: pingpong (--server | --client HOST | --both) [--ip A | --dev NAME --gid-idx N] [--ib-port 1]\n\
         \x20               [--qp rc|uc] [--size 4096] [--iters 1000] [--rx-depth 16] [--port 18515]\n\
         \x20               [--events] [--no-inline] [--timeout-secs 30]"
    );
    std::process::exit(2)
}

fn parse() -> Opts {
    let mut o = Opts {
        mode: Mode::Both,
        dev: None,
        gid_idx: None,
        ip: None,
        ib_port: 1,
        qp: QpType::Rc,
        size: 4096,
        iters: 1000,
        rx_depth: 16,
        tcp_port: 18515,
        events: false,
        inline: true,
        timeout: Duration::from_secs(30),
    };
    let mut a = std::env::args().skip(1);
    while let Some(k) = a.next() {
        let mut v = || a.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--server" => o.mode = Mode::Server,
            "--client" => o.mode = Mode::Client(v()),
            "--both" => o.mode = Mode::Both,
            "--dev" | "-d" => o.dev = Some(v()),
            "--gid-idx" | "-g" => o.gid_idx = Some(v().parse().unwrap_or_else(|_| usage())),
            "--ip" => o.ip = Some(v().parse().unwrap_or_else(|_| usage())),
            "--ib-port" => o.ib_port = v().parse().unwrap_or_else(|_| usage()),
            "--qp" => {
                o.qp = match v().as_str() {
                    "rc" | "RC" => QpType::Rc,
                    "uc" | "UC" => QpType::Uc,
                    _ => usage(),
                }
            }
            "--size" | "-s" => o.size = v().parse().unwrap_or_else(|_| usage()),
            "--iters" | "-n" => o.iters = v().parse().unwrap_or_else(|_| usage()),
            "--rx-depth" | "-r" => o.rx_depth = v().parse().unwrap_or_else(|_| usage()),
            "--port" | "-p" => o.tcp_port = v().parse().unwrap_or_else(|_| usage()),
            "--events" | "-e" => o.events = true,
            "--no-inline" => o.inline = false,
            "--timeout-secs" => {
                o.timeout = Duration::from_secs(v().parse().unwrap_or_else(|_| usage()))
            }
            _ => usage(),
        }
    }
    if o.size < 16
        || o.iters == 0
        || o.rx_depth == 0
        || (o.ip.is_none() && (o.dev.is_none() || o.gid_idx.is_none()))
    {
        usage()
    }
    o
}

/// Where our QP lives: device, port, GID entry, MTU, LID.
struct Local {
    dev: String,
    port: u8,
    gid_index: u32,
    gid: Gid,
    gid_type: GidType,
    mtu: Mtu,
    lid: u16,
}

fn resolve(o: &Opts) -> Res<Local> {
    if let Some(ip) = o.ip {
        let search = GidSearch {
            device: o.dev.clone(),
            ports: PortChoice::Fixed(o.ib_port),
            gid_index: o.gid_idx,
        };
        let m = find_gid_with(ip, &search)
            .map_err(|e| format!("probe: {e}"))?
            .ok_or(format!("no RDMA GID for {ip}"))?;
        return Ok(Local {
            dev: m.device,
            port: m.port,
            gid_index: m.gid_index,
            gid: m.gid,
            gid_type: m.gid_type,
            mtu: m.active_mtu,
            lid: m.lid,
        });
    }
    let dev = o.dev.clone().unwrap();
    let ctx = Context::open(&dev).map_err(|e| e.to_string())?;
    let pi = ctx.query_port(o.ib_port).map_err(|e| e.to_string())?;
    let e = ctx
        .gid_entry(o.ib_port, o.gid_idx.unwrap())
        .map_err(|e| e.to_string())?;
    Ok(Local {
        dev,
        port: o.ib_port,
        gid_index: e.index,
        gid: e.gid,
        gid_type: e.gid_type,
        mtu: pi.active_mtu.unwrap_or(Mtu::Mtu1024),
        lid: pi.lid,
    })
}

/// Verbs resources of one side.  `ep` owns the QP with its send (tx) and
/// receive (rx) regions and destroys the QP first (Apple rule); CQs, channel,
/// PD and context are also kept alive by the QP's and MRs' own references.
struct Side {
    ep: OwnedQp,
    /// Distinct CQs to poll (RC: recv + send; UC: one shared CQ).
    cqs: Vec<Cq>,
    armed: Vec<std::cell::Cell<bool>>,
    ch: Option<CompChannel>,
    _pd: Pd,
    _ctx: Context,
    local: Local,
    psn: u32,
    inline: bool,
    name: &'static str,
}

const SEND_WR: u64 = u64::MAX;

fn setup(o: &Opts, name: &'static str) -> Res<Side> {
    let local = resolve(o)?;
    let ctx = Context::open(&local.dev).map_err(|e| e.to_string())?;
    let pd = Pd::new(&ctx).map_err(|e| e.to_string())?;
    let ch = if o.events {
        Some(CompChannel::new(&ctx).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let (scq, rcq, init_access_tx, access_rx, max_send_wr) = match o.qp {
        QpType::Rc => (
            Cq::new(&ctx, 16, ch.as_ref()).map_err(|e| e.to_string())?,
            Cq::new(&ctx, o.rx_depth + 4, ch.as_ref()).map_err(|e| e.to_string())?,
            AccessFlags::LOCAL_WRITE,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            4,
        ),
        QpType::Uc => {
            let cq = Cq::new(&ctx, 2 * o.rx_depth + 1, ch.as_ref()).map_err(|e| e.to_string())?;
            let apple =
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
            (cq.clone(), cq, apple, apple, o.rx_depth)
        }
    };
    let mut init = QpInitAttr::new(o.qp, &scq, &rcq, max_send_wr, o.rx_depth);
    init.max_inline_data = 256;
    let qp = Qp::new(&pd, &init).map_err(|e| format!("create_qp: {e}"))?;
    let mut tx = Mr::new(
        &pd,
        AlignedBuf::new(o.size).map_err(|e| e.to_string())?,
        init_access_tx,
    )
    .map_err(|e| format!("reg_mr(tx): {e}"))?;
    let rx = Mr::new(
        &pd,
        AlignedBuf::new(o.size * o.rx_depth as usize).map_err(|e| e.to_string())?,
        access_rx,
    )
    .map_err(|e| format!("reg_mr(rx): {e}"))?;
    fill_body(tx.as_mut_slice());
    let ep = OwnedQp::new(qp, tx, rx).map_err(|e| e.to_string())?;
    let qp = ep.qp();
    qp.modify_to_init(&InitAttr::upstream(local.port))
        .map_err(|e| e.to_string())?;
    let psn = match o.qp {
        QpType::Rc => qp.qp_num() & 0xff_ffff,
        QpType::Uc => 0,
    };
    let inline = o.inline && o.size as u32 <= qp.max_inline();
    let mut cqs = vec![rcq];
    if scq != cqs[0] {
        cqs.push(scq);
    }
    let armed = cqs.iter().map(|_| std::cell::Cell::new(false)).collect();
    Ok(Side {
        ep,
        cqs,
        armed,
        ch,
        _pd: pd,
        _ctx: ctx,
        local,
        psn,
        inline,
        name,
    })
}

/// 24-byte caps like the upstream HELLO blob of each flavor.
fn caps(s: &Side, qp: QpType) -> [u8; 24] {
    let mut b = [0u8; 24];
    b[0..4].copy_from_slice(&s.ep.qp().qp_num().to_le_bytes());
    match qp {
        QpType::Rc => b[4..8].copy_from_slice(&s.psn.to_le_bytes()),
        QpType::Uc => b[4..6].copy_from_slice(&s.local.lid.to_le_bytes()),
    }
    b[8..24].copy_from_slice(s.local.gid.as_bytes());
    b
}

struct Peer {
    qpn: u32,
    psn: u32,
    lid: u16,
    gid: Gid,
}

fn parse_caps(b: &[u8; 24], qp: QpType) -> Peer {
    let qpn = u32::from_le_bytes(b[0..4].try_into().unwrap());
    let (psn, lid) = match qp {
        QpType::Rc => (u32::from_le_bytes(b[4..8].try_into().unwrap()), 0),
        QpType::Uc => (0, u16::from_le_bytes(b[4..6].try_into().unwrap())),
    };
    Peer {
        qpn,
        psn,
        lid,
        gid: Gid(b[8..24].try_into().unwrap()),
    }
}

fn post_all_recvs(s: &Side, o: &Opts) -> Res<()> {
    for i in 0..o.rx_depth as usize {
        s.ep.post_recv(i as u64, i * o.size, o.size)
            .map_err(|e| format!("post_recv {i}: {e}"))?;
    }
    Ok(())
}

fn activate(s: &Side, o: &Opts, p: &Peer) -> Res<()> {
    let sgid = u8::try_from(s.local.gid_index).map_err(|_| "gid index > 255".to_string())?;
    match o.qp {
        QpType::Rc => {
            post_all_recvs(s, o)?;
            let av = AddressVector::global(p.gid, sgid, s.local.port, 0);
            s.ep.qp()
                .modify_to_rtr(&RtrAttr::rc(s.local.mtu, p.qpn, p.psn, av))
                .map_err(|e| e.to_string())?;
            s.ep.qp()
                .modify_to_rts(&RtsAttr::rc(s.psn))
                .map_err(|e| e.to_string())?;
        }
        QpType::Uc => {
            let av = AddressVector::global(p.gid, sgid, s.local.port, p.lid);
            s.ep.qp()
                .modify_to_rtr(&RtrAttr::uc(s.local.mtu, p.qpn, 0, av))
                .map_err(|e| e.to_string())?;
            s.ep.qp()
                .modify_to_rts(&RtsAttr::uc(0))
                .map_err(|e| e.to_string())?;
            post_all_recvs(s, o)?;
        }
    }
    let st = s.ep.qp().state().map_err(|e| e.to_string())?;
    if st != QpState::Rts {
        return Err(format!("QP state after activation: {st:?}"));
    }
    Ok(())
}

fn pattern(j: usize) -> u8 {
    ((j as u32).wrapping_mul(2_654_435_761) >> 24) as u8
}

fn fill_body(b: &mut [u8]) {
    for (j, x) in b.iter_mut().enumerate() {
        *x = pattern(j);
    }
}

fn stamp(b: &mut [u8], v: u64) {
    let n = b.len();
    b[..8].copy_from_slice(&v.to_le_bytes());
    b[n - 8..].copy_from_slice(&v.to_le_bytes());
}

fn check_msg(b: &[u8], want: u64, full: bool) -> Res<()> {
    let n = b.len();
    let head = u64::from_le_bytes(b[..8].try_into().unwrap());
    let tail = u64::from_le_bytes(b[n - 8..].try_into().unwrap());
    if head != want || tail != want {
        return Err(format!(
            "sequence mismatch: want {want:#x}, head {head:#x}, tail {tail:#x}"
        ));
    }
    if full {
        if let Some(j) = (8..n - 8).find(|&j| b[j] != pattern(j)) {
            return Err(format!("payload corrupt at byte {j} of {n}"));
        }
    }
    Ok(())
}

/// Next completion from the side's CQs (busy-poll, or sleep on the channel
/// with `--events`), bounded by `deadline`.  A CQ stays armed until its event
/// fires, so each sleep costs one `req_notify` at most per CQ.
fn next_wc(s: &Side, deadline: Instant) -> Res<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    let mut spins = 0u32;
    loop {
        for cq in &s.cqs {
            if cq.poll(&mut wc).map_err(|e| e.to_string())? == 1 {
                return wc[0].ok();
            }
        }
        spins = spins.wrapping_add(1);
        if (s.ch.is_some() || spins % 256 == 0) && Instant::now() > deadline {
            return Err(format!("{}: timed out waiting for a completion", s.name));
        }
        if let Some(ch) = &s.ch {
            // Arm, re-poll (a completion may have arrived before arming), sleep.
            let mut armed_now = false;
            for (cq, armed) in s.cqs.iter().zip(&s.armed) {
                if !armed.get() {
                    cq.req_notify(false).map_err(|e| e.to_string())?;
                    armed.set(true);
                    armed_now = true;
                }
            }
            if armed_now {
                for cq in &s.cqs {
                    if cq.poll(&mut wc).map_err(|e| e.to_string())? == 1 {
                        return wc[0].ok();
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some(ev) = ch
                .wait(Some(left.min(Duration::from_millis(500))))
                .map_err(|e| e.to_string())?
            {
                for (cq, armed) in s.cqs.iter().zip(&s.armed) {
                    if ev.is_for(cq) {
                        armed.set(false);
                    }
                }
                ev.ack();
            }
        }
    }
}

fn tcp_sync(t: &mut TcpStream) -> Res<()> {
    t.write_all(&[0x2A])
        .map_err(|e| format!("sync write: {e}"))?;
    let mut b = [0u8; 1];
    t.read_exact(&mut b)
        .map_err(|e| format!("sync read: {e}"))?;
    if b[0] != 0x2A {
        return Err(format!("peer not ready (sync byte {:#x})", b[0]));
    }
    Ok(())
}

fn send_msg(s: &mut Side, o: &Opts, v: u64) -> Res<()> {
    stamp(s.ep.send_mem_mut(), v);
    let mut flags = SendFlags::SIGNALED;
    if s.inline {
        flags |= SendFlags::INLINE;
    }
    s.ep.post_send(SEND_WR, 0, o.size, flags)
        .map_err(|e| format!("post_send: {e}"))
}

struct Stats {
    secs: f64,
}

/// The timed loop.  Client: send ping i, wait for pong i.  Server: wait for
/// ping i, send pong i.  The single tx buffer is re-stamped only after the
/// previous SEND completed.  Completions may arrive in any order across the
/// send and recv CQs (RC: the peer may defer its ACK, so the next ping can
/// arrive before our pong's send completion), so receives are queued.
fn run_loop(s: &mut Side, o: &Opts, client: bool, deadline: Instant) -> Res<Stats> {
    const PONG: u64 = 1 << 63;
    let mut recvs = std::collections::VecDeque::new();
    let mut send_busy = false;
    let t0 = Instant::now();
    // Takes one completion and files it.
    let step = |s: &Side,
                recvs: &mut std::collections::VecDeque<WorkCompletion>,
                send_busy: &mut bool,
                what: &str|
     -> Res<()> {
        let wc = next_wc(s, deadline).map_err(|e| format!("{e} ({what})"))?;
        match wc.opcode() {
            WcOpcode::Send if *send_busy => *send_busy = false,
            WcOpcode::Recv => recvs.push_back(wc),
            op => return Err(format!("{}: unexpected completion {op:?} ({what})", s.name)),
        }
        Ok(())
    };
    for i in 0..o.iters as u64 {
        let full = i % 64 == 0 || i + 1 == o.iters as u64;
        if client {
            while send_busy {
                step(
                    s,
                    &mut recvs,
                    &mut send_busy,
                    &format!("iter {i}: previous send"),
                )?;
            }
            send_msg(s, o, i)?;
            send_busy = true;
        }
        while recvs.is_empty() {
            step(
                s,
                &mut recvs,
                &mut send_busy,
                &format!("iter {i}: waiting for a message"),
            )?;
        }
        let wc = recvs.pop_front().unwrap();
        if !recvs.is_empty() {
            return Err(format!("{}: iter {i}: more messages than sent", s.name));
        }
        let slot = wc.wr_id() as usize;
        if slot >= o.rx_depth as usize || wc.byte_len() as usize != o.size {
            return Err(format!("{}: bad receive completion {wc:?}", s.name));
        }
        let want = if client { i | PONG } else { i };
        check_msg(
            &s.ep.recv_mr().as_slice()[slot * o.size..(slot + 1) * o.size],
            want,
            full,
        )
        .map_err(|e| format!("{} iter {i}: {e}", s.name))?;
        s.ep.post_recv(slot as u64, slot * o.size, o.size)
            .map_err(|e| format!("re-post_recv: {e}"))?;
        if !client {
            while send_busy {
                step(
                    s,
                    &mut recvs,
                    &mut send_busy,
                    &format!("iter {i}: previous pong's send"),
                )?;
            }
            send_msg(s, o, i | PONG)?;
            send_busy = true;
        }
    }
    while send_busy {
        step(s, &mut recvs, &mut send_busy, "last send")?;
    }
    Ok(Stats {
        secs: t0.elapsed().as_secs_f64(),
    })
}

fn report(s: &Side, o: &Opts, st: &Stats) {
    let bytes = o.size as u64 * o.iters as u64 * 2;
    println!(
        "{}: {} bytes in {:.2} seconds = {:.2} Mbit/sec",
        s.name,
        bytes,
        st.secs,
        bytes as f64 * 8.0 / st.secs / 1e6
    );
    println!(
        "{}: {} iters in {:.2} seconds = {:.2} usec/iter",
        s.name,
        o.iters,
        st.secs,
        st.secs * 1e6 / o.iters as f64
    );
    println!(
        "RESULT side={} qp={:?} size={} iters={} inline={} events={} dev={} gid={} {} mtu={} usec_per_iter={:.2}",
        s.name,
        o.qp,
        o.size,
        o.iters,
        s.inline as u8,
        o.events as u8,
        s.local.dev,
        s.local.gid_index,
        s.local.gid_type,
        s.local.mtu.bytes(),
        st.secs * 1e6 / o.iters as f64
    );
}

fn server(o: &Opts, listener: TcpListener) -> Res<()> {
    let deadline = Instant::now() + o.timeout;
    let mut s = setup(o, "server")?;
    // Bounded accept: never wait for a client that failed before connecting.
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    let mut t = loop {
        match listener.accept() {
            Ok((t, _)) => break t,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    t.set_nonblocking(false)
        .map_err(|e| format!("accept: {e}"))?;
    t.set_nodelay(true).ok();
    t.set_read_timeout(Some(o.timeout)).ok();
    let mut b = [0u8; 24];
    t.read_exact(&mut b)
        .map_err(|e| format!("read caps: {e}"))?;
    let peer = parse_caps(&b, o.qp);
    t.write_all(&caps(&s, o.qp))
        .map_err(|e| format!("write caps: {e}"))?;
    activate(&s, o, &peer)?;
    println!(
        "server: dev={} port={} gid={} {} qpn={} -> {} mtu={} inline={} (granted {})",
        s.local.dev,
        s.local.port,
        s.local.gid_index,
        s.local.gid,
        s.ep.qp().qp_num(),
        peer.qpn,
        s.local.mtu.bytes(),
        s.inline,
        s.ep.qp().max_inline()
    );
    tcp_sync(&mut t)?;
    let st = run_loop(&mut s, o, false, deadline)?;
    report(&s, o, &st);
    Ok(())
}

fn client(o: &Opts, host: &str) -> Res<()> {
    let deadline = Instant::now() + o.timeout;
    let mut s = setup(o, "client")?;
    let mut t = loop {
        match TcpStream::connect((host, o.tcp_port)) {
            Ok(t) => break t,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("connect {host}:{}: {e}", o.tcp_port)),
        }
    };
    t.set_nodelay(true).ok();
    t.set_read_timeout(Some(o.timeout)).ok();
    t.write_all(&caps(&s, o.qp))
        .map_err(|e| format!("write caps: {e}"))?;
    let mut b = [0u8; 24];
    t.read_exact(&mut b)
        .map_err(|e| format!("read caps: {e}"))?;
    let peer = parse_caps(&b, o.qp);
    activate(&s, o, &peer)?;
    println!(
        "client: dev={} port={} gid={} {} qpn={} -> {} mtu={} inline={} (granted {})",
        s.local.dev,
        s.local.port,
        s.local.gid_index,
        s.local.gid,
        s.ep.qp().qp_num(),
        peer.qpn,
        s.local.mtu.bytes(),
        s.inline,
        s.ep.qp().max_inline()
    );
    tcp_sync(&mut t)?;
    let st = run_loop(&mut s, o, true, deadline)?;
    report(&s, o, &st);
    Ok(())
}

fn main() -> ExitCode {
    let o = parse();
    if let Err(e) = rdma_verbs::load() {
        eprintln!("pingpong: {e}");
        return ExitCode::from(3);
    }
    let r = match o.mode.clone() {
        Mode::Server => TcpListener::bind(("0.0.0.0", o.tcp_port))
            .map_err(|e| format!("bind: {e}"))
            .and_then(|l| server(&o, l)),
        Mode::Client(h) => client(&o, &h),
        Mode::Both => match TcpListener::bind(("127.0.0.1", o.tcp_port)) {
            Err(e) => Err(format!("bind: {e}")),
            Ok(l) => {
                let so = o.clone();
                let srv = std::thread::spawn(move || server(&so, l));
                let c = client(&o, "127.0.0.1");
                if let Err(e) = c {
                    // Do not wait for the server thread: it may be blocked on us.
                    return finish(Err(format!("client: {e}")));
                }
                let sr = srv
                    .join()
                    .unwrap_or_else(|_| Err("server thread panicked".into()));
                match (c, sr) {
                    (Ok(()), Ok(())) => Ok(()),
                    (c, sr) => Err(format!("client: {:?}; server: {:?}", c.err(), sr.err())),
                }
            }
        },
    };
    finish(r)
}

fn finish(r: Res<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
