//! Tests of the GRAPH_COMPUTE steps, each on its own: the structural steps and the rules on
//! plain data, scheduling on CPU buffers, and the whole pipeline on a session with the CPU device.

use rpc_proto::{ggml_type as ty, Graph as WireGraph, Major, Request, Response, RpcTensor, U64};

use super::schedule::schedule_checks;
use super::validate::IndexCheck;
use super::walk::{link, needs_data, running_nodes, walk, Ids, Reached};
use super::*;
use rpc_ggml::{type_info, BufferRef, Device};

// ---- wire graphs -------------------------------------------------------------------------

/// A contiguous wire tensor `id` of type `type_` and shape `ne`, computed by `op` from `srcs`
/// (ids), flagged COMPUTE, named `t<id>`.
fn wt(id: u64, type_: u32, ne: [u32; 4], op: u32, srcs: &[u64]) -> RpcTensor {
    let mut t = RpcTensor::new(id, type_);
    let info = type_info(type_).expect("a known type");
    let mut nb = [info.type_size, 0, 0, 0];
    nb[1] = nb[0] * ne[0] as u64 / info.blck_size;
    nb[2] = nb[1] * ne[1] as u64;
    nb[3] = nb[2] * ne[2] as u64;
    for i in 0..4 {
        t.ne[i].set(ne[i]);
        t.nb[i].set(nb[i] as u32);
    }
    t.op.set(op);
    for (slot, &s) in srcs.iter().enumerate() {
        t.src[slot].set(s);
    }
    t.flags.set(rpc_proto::TENSOR_FLAG_COMPUTE);
    t.set_name(&format!("t{id}"));
    t
}

/// An f32 vector of 4 computed by `op` from `srcs`.
fn v4(id: u64, op: u32, srcs: &[u64]) -> RpcTensor {
    wt(id, ty::F32, [4, 1, 1, 1], op, srcs)
}

fn node_ids(v: &[u64]) -> Vec<U64> {
    v.iter().map(|&i| U64::new(i)).collect()
}

fn graph<'a>(nodes: &'a [U64], tensors: &'a [RpcTensor]) -> WireGraph<'a> {
    WireGraph {
        device: 0,
        uid: None,
        node_ids: nodes,
        tensors,
    }
}

/// Ids and the walk of a wire graph that must pass both.
fn walked(g: &WireGraph<'_>) -> (Ids, Reached) {
    let ids = Ids::index(g.tensors).expect("ids");
    let reached = walk(g, &ids).expect("walk");
    (ids, reached)
}

/// The message of an `InvalidGraph` refusal.
fn invalid_graph<T>(r: Result<T, SessionError>) -> String {
    match r {
        Err(SessionError::InvalidGraph(m)) => m,
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
}

/// The local index of wire tensor `wi`.
fn local(r: &Reached, wi: u32) -> usize {
    r.order.iter().position(|&w| w == wi).expect("reached")
}

// ---- ids and the walk --------------------------------------------------------------------

#[test]
fn ids_refuse_id_0_and_keep_the_first_duplicate() {
    let ts = [v4(1, ops::NONE, &[]), v4(0, ops::NONE, &[])];
    assert_eq!(invalid_graph(Ids::index(&ts)), "tensor #1 has id 0");
    // Two tensors with id 1: the first is the one reached.
    let ts = [v4(1, ops::NONE, &[]), v4(1, ops::SQR, &[7])];
    let n = node_ids(&[1]);
    let (_, r) = walked(&graph(&n, &ts));
    assert_eq!(r.order, [0]);
}

#[test]
fn walk_puts_sources_before_users() {
    // d = (a + b) * a, listed users first; nodes c and d.
    let ts = [
        v4(4, ops::MUL, &[3, 1]),
        v4(3, ops::ADD, &[1, 2]),
        v4(2, ops::NONE, &[]),
        v4(1, ops::NONE, &[]),
        v4(9, ops::NONE, &[]), // not reached
    ];
    let n = node_ids(&[3, 4]);
    let (_, r) = walked(&graph(&n, &ts));
    assert_eq!(r.nodes, [1, 0]);
    assert_eq!(r.len(), 4);
    let pos = |wi| local(&r, wi);
    assert!(pos(3) < pos(1) && pos(2) < pos(1) && pos(1) < pos(0));
    assert!(!r.order.contains(&4));
}

#[test]
fn walk_refuses_bad_ids() {
    let ts = [v4(1, ops::SQR, &[2]), v4(2, ops::NONE, &[])];
    let n = node_ids(&[1, 0]);
    assert_eq!(
        invalid_graph(walk(&graph(&n, &ts), &Ids::index(&ts).unwrap())),
        "node #1 has id 0"
    );
    let n = node_ids(&[9]);
    assert_eq!(
        invalid_graph(walk(&graph(&n, &ts), &Ids::index(&ts).unwrap())),
        "node references unknown tensor id 0x9"
    );
    let ts = [v4(1, ops::SQR, &[5])];
    let n = node_ids(&[1]);
    assert_eq!(
        invalid_graph(walk(&graph(&n, &ts), &Ids::index(&ts).unwrap())),
        "source references unknown tensor id 0x5"
    );
}

#[test]
fn walk_refuses_cycles() {
    let refused = |ts: &[RpcTensor]| {
        let n = node_ids(&[ts[0].id.get()]);
        invalid_graph(walk(&graph(&n, ts), &Ids::index(ts).unwrap()))
    };
    // Through sources, through a view source, and onto itself.
    assert_eq!(
        refused(&[
            v4(1, ops::ADD, &[2, 3]),
            v4(2, ops::NONE, &[]),
            v4(3, ops::SQR, &[1])
        ]),
        "cycle through tensor id 0x1"
    );
    let mut v = v4(2, ops::VIEW, &[]);
    v.view_src.set(1);
    assert_eq!(
        refused(&[v4(1, ops::SQR, &[2]), v]),
        "cycle through tensor id 0x1"
    );
    assert_eq!(
        refused(&[v4(1, ops::SQR, &[1])]),
        "cycle through tensor id 0x1"
    );
    // ggml_cast: a CPY whose src[1] is itself is no cycle; its src[0] being itself is.
    let n = node_ids(&[1]);
    let ts = [v4(1, ops::CPY, &[2, 1]), v4(2, ops::NONE, &[])];
    assert!(walk(&graph(&n, &ts), &Ids::index(&ts).unwrap()).is_ok());
    assert_eq!(
        refused(&[v4(1, ops::CPY, &[1, 2]), v4(2, ops::NONE, &[])]),
        "cycle through tensor id 0x1"
    );
    assert_eq!(
        refused(&[v4(1, ops::ADD, &[2, 1]), v4(2, ops::NONE, &[])]),
        "cycle through tensor id 0x1"
    );
}

/// The walk keeps its own stack: a chain far deeper than a thread's stack could recurse.
#[test]
fn walk_of_a_long_chain() {
    const N: u64 = 200_000;
    // Tensor i reads tensor i - 1 (src id 0: none, for the first).
    let ts: Vec<RpcTensor> = (1..=N).map(|i| v4(i, ops::SQR, &[i - 1])).collect();
    let n = node_ids(&[N]);
    let (_, r) = walked(&graph(&n, &ts));
    assert_eq!(r.len(), N as usize);
    assert!(r.order.windows(2).all(|w| w[0] < w[1]));
}

// ---- needs, links, running nodes ----------------------------------------------------------

/// `in` (input) ← `view` (VIEW of in) ← `sq` (SQR, node); `hv` seen only as the view source of
/// the node `v2`, which computes nothing.
fn viewed() -> Vec<RpcTensor> {
    let input = v4(1, ops::NONE, &[]);
    let mut view = v4(2, ops::VIEW, &[1]);
    view.view_src.set(1);
    let sq = v4(3, ops::SQR, &[2]);
    let hv = v4(4, ops::NONE, &[]);
    let mut v2 = v4(5, ops::VIEW, &[]);
    v2.view_src.set(4);
    vec![input, view, sq, hv, v2]
}

#[test]
fn needs_data_follows_what_compute_reads() {
    let ts = viewed();
    let n = node_ids(&[3, 5]);
    let g = graph(&n, &ts);
    let (ids, r) = walked(&g);
    let needs = needs_data(&ts, &ids, &r).unwrap();
    let needed = |wi| needs.needed[local(&r, wi)];
    // The computing node and what it reads; a view reads nothing, a view node needs nothing.
    assert!(needed(2) && needed(1));
    assert!(!needed(0) && !needed(3) && !needed(4));
    assert_eq!(needs.reader[local(&r, 1)], Some(2));
    assert_eq!(needs.reader[local(&r, 2)], None);
    // Through a chain of computing tensors, transitively.
    let ts = [
        v4(3, ops::SQR, &[2]),
        v4(2, ops::ADD, &[1, 1]),
        v4(1, ops::NONE, &[]),
    ];
    let n = node_ids(&[3]);
    let (ids, r) = walked(&graph(&n, &ts));
    let needs = needs_data(&ts, &ids, &r).unwrap();
    assert!(needs.needed.iter().all(|&x| x));
    assert_eq!(needs.reader[local(&r, 2)], Some(1));
}

#[test]
fn links_name_local_indices() {
    let ts = viewed();
    let n = node_ids(&[3, 5]);
    let g = graph(&n, &ts);
    let (ids, r) = walked(&g);
    let links = link(&ts, &ids, &r).unwrap();
    assert_eq!(links.len(), r.len());
    let l = |wi| links[local(&r, wi)];
    let li = |wi| Some(local(&r, wi) as u32);
    assert_eq!(l(1).src[0], li(0));
    assert_eq!(l(1).view_src, li(0));
    assert_eq!(l(2).src[0], li(1));
    assert_eq!(l(2).src[1..], [None; 9]);
    assert_eq!(l(4).view_src, li(3));
    assert_eq!(l(0).view_src, None);
}

#[test]
fn running_nodes_leave_out_what_backends_skip() {
    let mut off = v4(2, ops::SQR, &[1]);
    off.flags.set(0);
    let empty = wt(3, ty::F32, [4, 0, 1, 1], ops::SQR, &[1]);
    let ts = [
        v4(1, ops::NONE, &[]),
        off,
        empty,
        v4(4, ops::SQR, &[1]),
        v4(5, ops::SQRT, &[4]),
    ];
    let n = node_ids(&[5, 2, 3, 4]);
    let (_, r) = walked(&graph(&n, &ts));
    let nodes = running_nodes(&ts, &r).unwrap();
    assert_eq!(nodes, [local(&r, 4) as u32, local(&r, 3) as u32]);
}

// ---- rules --------------------------------------------------------------------------------

/// A resolved graph of wire tensors without buffers, as the rules see it.
fn resolved(ts: &[RpcTensor], nodes: &[u64]) -> (Resolved<'static>, Vec<u32>) {
    let ts: &'static [RpcTensor] = Vec::leak(ts.to_vec());
    let n = node_ids(nodes);
    let g = graph(&n, ts);
    let (ids, r) = walked(&g);
    let links = link(ts, &ids, &r).unwrap();
    let nodes = running_nodes(ts, &r).unwrap();
    let specs = r.order.iter().map(|&wi| spec(&ts[wi as usize])).collect();
    let res = Resolved {
        wire: ts,
        order: r.order,
        specs,
        links,
    };
    (res, nodes)
}

/// The spec of a wire tensor without a buffer.
fn spec(t: &RpcTensor) -> TensorSpec {
    TensorSpec {
        type_: t.r#type.get(),
        ne: t.ne.map(|x| x.get()),
        nb: t.nb.map(|x| x.get() as u64),
        op: t.op.get(),
        op_params: t.op_params.map(|x| x.get()),
        flags: t.flags.get(),
        buffer: None,
        view_offs: 0,
        name: [0; 64],
    }
}

#[test]
fn rules_collect_index_checks_by_node_position() {
    let w = wt(1, ty::F32, [4, 10, 1, 1], ops::NONE, &[]);
    let rows = wt(2, ty::I32, [3, 1, 1, 1], ops::NONE, &[]);
    let sq = wt(3, ty::F32, [4, 10, 1, 1], ops::SQR, &[1]);
    let got = wt(4, ty::F32, [4, 3, 1, 1], ops::GET_ROWS, &[3, 2]);
    let (r, nodes) = resolved(&[w, rows, sq, got], &[3, 4]);
    let pending = rules::check_rules(&r, &nodes, true).unwrap();
    assert_eq!(pending.len(), 1);
    let (pos, c) = &pending[0];
    assert_eq!(*pos, 1);
    assert_eq!(c.tensor as usize, local_of_wire(&r, 1));
    assert_eq!((c.bound, c.what), (10, "GET_ROWS row"));
}

fn local_of_wire(r: &Resolved<'_>, wi: u32) -> usize {
    r.order.iter().position(|&w| w == wi).unwrap()
}

#[test]
fn rules_refuse_with_the_node_named() {
    let a = wt(1, ty::F32, [8, 4, 1, 1], ops::NONE, &[]);
    let b = wt(2, ty::F32, [9, 3, 1, 1], ops::NONE, &[]);
    let mm = wt(3, ty::F32, [4, 3, 1, 1], ops::MUL_MAT, &[1, 2]);
    let (r, nodes) = resolved(&[a, b, mm], &[3]);
    match rules::check_rules(&r, &nodes, true) {
        Err(SessionError::InvalidTensor { name, why }) => {
            assert_eq!(name, "t3");
            assert!(why.starts_with("MUL_MAT node: MUL_MAT: src[0]"), "{why}");
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
    // A node that computes nothing has no rule to break.
    let mut view = wt(3, ty::F32, [400, 3, 1, 1], ops::VIEW, &[]);
    view.view_src.set(1);
    let (r, nodes) = resolved(&[wt(1, ty::F32, [8, 4, 1, 1], ops::NONE, &[]), view], &[3]);
    assert_eq!(nodes.len(), 1);
    assert!(rules::check_rules(&r, &nodes, true).unwrap().is_empty());
    // Without buffers, views have no memory to leave.
    assert!(rules::check_views(&r).is_ok());
}

#[test]
fn views_refused_with_the_view_named() {
    let src = wt(1, ty::F32, [4, 1, 1, 1], ops::NONE, &[]);
    let mut view = wt(2, ty::F32, [4, 1, 1, 1], ops::VIEW, &[]);
    view.view_src.set(1);
    let sq = wt(3, ty::F32, [4, 1, 1, 1], ops::SQR, &[2]);
    let (mut r, _) = resolved(&[src, view, sq], &[3]);
    let buf = cpu_buffer(4096, &[]);
    let (s, v) = (local_of_wire(&r, 0), local_of_wire(&r, 1));
    r.specs[s].buffer = Some((buf.clone(), 64));
    for (off, inside) in [(64, true), (68, false), (48, false)] {
        r.specs[v].buffer = Some((buf.clone(), off));
        match rules::check_views(&r) {
            Ok(()) => assert!(inside, "{off}"),
            Err(SessionError::InvalidTensor { name, why }) => {
                assert!(!inside, "{off}: {why}");
                assert_eq!(name, "t2");
                assert!(why.contains("outside its view_src"), "{why}");
            }
            Err(e) => panic!("{off}: {e}"),
        }
    }
}

// ---- scheduling ---------------------------------------------------------------------------

/// A CPU buffer of `size` bytes holding `init` at its start, shared as tensors hold it.
fn cpu_buffer(size: u64, init: &[u8]) -> BufferRef {
    let dev = Device::all()
        .into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .expect("a CPU device");
    let mut b = dev.alloc_buffer(size).expect("a CPU buffer");
    b.write(0, init).expect("written");
    b.share()
}

/// An f32 `[4, 10]` table at 0, i32 row ids at 256 (`n` of them), then the results, each
/// `[4, n]` f32, from 512 on, 256 bytes apart.
struct Rows {
    buf: BufferRef,
    specs: Vec<TensorSpec>,
    links: Vec<GraphLinks>,
}

impl Rows {
    fn new(ids: &[i32]) -> Rows {
        let mut init = vec![0u8; 256 + 4 * ids.len()];
        for (i, v) in ids.iter().enumerate() {
            init[256 + 4 * i..260 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let buf = cpu_buffer(4096, &init);
        let n = ids.len() as u32;
        let mut r = Rows {
            buf,
            specs: Vec::new(),
            links: Vec::new(),
        };
        r.push(
            wt(1, ty::F32, [4, 10, 1, 1], ops::NONE, &[]),
            Some(0),
            [None, None],
        );
        r.push(
            wt(2, ty::I32, [n, 1, 1, 1], ops::NONE, &[]),
            Some(256),
            [None, None],
        );
        r
    }

    /// Adds a tensor at `off` (or in no buffer), with sources by local index; returns its index.
    fn push(&mut self, t: RpcTensor, off: Option<u64>, src: [Option<u32>; 2]) -> u32 {
        let mut s = spec(&t);
        s.buffer = off.map(|o| (self.buf.clone(), o));
        self.specs.push(s);
        let mut l = GraphLinks::default();
        l.src[..2].copy_from_slice(&src);
        self.links.push(l);
        self.specs.len() as u32 - 1
    }

    fn check(&self) -> IndexCheck {
        IndexCheck {
            tensor: 1,
            type_: ty::I32,
            bound: 10,
            what: "GET_ROWS row",
        }
    }
}

#[test]
fn checks_of_untouched_index_tensors_run_before_the_graph() {
    let mut g = Rows::new(&[0, 9, 3]);
    let n = g.push(
        wt(3, ty::F32, [4, 3, 1, 1], ops::GET_ROWS, &[]),
        Some(512),
        [Some(0), Some(1)],
    );
    let s = schedule_checks(&g.specs, &g.links, &[n], vec![(0, g.check())]).unwrap();
    assert!(s.cuts.is_empty());
    assert_eq!(s.checks.len(), 1);
    assert_eq!(s.checks[0].len(), 1);
    assert!(s.checks[0][0].run().is_ok());
    // Nothing to check: one segment without checks.
    let s = schedule_checks(&g.specs, &g.links, &[n], Vec::new()).unwrap();
    assert!(s.cuts.is_empty() && s.checks.len() == 1 && s.checks[0].is_empty());
}

#[test]
fn index_tensors_written_in_the_graph_cut_it_after_their_writer() {
    let mut g = Rows::new(&[1, 2]);
    // node 0: something else; node 1 writes the ids (an in-place op on them); nodes 2 and 3
    // read them.
    let other = g.push(
        wt(3, ty::F32, [4, 10, 1, 1], ops::SQR, &[]),
        Some(2048),
        [Some(0), None],
    );
    let writer = g.push(
        wt(4, ty::I32, [2, 1, 1, 1], ops::SCALE, &[]),
        Some(256),
        [Some(1), None],
    );
    let r1 = g.push(
        wt(5, ty::F32, [4, 2, 1, 1], ops::GET_ROWS, &[]),
        Some(512),
        [Some(0), Some(1)],
    );
    let r2 = g.push(
        wt(6, ty::F32, [4, 2, 1, 1], ops::GET_ROWS, &[]),
        Some(768),
        [Some(0), Some(1)],
    );
    let nodes = [other, writer, r1, r2];
    let s = schedule_checks(
        &g.specs,
        &g.links,
        &nodes,
        vec![(3, g.check()), (2, g.check())],
    )
    .unwrap();
    // One cut, right before the first reader, shared by both checks.
    assert_eq!(s.cuts, [2]);
    assert_eq!(s.checks.len(), 2);
    assert!(s.checks[0].is_empty());
    assert_eq!(s.checks[1].len(), 2);
    // A node that writes its own index tensor cannot be checked before it.
    let e = invalid_graph(schedule_checks(
        &g.specs,
        &g.links,
        &nodes,
        vec![(1, g.check())],
    ));
    assert_eq!(e, "GET_ROWS row: the node writes over its own index tensor");
}

#[test]
fn index_tensors_need_a_buffer() {
    let mut g = Rows::new(&[1]);
    g.specs[1].buffer = None;
    let n = g.push(
        wt(3, ty::F32, [4, 1, 1, 1], ops::GET_ROWS, &[]),
        Some(512),
        [Some(0), Some(1)],
    );
    let e = invalid_graph(schedule_checks(
        &g.specs,
        &g.links,
        &[n],
        vec![(0, g.check())],
    ));
    assert_eq!(e, "GET_ROWS row: index tensor not in a buffer");
}

#[test]
fn data_checks_bound_every_value() {
    for (ids, ok) in [
        (&[0, 9][..], true),
        (&[0, 10][..], false),
        (&[-1, 0][..], false),
    ] {
        let mut g = Rows::new(ids);
        let n = g.push(
            wt(3, ty::F32, [4, 2, 1, 1], ops::GET_ROWS, &[]),
            Some(512),
            [Some(0), Some(1)],
        );
        let s = schedule_checks(&g.specs, &g.links, &[n], vec![(0, g.check())]).unwrap();
        match s.checks[0][0].run() {
            Ok(()) => assert!(ok, "{ids:?} passed"),
            Err(SessionError::OutOfBounds { what, detail }) => {
                assert!(!ok, "{ids:?}: {detail}");
                assert_eq!(what, "GET_ROWS row");
                assert!(
                    detail.starts_with(&format!("index {} at [1, 0, 0, 0]", ids[1]))
                        || detail.starts_with(&format!("index {} at [0, 0, 0, 0]", ids[0])),
                    "{detail}"
                );
            }
            Err(e) => panic!("{ids:?}: {e}"),
        }
    }
}

// ---- the whole pipeline on a CPU session ---------------------------------------------------

/// A session on the CPU device with one 4 KiB buffer: `(session, handle, base)`.
fn cpu_session() -> (Session, u64, u64) {
    let mut s = crate::tests::session(Major::V7);
    let (handle, base) = crate::tests::alloc(&mut s, 4096);
    (s, handle, base)
}

fn placed(mut t: RpcTensor, buffer: u64, data: u64) -> RpcTensor {
    t.buffer.set(buffer);
    t.data.set(data);
    t
}

fn set(s: &mut Session, t: &RpcTensor, bytes: &[u8]) {
    s.handle(Request::SetTensor {
        tensor: *t,
        cache_flag: 0,
        offset: 0,
        data: bytes,
    })
    .expect("SET_TENSOR");
}

fn get(s: &mut Session, t: &RpcTensor, size: u64) -> Vec<u8> {
    match s.handle(Request::GetTensor {
        tensor: *t,
        offset: 0,
        size,
    }) {
        Ok(Some(Response::GetTensor(b))) => b,
        other => panic!("GET_TENSOR: {other:?}"),
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// GET_ROWS of rows 2 and 0 of a `[4, 3]` table, then SQR: computed; then the same with a row
/// id out of range: refused before anything runs.
#[test]
fn pipeline_computes_and_checks_indices() {
    let (mut s, h, base) = cpu_session();
    let table = placed(wt(1, ty::F32, [4, 3, 1, 1], ops::NONE, &[]), h, base);
    let rows = placed(wt(2, ty::I32, [2, 1, 1, 1], ops::NONE, &[]), h, base + 256);
    let got = placed(
        wt(3, ty::F32, [4, 2, 1, 1], ops::GET_ROWS, &[1, 2]),
        h,
        base + 512,
    );
    let sq = placed(wt(4, ty::F32, [4, 2, 1, 1], ops::SQR, &[3]), h, base + 768);
    let vals: Vec<f32> = (0..12).map(|i| i as f32).collect();
    set(&mut s, &table, &f32s(&vals));
    set(
        &mut s,
        &rows,
        &[2i32, 0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    let ts = [table, rows, got, sq];
    let n = node_ids(&[3, 4]);
    let stored = s.graph_compute(&graph(&n, &ts)).expect("computed");
    assert_eq!(stored.graph.segments(), 1);
    assert_eq!(stored.checks.iter().map(Vec::len).sum::<usize>(), 1);
    let want: Vec<f32> = [8., 9., 10., 11., 0., 1., 2., 3.]
        .iter()
        .map(|x| x * x)
        .collect();
    assert_eq!(get(&mut s, &sq, 32), f32s(&want));
    drop(stored);

    set(
        &mut s,
        &rows,
        &[2i32, 3]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    set(&mut s, &sq, &[0; 32]);
    match s.graph_compute(&graph(&n, &ts)) {
        Err(SessionError::OutOfBounds { what, .. }) => assert_eq!(what, "GET_ROWS row"),
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
    assert_eq!(get(&mut s, &sq, 32), [0; 32]);
}

/// A tensor that a computing node reads must be in a buffer; one seen only as a view source
/// need not be.
#[test]
fn pipeline_resolves_what_compute_reads() {
    let (mut s, h, base) = cpu_session();
    let a = wt(1, ty::F32, [4, 1, 1, 1], ops::NONE, &[]);
    let sq = placed(wt(2, ty::F32, [4, 1, 1, 1], ops::SQR, &[1]), h, base);
    let ts = [a, sq];
    let n = node_ids(&[2]);
    match s.graph_compute(&graph(&n, &ts)) {
        Err(SessionError::InvalidTensor { name, why }) => {
            assert_eq!(name, "t1");
            assert!(
                why.starts_with("read by 't2' (op SQR) but not in a buffer of this connection"),
                "{why}"
            );
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
    // A buffer handle this connection does not have.
    let ts = [placed(a, h ^ 1, base), sq];
    assert!(matches!(
        s.graph_compute(&graph(&n, &ts)),
        Err(SessionError::UnknownBuffer(_))
    ));
    // Read through a view of the input in this buffer: the input's own host copy (view source
    // only) needs no buffer here.
    let mut view = placed(wt(3, ty::F32, [4, 1, 1, 1], ops::VIEW, &[]), h, base + 64);
    view.view_src.set(1);
    let sq = placed(wt(2, ty::F32, [4, 1, 1, 1], ops::SQR, &[3]), h, base);
    let ts = [a, view, sq];
    assert!(s.graph_compute(&graph(&n, &ts)).is_ok());
}

/// An index tensor that the graph computes is checked after its producer ran: the graph is cut.
#[test]
fn pipeline_cuts_for_computed_index_tensors() {
    let (mut s, h, base) = cpu_session();
    let table = placed(wt(1, ty::F32, [4, 3, 1, 1], ops::NONE, &[]), h, base);
    let src = placed(wt(2, ty::F32, [2, 1, 1, 1], ops::NONE, &[]), h, base + 256);
    let rows = placed(
        wt(3, ty::I32, [2, 1, 1, 1], ops::CPY, &[2, 3]),
        h,
        base + 320,
    );
    let got = placed(
        wt(4, ty::F32, [4, 2, 1, 1], ops::GET_ROWS, &[1, 3]),
        h,
        base + 512,
    );
    set(&mut s, &table, &f32s(&[0.; 12]));
    let ts = [table, src, rows, got];
    let n = node_ids(&[3, 4]);
    set(&mut s, &src, &f32s(&[1., 2.]));
    let stored = s.graph_compute(&graph(&n, &ts)).expect("computed");
    assert_eq!(stored.graph.segments(), 2);
    assert!(stored.checks[0].is_empty() && stored.checks[1].len() == 1);
    drop(stored);
    // Row 3 of 3 rows, computed by the graph: refused between the segments.
    set(&mut s, &src, &f32s(&[1., 3.]));
    assert!(matches!(
        s.graph_compute(&graph(&n, &ts)),
        Err(SessionError::OutOfBounds {
            what: "GET_ROWS row",
            ..
        })
    ));
}
