//! The wire-cost model (`rdma::wire`, used by rpc-bench's per-token report) against the framings
//! themselves: the same messages go through real `RcLink` / `UcLink` / `LeanLink` pairs on the fake
//! fabric, and the SENDs, bytes and packets the fabric saw must be what the model says.

use rpc_transport::rdma::fake::{self, FakeQp, Rules};
use rpc_transport::rdma::lean::{Geometry, LeanLink};
use rpc_transport::rdma::rc::{RcLink, RC_RX_SIZE, RC_TX_SIZE};
use rpc_transport::rdma::uc::{UcLink, UC_RING_SIZE};
use rpc_transport::rdma::wire::{Framing, WireCost};
use rpc_transport::rdma::{Flavored, RdmaTransport};
use rpc_transport::Transport;

/// Access to the fake queue pair under a link.
trait OnFake: Flavored + 'static {
    fn qp(&mut self) -> &mut FakeQp;
}
impl OnFake for RcLink<FakeQp> {
    fn qp(&mut self) -> &mut FakeQp {
        self.verbs()
    }
}
impl OnFake for UcLink<FakeQp> {
    fn qp(&mut self) -> &mut FakeQp {
        self.verbs()
    }
}
impl OnFake for LeanLink<FakeQp> {
    fn qp(&mut self) -> &mut FakeQp {
        self.verbs()
    }
}

/// One flushed message: who sends it and its parts (upstream `send_data()` lengths).
#[derive(Clone)]
struct Msg {
    from_client: bool,
    parts: Vec<usize>,
}

fn req(payload: usize) -> Msg {
    Msg {
        from_client: true,
        parts: vec![1, 8, payload],
    }
}
fn rsp(payload: usize) -> Msg {
    Msg {
        from_client: false,
        parts: vec![8, payload],
    }
}
/// Several requests flushed as one burst (what our shim does with no-response commands).
fn burst(payloads: &[usize]) -> Msg {
    Msg {
        from_client: true,
        parts: payloads.iter().flat_map(|&p| [1, 8, p]).collect(),
    }
}

/// A token of a stock client (no-response SET_TENSORs, GRAPH_RECOMPUTE, a GET_TENSOR round trip)
/// plus the shapes that cross every chunk boundary: 256 KiB (RC), 128 KiB - 8 (Apple stride),
/// 4076 (lean UC frame), empty payloads.
fn script(lean: bool) -> Vec<Msg> {
    let sets = [
        296 + 12,
        296 + 4096,
        296 + 2048,
        296 + 8,
        296 + 4,
        296 + 64,
        296 + 512,
        296 + 4,
    ];
    let mut m = Vec::new();
    for _ in 0..3 {
        if lean {
            let mut all = sets.to_vec();
            all.push(5000); // GRAPH_RECOMPUTE
            all.push(296 + 16); // GET_TENSOR request
            m.push(burst(&all));
        } else {
            m.extend(sets.iter().map(|&p| req(p)));
            m.push(req(5000));
            m.push(req(296 + 16));
        }
        m.push(rsp(262_144 * 4)); // 1 MiB of logits
    }
    for p in [
        0,
        1,
        4076 - 9,
        4076 - 8,
        4077,
        131_064 - 9,
        131_064 - 8,
        131_065,
        262_124 - 9,
        262_124 - 8,
        262_144,
        262_145,
        700_000,
    ] {
        m.push(req(p));
        m.push(rsp(p / 3));
    }
    m
}

fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(31) + seed) as u8).collect()
}

/// Plays the script through a transport pair, checking every byte.
async fn play<A: OnFake, B: OnFake>(
    client: &mut RdmaTransport<A>,
    server: &mut RdmaTransport<B>,
    msgs: &[Msg],
) {
    for (i, m) in msgs.iter().enumerate() {
        let data: Vec<Vec<u8>> = m
            .parts
            .iter()
            .enumerate()
            .map(|(k, &n)| pattern(n, i * 7 + k))
            .collect();
        let slices: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        let want: Vec<u8> = data.concat();
        let mut got = vec![0u8; want.len()];
        if m.from_client {
            let (s, r) = tokio::join!(client.send_message(&slices), server.read_exact(&mut got));
            s.unwrap();
            r.unwrap();
        } else {
            let (s, r) = tokio::join!(server.send_message(&slices), client.read_exact(&mut got));
            s.unwrap();
            r.unwrap();
        }
        assert!(got == want, "message {i} arrived corrupted");
    }
}

struct Seen {
    client: (u64, u64),
    server: (u64, u64),
    packets: Vec<(usize, u64)>,
}

const MTUS: [usize; 3] = [256, 1024, 4096];

async fn run<A: OnFake, B: OnFake>(
    a: A,
    b: B,
    msgs: &[Msg],
) -> (Seen, RdmaTransport<A>, RdmaTransport<B>) {
    let mut client = RdmaTransport::new(a, None, "client");
    let mut server = RdmaTransport::new(b, None, "server");
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        play(&mut client, &mut server, msgs),
    )
    .await
    .expect("script timed out");
    let c = client.link().qp();
    let (csent, cpk): ((u64, u64), Vec<u64>) =
        (c.sent(), MTUS.iter().map(|&m| c.packets(m)).collect());
    let s = server.link().qp();
    let (ssent, spk): ((u64, u64), Vec<u64>) =
        (s.sent(), MTUS.iter().map(|&m| s.packets(m)).collect());
    let packets = MTUS
        .iter()
        .enumerate()
        .map(|(k, &m)| (m, cpk[k] + spk[k]))
        .collect();
    (
        Seen {
            client: csent,
            server: ssent,
            packets,
        },
        client,
        server,
    )
}

fn model(f: Framing, msgs: &[Msg], mtu: usize) -> (WireCost, WireCost) {
    let (mut c, mut s) = (WireCost::default(), WireCost::default());
    for m in msgs {
        let cost = f.message(&m.parts, mtu);
        if m.from_client {
            c = c.plus(cost);
        } else {
            s = s.plus(cost);
        }
    }
    (c, s)
}

/// Upstream flavors: exact, SEND by SEND.
fn check_exact(f: Framing, seen: &Seen, msgs: &[Msg]) {
    for &(mtu, pk) in &seen.packets {
        let (c, s) = model(f, msgs, mtu);
        assert_eq!(
            seen.client,
            (c.sends, c.bytes),
            "{}: client SENDs/bytes",
            f.name()
        );
        assert_eq!(
            seen.server,
            (s.sends, s.bytes),
            "{}: server SENDs/bytes",
            f.name()
        );
        assert_eq!(
            pk,
            c.packets + s.packets,
            "{}: packets at MTU {mtu}",
            f.name()
        );
    }
}

#[tokio::test]
async fn upstream_rc_matches_the_model() {
    let (a, b) = fake::pair(Rules::Rc, RC_TX_SIZE, RC_RX_SIZE, 256);
    let (mut a, mut b) = (RcLink::new(a), RcLink::new(b));
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    let msgs = script(false);
    let (seen, ..) = run(a, b, &msgs).await;
    check_exact(Framing::UpstreamRc, &seen, &msgs);
}

#[tokio::test]
async fn apple_uc_matches_the_model() {
    let (a, b) = fake::pair(Rules::Uc, UC_RING_SIZE, UC_RING_SIZE, 0);
    let (mut a, mut b) = (UcLink::new(a), UcLink::new(b));
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    let msgs = script(false);
    let (seen, ..) = run(a, b, &msgs).await;
    check_exact(Framing::AppleUc, &seen, &msgs);
}

/// Lean: data frames exactly; credit-only frames at most what the model allows for.
async fn check_lean(f: Framing, g: Geometry, rules: Rules) {
    let (a, b) = fake::pair(
        rules,
        g.tx_size(),
        g.rx_size(),
        if rules == Rules::Rc { 256 } else { 0 },
    );
    let (mut a, mut b) = (LeanLink::new(a, g), LeanLink::new(b, g));
    a.post_all_receives().unwrap();
    b.post_all_receives().unwrap();
    let msgs = script(true);
    let (seen, mut client, mut server) = run(a, b, &msgs).await;
    let (cs, ss) = (client.link().stats(), server.link().stats());
    for &(mtu, pk) in &seen.packets {
        let (c, s) = model(f, &msgs, mtu);
        // The model counts a message's credit-only frames with the message; the receiver sends them.
        assert_eq!(
            cs.data_frames,
            c.sends - c.credit_sends,
            "{}: client data frames",
            f.name()
        );
        assert_eq!(
            ss.data_frames,
            s.sends - s.credit_sends,
            "{}: server data frames",
            f.name()
        );
        assert!(
            cs.credit_frames <= s.credit_sends,
            "{}: client credit frames {} > {}",
            f.name(),
            cs.credit_frames,
            s.credit_sends
        );
        assert!(
            ss.credit_frames <= c.credit_sends,
            "{}: server credit frames {} > {}",
            f.name(),
            ss.credit_frames,
            c.credit_sends
        );
        let credits_seen = cs.credit_frames + ss.credit_frames;
        let credits_model = c.credit_sends + s.credit_sends;
        assert_eq!(
            seen.client.0 + seen.server.0 + (credits_model - credits_seen),
            c.sends + s.sends,
            "{}: SENDs",
            f.name()
        );
        assert_eq!(
            pk + (credits_model - credits_seen),
            c.packets + s.packets,
            "{}: packets at MTU {mtu}",
            f.name()
        );
        assert_eq!(
            seen.client.1 + seen.server.1 + 20 * (credits_model - credits_seen),
            c.bytes + s.bytes,
            "{}: bytes",
            f.name()
        );
    }
    // The big responses really did make the receiver return credits on its own (UC: 258 frames).
    if rules == Rules::Uc {
        assert!(
            cs.credit_frames > 0,
            "no credit-only frames at all: the bound is not exercised"
        );
    }
}

#[tokio::test]
async fn lean_rc_matches_the_model() {
    check_lean(Framing::LeanRc, Geometry::RC, Rules::Rc).await;
}

#[tokio::test]
async fn lean_uc_matches_the_model() {
    check_lean(Framing::LeanUc, Geometry::UC, Rules::Uc).await;
}
