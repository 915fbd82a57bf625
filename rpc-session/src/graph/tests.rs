//! Tests of the GRAPH_COMPUTE steps, each on its own: the structural steps on plain data, and the
//! whole pipeline on a session with the CPU device (rpc-ggml's refusals named by their wire
//! tensor). The rules and the scheduling of index checks are tested in rpc-ggml.

use rpc_proto::{ggml_type as ty, Graph as WireGraph, Major, Request, Response, RpcTensor, U64};

use super::walk::{link, needs_data, running_nodes, walk, Ids, Reached};
use super::*;
use rpc_ggml::type_info;

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
    assert_eq!(stored.segments(), 1);
    assert_eq!(stored.index_checks(), [1]);
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
    assert_eq!(stored.segments(), 2);
    assert_eq!(stored.index_checks(), [0, 1]);
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

/// A node rpc-ggml's rules refuse is reported with its wire name and its op.
#[test]
fn pipeline_names_the_node_a_rule_refuses() {
    let (mut s, h, base) = cpu_session();
    let a = placed(wt(1, ty::F32, [8, 4, 1, 1], ops::NONE, &[]), h, base);
    let b = placed(wt(2, ty::F32, [9, 3, 1, 1], ops::NONE, &[]), h, base + 256);
    let mm = placed(
        wt(3, ty::F32, [4, 3, 1, 1], ops::MUL_MAT, &[1, 2]),
        h,
        base + 512,
    );
    let ts = [a, b, mm];
    let n = node_ids(&[3]);
    match s.graph_compute(&graph(&n, &ts)) {
        Err(SessionError::InvalidTensor { name, why }) => {
            assert_eq!(name, "t3");
            assert!(why.starts_with("MUL_MAT node: MUL_MAT: src[0]"), "{why}");
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
}

/// A view outside what it views is reported with the view's wire name.
#[test]
fn pipeline_names_a_view_outside_its_source() {
    let (mut s, h, base) = cpu_session();
    let src = placed(wt(1, ty::F32, [4, 1, 1, 1], ops::NONE, &[]), h, base + 64);
    for (off, inside) in [(64, true), (68, false), (48, false)] {
        let mut view = placed(wt(2, ty::F32, [4, 1, 1, 1], ops::VIEW, &[]), h, base + off);
        view.view_src.set(1);
        let sq = placed(wt(3, ty::F32, [4, 1, 1, 1], ops::SQR, &[2]), h, base + 512);
        let ts = [src, view, sq];
        let n = node_ids(&[3]);
        match s.graph_compute(&graph(&n, &ts)) {
            Ok(_) => assert!(inside, "{off}"),
            Err(SessionError::InvalidTensor { name, why }) => {
                assert!(!inside, "{off}: {why}");
                assert_eq!(name, "t2");
                assert!(why.contains("outside its view_src"), "{why}");
            }
            Err(e) => panic!("{off}: {e}"),
        }
    }
}
