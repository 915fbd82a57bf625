//! Tests of what this layer checks on its own, across its modules (so this module, test-only,
//! imports them all), without a session: tensor descriptions refused by
//! [`TensorSpec::new`] and [`TensorSpec::in_buffer`], graphs refused by [`Graph::build`] (their
//! structure, views and op rules, on the CPU device), index checks scheduled and run by
//! [`Backend::compute`], and the relations [`ScratchTensors`] checks. Each refusal here was a
//! safe call that reached ggml unchecked before the checks moved below these types.

use crate::buffer;
use crate::check::rules::{check_rules, check_views};
use crate::check::schedule::{schedule_checks, DataCheck};
use crate::check::{IndexCheck, IndexError, Rule};
use crate::tensor::{type_info, TensorDesc, TensorError};
use crate::{
    Access, Backend, Buffer, BufferRef, Device, DeviceKind, Graph, GraphError, GraphLinks,
    ScratchTensors, TensorSpec,
};
use rpc_proto::{ggml_op as op, ggml_type as ty};

fn cpu() -> Device {
    Device::all()
        .into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .expect("a CPU device")
}

/// A contiguous description of `type_` and shape `ne`, computed by `op` (flagged COMPUTE unless
/// `op` is NONE).
fn desc(type_: u32, ne: [u32; 4], op: u32) -> TensorDesc {
    let info = type_info(type_).expect("a known type");
    let mut nb = [info.type_size, 0, 0, 0];
    nb[1] = nb[0] * ne[0] as u64 / info.blck_size;
    nb[2] = nb[1] * ne[1] as u64;
    nb[3] = nb[2] * ne[2] as u64;
    TensorDesc {
        type_,
        ne,
        nb,
        op,
        op_params: [0; 16],
        flags: if op == op::NONE {
            0
        } else {
            rpc_proto::TENSOR_FLAG_COMPUTE
        },
        view_offs: 0,
        name: [0; 64],
    }
}

/// `d` checked and placed at `off` in `buf`.
fn at(d: TensorDesc, buf: &BufferRef, off: u64) -> TensorSpec {
    TensorSpec::new(d)
        .expect("a valid description")
        .in_buffer(buf.clone(), off)
        .expect("inside the buffer")
}

/// `d` checked, in no buffer.
fn unplaced(d: TensorDesc) -> TensorSpec {
    TensorSpec::new(d).expect("a valid description")
}

/// Links with the sources of each tensor (indices).
fn links(srcs: &[&[u32]]) -> Vec<GraphLinks> {
    srcs.iter()
        .map(|s| {
            let mut l = GraphLinks::default();
            for (slot, &i) in s.iter().enumerate() {
                l.src[slot] = Some(i);
            }
            l
        })
        .collect()
}

/// A CPU buffer of `size` bytes holding `init` at its start.
fn cpu_buffer(size: u64, init: &[u8]) -> Buffer {
    let mut b = cpu().alloc_buffer(size).expect("a CPU buffer");
    b.clear(0).expect("cleared");
    b.write(0, init).expect("written");
    b
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ---- tensors ------------------------------------------------------------------------------

/// What ggml_new_tensor_impl asserts, and what would make a tensor leave its buffer, is refused
/// by the constructor, with the texts the session logs.
#[test]
fn tensor_specs_exist_only_checked() {
    let ok = desc(ty::F32, [4, 2, 1, 1], op::NONE);
    assert!(TensorSpec::new(ok).is_ok());
    let refused = |d: TensorDesc| TensorSpec::new(d).err().expect("refused");
    // Unknown and removed types (4 and 5 were Q4_2 and Q4_3).
    for t in [4, 5, 255, u32::MAX] {
        let d = TensorDesc { type_: t, ..ok };
        assert_eq!(refused(d), TensorError::Type(t));
        assert_eq!(refused(d).to_string(), format!("invalid type {t}"));
    }
    // A quantized row of 31 elements: not whole blocks of 32.
    let q = TensorDesc {
        ne: [31, 1, 1, 1],
        ..desc(ty::Q4_0, [32, 1, 1, 1], op::NONE)
    };
    assert_eq!(
        refused(q).to_string(),
        "ne[0]=31 is not a multiple of the block size 32"
    );
    // An element count over int64 (ggml_new_tensor_impl's GGML_ASSERT).
    let big = TensorDesc {
        ne: [u32::MAX; 4],
        ..ok
    };
    assert!(matches!(refused(big), TensorError::Elements(_)));
    // Ops ggml does not have, and custom ops (code pointers).
    let bad_op = TensorDesc {
        op: op::COUNT,
        ..ok
    };
    assert_eq!(refused(bad_op), TensorError::Op(op::COUNT));
    for o in [
        op::CUSTOM,
        op::MAP_CUSTOM1,
        op::MAP_CUSTOM2,
        op::MAP_CUSTOM3,
    ] {
        assert_eq!(refused(TensorDesc { op: o, ..ok }), TensorError::CustomOp);
    }
    // An extent over u64.
    let huge = TensorDesc {
        ne: [2, 2, 2, 2],
        nb: [4, u64::MAX / 2, u64::MAX / 2, u64::MAX / 2],
        ..ok
    };
    assert_eq!(refused(huge), TensorError::Size);
    // The name is always NUL-terminated.
    let named = TensorSpec::new(TensorDesc {
        name: [b'a'; 64],
        ..ok
    })
    .unwrap();
    assert_eq!(named.name()[63], 0);
}

/// A tensor whose extent leaves its buffer cannot be placed in it: every tensor a graph or a
/// scratch command builds points only into its own buffer's memory.
#[test]
fn a_tensor_is_placed_only_inside_its_buffer() {
    let buf = cpu_buffer(64, &[]).share();
    let spec = unplaced(desc(ty::F32, [4, 2, 1, 1], op::NONE));
    assert_eq!(spec.size(), 32);
    assert!(spec.clone().in_buffer(buf.clone(), 32).is_ok());
    for off in [33, 64, u64::MAX - 8, u64::MAX] {
        match spec.clone().in_buffer(buf.clone(), off) {
            Err(TensorError::OutsideBuffer {
                offset,
                size,
                buffer,
            }) => assert_eq!((offset, size, buffer), (off, 32, 64)),
            other => panic!("{off}: {:?}", other.map(|s| s.buffer().map(|b| b.1))),
        }
    }
    let placed = spec.in_buffer(buf.clone(), 16).unwrap();
    assert_eq!(
        placed.buffer().map(|(b, o)| (b == &buf, o)),
        Some((true, 16))
    );
}

// ---- graphs: structure, views, rules ------------------------------------------------------

/// A MUL_MAT of shapes that cannot be multiplied is refused by `Graph::build` itself, naming
/// the node and its op; the same graph with matching shapes builds and computes.
#[test]
fn build_refuses_a_node_its_rule_refuses() {
    let dev = cpu();
    let buf = cpu_buffer(4096, &[]).share();
    let a = at(desc(ty::F32, [8, 4, 1, 1], op::NONE), &buf, 0);
    let b = at(desc(ty::F32, [9, 3, 1, 1], op::NONE), &buf, 256);
    let mm = at(desc(ty::F32, [4, 3, 1, 1], op::MUL_MAT), &buf, 512);
    let l = links(&[&[], &[], &[0, 1]]);
    match Graph::build(&[a.clone(), b, mm.clone()], &l, &[2], &dev) {
        Err(GraphError::Refused { tensor, refusal }) => {
            assert_eq!(tensor, 2);
            assert!(matches!(refusal.rule(), Rule::Check(_)));
            assert!(
                refusal
                    .to_string()
                    .starts_with("MUL_MAT node: MUL_MAT: src[0]"),
                "{refusal}"
            );
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
    let b = at(desc(ty::F32, [8, 3, 1, 1], op::NONE), &buf, 256);
    let mut g = Graph::build(&[a, b, mm], &l, &[2], &dev).expect("built");
    dev.init_backend(1)
        .expect("a backend")
        .compute(&mut g)
        .expect("computed");
}

/// Links and nodes must name tensors of the graph; a computing node and its sources must be in
/// buffers (else its kernel dereferences NULL).
#[test]
fn build_refuses_bad_indices_and_unbacked_tensors() {
    let dev = cpu();
    let buf = cpu_buffer(4096, &[]).share();
    let x = at(desc(ty::F32, [4, 1, 1, 1], op::NONE), &buf, 0);
    let sq = at(desc(ty::F32, [4, 1, 1, 1], op::SQR), &buf, 64);
    let specs = [x.clone(), sq.clone()];
    assert!(Graph::build(&specs, &links(&[&[], &[0]]), &[1], &dev).is_ok());
    assert!(matches!(
        Graph::build(&specs, &links(&[&[], &[7]]), &[1], &dev),
        Err(GraphError::BadIndex(7))
    ));
    assert!(matches!(
        Graph::build(&specs, &links(&[&[], &[0]]), &[2], &dev),
        Err(GraphError::BadIndex(2))
    ));
    assert!(matches!(
        Graph::build(&specs, &links(&[&[]]), &[1], &dev),
        Err(GraphError::Links {
            tensors: 2,
            links: 1
        })
    ));
    let unplaced_src = [unplaced(desc(ty::F32, [4, 1, 1, 1], op::NONE)), sq];
    assert!(matches!(
        Graph::build(&unplaced_src, &links(&[&[], &[0]]), &[1], &dev),
        Err(GraphError::Unbacked(0))
    ));
    let unplaced_node = [x, unplaced(desc(ty::F32, [4, 1, 1, 1], op::SQR))];
    assert!(matches!(
        Graph::build(&unplaced_node, &links(&[&[], &[0]]), &[1], &dev),
        Err(GraphError::Unbacked(1))
    ));
}

/// A view that leaves the memory of what it views is refused, naming the view.
#[test]
fn views_stay_inside_what_they_view() {
    let buf = cpu_buffer(4096, &[]).share();
    let src = at(desc(ty::F32, [4, 1, 1, 1], op::NONE), &buf, 64);
    for (off, inside) in [(64, true), (68, false), (48, false)] {
        let view = at(desc(ty::F32, [4, 1, 1, 1], op::VIEW), &buf, off);
        let mut l = links(&[&[], &[]]);
        l[1].view_src = Some(0);
        match check_views(&[src.clone(), view], &l) {
            Ok(()) => assert!(inside, "{off}"),
            Err((tensor, refusal)) => {
                assert!(!inside, "{off}: {refusal}");
                assert_eq!(tensor, 1);
                assert_eq!(refusal.rule(), Rule::ViewBounds);
                assert!(refusal.to_string().contains("outside its view_src"));
            }
        }
    }
    // Without buffers, views have no memory to leave.
    let mut l = links(&[&[], &[]]);
    l[1].view_src = Some(0);
    let a = unplaced(desc(ty::F32, [4, 1, 1, 1], op::NONE));
    let v = unplaced(desc(ty::F32, [400, 3, 1, 1], op::VIEW));
    assert!(check_views(&[a, v], &l).is_ok());
}

/// The rules return the index checks a node needs, with the node's position among the nodes.
#[test]
fn rules_collect_index_checks_by_node_position() {
    let w = unplaced(desc(ty::F32, [4, 10, 1, 1], op::NONE));
    let rows = unplaced(desc(ty::I32, [3, 1, 1, 1], op::NONE));
    let sq = unplaced(desc(ty::F32, [4, 10, 1, 1], op::SQR));
    let got = unplaced(desc(ty::F32, [4, 3, 1, 1], op::GET_ROWS));
    let l = links(&[&[], &[], &[0], &[2, 1]]);
    let pending = check_rules(&[w, rows, sq, got], &l, &[2, 3], true).unwrap();
    assert_eq!(pending.len(), 1);
    let (pos, c) = &pending[0];
    assert_eq!(*pos, 1);
    assert_eq!(c.tensor, 1);
    assert_eq!((c.bound, c.what), (10, "GET_ROWS row"));
}

// ---- index checks: scheduled by build, run by compute -------------------------------------

/// An f32 `[4, 10]` table at 0, i32 row ids at 256 (`n` of them), then the results, each
/// `[4, n]` f32, from 512 on.
struct Rows {
    buf: BufferRef,
    specs: Vec<TensorSpec>,
    links: Vec<GraphLinks>,
}

impl Rows {
    fn new(ids: &[i32]) -> Rows {
        let mut init = vec![0u8; 256];
        init.extend(i32s(ids));
        let buf = cpu_buffer(4096, &init).share();
        let n = ids.len() as u32;
        let mut r = Rows {
            buf,
            specs: Vec::new(),
            links: Vec::new(),
        };
        r.push(
            desc(ty::F32, [4, 10, 1, 1], op::NONE),
            Some(0),
            [None, None],
        );
        r.push(
            desc(ty::I32, [n, 1, 1, 1], op::NONE),
            Some(256),
            [None, None],
        );
        r
    }

    /// Adds a tensor at `off` (or in no buffer), with sources by index; returns its index.
    fn push(&mut self, d: TensorDesc, off: Option<u64>, src: [Option<u32>; 2]) -> u32 {
        let s = match off {
            Some(o) => at(d, &self.buf, o),
            None => unplaced(d),
        };
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

    /// Runs a scheduled check as `Backend::compute` does: under the buffer's flag.
    fn run(&self, c: &DataCheck) -> Result<(), IndexError> {
        let held = [self.buf.clone()];
        let locked = buffer::lock(&held).expect("the flag");
        c.run(&locked)
    }
}

#[test]
fn checks_of_untouched_index_tensors_run_before_the_graph() {
    let mut g = Rows::new(&[0, 9, 3]);
    let n = g.push(
        desc(ty::F32, [4, 3, 1, 1], op::GET_ROWS),
        Some(512),
        [Some(0), Some(1)],
    );
    let s = schedule_checks(&g.specs, &g.links, &[n], vec![(0, g.check())]).unwrap();
    assert!(s.cuts.is_empty());
    assert_eq!(s.checks.len(), 1);
    assert_eq!(s.checks[0].len(), 1);
    assert!(g.run(&s.checks[0][0]).is_ok());
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
        desc(ty::F32, [4, 10, 1, 1], op::SQR),
        Some(2048),
        [Some(0), None],
    );
    let writer = g.push(
        desc(ty::I32, [2, 1, 1, 1], op::SCALE),
        Some(256),
        [Some(1), None],
    );
    let r1 = g.push(
        desc(ty::F32, [4, 2, 1, 1], op::GET_ROWS),
        Some(512),
        [Some(0), Some(1)],
    );
    let r2 = g.push(
        desc(ty::F32, [4, 2, 1, 1], op::GET_ROWS),
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
    match schedule_checks(&g.specs, &g.links, &nodes, vec![(1, g.check())]) {
        Err(IndexError::Unschedulable(e)) => {
            assert_eq!(e, "GET_ROWS row: the node writes over its own index tensor")
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
}

#[test]
fn index_tensors_need_a_buffer() {
    let mut g = Rows::new(&[1]);
    g.specs[1] = unplaced(desc(ty::I32, [1, 1, 1, 1], op::NONE));
    let n = g.push(
        desc(ty::F32, [4, 1, 1, 1], op::GET_ROWS),
        Some(512),
        [Some(0), Some(1)],
    );
    match schedule_checks(&g.specs, &g.links, &[n], vec![(0, g.check())]) {
        Err(IndexError::Unschedulable(e)) => {
            assert_eq!(e, "GET_ROWS row: index tensor not in a buffer")
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("not refused"),
    }
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
            desc(ty::F32, [4, 2, 1, 1], op::GET_ROWS),
            Some(512),
            [Some(0), Some(1)],
        );
        let s = schedule_checks(&g.specs, &g.links, &[n], vec![(0, g.check())]).unwrap();
        match g.run(&s.checks[0][0]) {
            Ok(()) => assert!(ok, "{ids:?} passed"),
            Err(IndexError::OutOfRange { what, detail }) => {
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

/// A GET_ROWS whose row ids are out of range is refused by `Backend::compute` with the graph's
/// own checks, before the kernel runs: the graph built with valid ids computes; after the ids
/// are overwritten (as a client's SET_TENSOR would) the same graph is refused and nothing is
/// written.
#[test]
fn compute_refuses_out_of_range_row_ids() {
    let dev = cpu();
    let table: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut buf = cpu_buffer(4096, &f32s(&table));
    buf.write(256, &i32s(&[2, 0])).unwrap();
    let r = buf.share();
    let specs = [
        at(desc(ty::F32, [4, 3, 1, 1], op::NONE), &r, 0),
        at(desc(ty::I32, [2, 1, 1, 1], op::NONE), &r, 256),
        at(desc(ty::F32, [4, 2, 1, 1], op::GET_ROWS), &r, 512),
    ];
    let l = links(&[&[], &[], &[0, 1]]);
    let mut g = Graph::build(&specs, &l, &[2], &dev).expect("built");
    assert_eq!((g.segments(), g.index_checks()), (1, vec![1]));
    let mut backend: Backend = dev.init_backend(1).expect("a backend");
    backend.compute(&mut g).expect("computed");
    let mut out = [0u8; 32];
    buf.read(512, &mut out).unwrap();
    assert_eq!(out.to_vec(), f32s(&[8., 9., 10., 11., 0., 1., 2., 3.]));
    for bad in [3, -1, i32::MAX] {
        buf.write(256, &i32s(&[2, bad])).unwrap();
        buf.write(512, &[0; 32]).unwrap();
        match backend.compute(&mut g) {
            Err(GraphError::Index(IndexError::OutOfRange { what, .. })) => {
                assert_eq!(what, "GET_ROWS row")
            }
            Err(e) => panic!("{bad}: refused otherwise: {e}"),
            Ok(()) => panic!("{bad}: not refused"),
        }
        buf.read(512, &mut out).unwrap();
        assert_eq!(out, [0; 32], "{bad}: nothing was computed");
    }
}

/// An index tensor the graph computes is checked between the segments, after its writer ran.
#[test]
fn computed_index_tensors_are_checked_between_segments() {
    let dev = cpu();
    let mut buf = cpu_buffer(4096, &[]);
    let r = buf.share();
    let specs = [
        at(desc(ty::F32, [4, 3, 1, 1], op::NONE), &r, 0),
        at(desc(ty::F32, [2, 1, 1, 1], op::NONE), &r, 256),
        at(desc(ty::I32, [2, 1, 1, 1], op::CPY), &r, 320),
        at(desc(ty::F32, [4, 2, 1, 1], op::GET_ROWS), &r, 512),
    ];
    let l = links(&[&[], &[], &[1, 2], &[0, 2]]);
    let mut g = Graph::build(&specs, &l, &[2, 3], &dev).expect("built");
    assert_eq!((g.segments(), g.index_checks()), (2, vec![0, 1]));
    let mut backend = dev.init_backend(1).expect("a backend");
    buf.write(256, &f32s(&[1., 2.])).unwrap();
    backend.compute(&mut g).expect("computed");
    // Row 3 of 3 rows, computed by the graph: refused between the segments.
    buf.write(256, &f32s(&[1., 3.])).unwrap();
    assert!(matches!(
        backend.compute(&mut g),
        Err(GraphError::Index(IndexError::OutOfRange {
            what: "GET_ROWS row",
            ..
        }))
    ));
}

// ---- scratch tensors ----------------------------------------------------------------------

/// COPY_TENSOR's hook writes `nbytes(src)` at the destination: refused when that leaves the
/// destination's buffer, not done between overlapping ranges (`memcpy`), done otherwise.
#[test]
fn scratch_copies_only_inside_the_destination_buffer() {
    let data: Vec<u8> = (0..=255).collect();
    let mut buf = cpu_buffer(4096, &data);
    let r = buf.share();
    let src = at(desc(ty::F32, [64, 1, 1, 1], op::NONE), &r, 0);
    let fits = at(desc(ty::F32, [64, 1, 1, 1], op::NONE), &r, 1024);
    let short = at(desc(ty::F32, [4, 1, 1, 1], op::NONE), &r, 4096 - 16);
    let overlapping = at(desc(ty::F32, [64, 1, 1, 1], op::NONE), &r, 128);
    let no_buffer = unplaced(desc(ty::F32, [64, 1, 1, 1], op::NONE));
    let s = ScratchTensors::new(&[src, fits, short, overlapping, no_buffer]).unwrap();
    assert_eq!(s.copy(0, 2), Err(Access::OutOfBounds));
    assert_eq!(s.copy(0, 3), Ok(false));
    assert_eq!(s.copy(0, 0), Ok(false));
    assert_eq!(s.copy(0, 4), Ok(false));
    assert_eq!(s.copy(4, 1), Ok(false));
    assert_eq!(s.copy(0, 1), Ok(true));
    drop(s);
    let mut out = vec![0u8; 256];
    buf.read(1024, &mut out).unwrap();
    assert_eq!(out, data);
    let mut tail = [0u8; 16];
    buf.read(4096 - 16, &mut tail).unwrap();
    assert_eq!(tail, [0; 16], "nothing written past the short destination");
    let _ = buf.host_mut(0, 4096).expect("the flags are given back");
}

/// INIT_TENSOR and GET_ALLOC_SIZE: a tensor in no buffer is not initialised; a quantized tensor
/// whose `nb[0]` is not its block size (CUDA's get_alloc_size asserts) is refused.
#[test]
fn scratch_init_and_alloc_size_check_their_tensor() {
    let dev = cpu();
    let buf = cpu_buffer(4096, &[]).share();
    let q = desc(ty::Q4_0, [64, 2, 1, 1], op::NONE);
    let odd = TensorDesc {
        nb: [q.nb[0] + 1, q.nb[1] * 2, q.nb[2] * 2, q.nb[3] * 2],
        ..q
    };
    let mut s = ScratchTensors::new(&[
        at(q, &buf, 0),
        at(odd, &buf, 512),
        unplaced(desc(ty::F32, [4, 1, 1, 1], op::NONE)),
    ])
    .unwrap();
    assert!(s.init_tensor(0).is_ok());
    assert_eq!(s.alloc_size(0, &dev), Ok(2 * 2 * 18));
    assert!(s.init_tensor(1).is_err());
    assert!(s.alloc_size(1, &dev).is_err());
    assert_eq!(s.init_tensor(2), Err("tensor has no buffer"));
    assert_eq!(s.alloc_size(2, &dev), Ok(16));
    assert!(s.init_tensor(3).is_err());
    assert!(s.alloc_size(3, &dev).is_err());
}
