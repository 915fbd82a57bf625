//! Byte-exact messages built by hand from the spec tables (§3-§7), not from the crate.

mod common;

use rpc_proto::*;

fn le32(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}
fn le64(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// An `rpc_tensor` laid out by hand from the offset table of spec §6.
#[allow(clippy::too_many_arguments)]
fn hand_tensor(
    id: u64,
    ty: u32,
    buffer: u64,
    ne: [u32; 4],
    nb: [u32; 4],
    op: u32,
    flags: i32,
    src: &[u64],
    data: u64,
    name: &str,
) -> Vec<u8> {
    let mut b = vec![0u8; 296];
    b[0..8].copy_from_slice(&le64(id));
    b[8..12].copy_from_slice(&le32(ty));
    b[12..20].copy_from_slice(&le64(buffer));
    for i in 0..4 {
        b[20 + 4 * i..24 + 4 * i].copy_from_slice(&le32(ne[i]));
        b[36 + 4 * i..40 + 4 * i].copy_from_slice(&le32(nb[i]));
    }
    b[52..56].copy_from_slice(&le32(op));
    b[120..124].copy_from_slice(&flags.to_le_bytes());
    for (i, s) in src.iter().enumerate() {
        b[124 + 8 * i..132 + 8 * i].copy_from_slice(&le64(*s));
    }
    b[220..228].copy_from_slice(&le64(data));
    b[228..228 + name.len()].copy_from_slice(name.as_bytes());
    b
}

fn encode_req(r: &Request<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    r.encode(&mut v);
    v
}

fn encode_rsp(r: &Response) -> Vec<u8> {
    let mut v = Vec::new();
    r.encode(&mut v);
    v
}

#[test]
fn hello_reply() {
    let mut expected = vec![0x1c, 0, 0, 0, 0, 0, 0, 0, 0x07, 0x00, 0x00, 0x00];
    expected.extend_from_slice(&[0; 24]);
    assert_eq!(expected.len(), 8 + 28);
    assert_eq!(encode_rsp(&Response::hello(Major::V7, [0; 24])), expected);
    assert_eq!(
        Response::decode(Command::Hello, &expected[8..]).unwrap(),
        Response::Hello {
            major: 7,
            minor: 0,
            patch: 0,
            caps: [0; 24]
        }
    );
}

#[test]
fn hello_request() {
    let mut expected = vec![0x0e, 0x18, 0, 0, 0, 0, 0, 0, 0];
    expected.extend_from_slice(&[0; 24]);
    assert_eq!(encode_req(&Request::Hello { caps: [0; 24] }), expected);
}

#[test]
fn alloc_buffer_request_and_reply() {
    let req = Request::AllocBuffer {
        device: 1,
        size: 4096,
    };
    assert_eq!(
        encode_req(&req),
        [0x00, 0x0c, 0, 0, 0, 0, 0, 0, 0, 0x01, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0]
    );
    let rsp = Response::AllocBuffer {
        remote_ptr: 0x1122334455667788,
        remote_size: 4096,
    };
    assert_eq!(
        encode_rsp(&rsp),
        [
            16, 0, 0, 0, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0x10, 0,
            0, 0, 0, 0, 0
        ]
    );
}

#[test]
fn device_count_and_small_replies() {
    assert_eq!(
        encode_req(&Request::DeviceCount),
        [0x0f, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        encode_rsp(&Response::DeviceCount { count: 1 }),
        [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    );
    assert_eq!(
        encode_rsp(&Response::GetMaxSize { max_size: u64::MAX }),
        [8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
    assert_eq!(
        encode_rsp(&Response::GetAlignment { alignment: 32 }),
        [8, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        encode_rsp(&Response::CopyTensor { result: 1 }),
        [1, 0, 0, 0, 0, 0, 0, 0, 1]
    );
    assert_eq!(
        encode_rsp(&Response::GetTensor(vec![0xde, 0xad, 0xbe, 0xef])),
        [4, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]
    );
}

#[test]
fn graph_recompute_is_13_bytes() {
    // Spec §8: "13 bytes on the wire".
    assert_eq!(
        encode_req(&Request::GraphRecompute {
            device: 2,
            uid: None
        }),
        [0x10, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]
    );
}

#[test]
fn buffer_clear_and_free() {
    assert_eq!(
        encode_req(&Request::BufferClear {
            remote_ptr: 0xAABB,
            value: 0x5a
        }),
        [0x05, 9, 0, 0, 0, 0, 0, 0, 0, 0xbb, 0xaa, 0, 0, 0, 0, 0, 0, 0x5a]
    );
    assert_eq!(
        encode_req(&Request::FreeBuffer { remote_ptr: 1 }),
        [0x04, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn tensor_layout_matches_spec_table() {
    let hand = hand_tensor(
        0xA1,
        0,
        0xB0,
        [4, 1, 1, 1],
        [4, 16, 16, 16],
        2,
        TENSOR_FLAG_COMPUTE,
        &[0xA2, 0xA3],
        0xD000,
        "c",
    );
    let built = TensorBuilder::new(0xA1, 0)
        .data(0xB0, 0xD000)
        .ne(&[4, 1, 1, 1])
        .nb([4, 16, 16, 16])
        .op(2, &[])
        .flags(TENSOR_FLAG_COMPUTE)
        .srcs(&[0xA2, 0xA3])
        .name("c")
        .build();
    assert_eq!(built.to_wire().as_slice(), hand.as_slice());
}

#[test]
fn set_tensor_frame() {
    let t = hand_tensor(
        7,
        0,
        0xB0,
        [3, 1, 1, 1],
        [4, 12, 12, 12],
        0,
        0,
        &[],
        0xD000,
        "x",
    );
    let mut expected = vec![0x06];
    expected.extend_from_slice(&le64(305 + 3));
    expected.extend_from_slice(&t);
    expected.push(1); // cache_flag
    expected.extend_from_slice(&le64(8)); // offset
    expected.extend_from_slice(&[9, 8, 7]);
    let tensor = RpcTensor::from_wire(&t).unwrap();
    let req = Request::SetTensor {
        tensor,
        cache_flag: 1,
        offset: 8,
        data: &[9, 8, 7],
    };
    assert_eq!(encode_req(&req), expected);
    let h = FrameHeader::decode(expected[..9].try_into().unwrap());
    assert_eq!(h, FrameHeader { cmd: 6, size: 308 });
    assert_eq!(
        Request::decode(
            Major::V7,
            Command::SetTensor,
            &expected[9..],
            &Limits::default()
        )
        .unwrap(),
        req
    );
}

#[test]
fn set_tensor_hash_and_get_tensor_frames() {
    let t = hand_tensor(
        7,
        1,
        0xB0,
        [3, 1, 1, 1],
        [2, 6, 6, 6],
        0,
        0,
        &[],
        0xD000,
        "w",
    );
    let tensor = RpcTensor::from_wire(&t).unwrap();
    let mut hash_frame = vec![0x07];
    hash_frame.extend_from_slice(&le64(312));
    hash_frame.extend_from_slice(&t);
    hash_frame.extend_from_slice(&le64(0));
    hash_frame.extend_from_slice(&le64(0xcbf29ce484222325));
    assert_eq!(
        encode_req(&Request::SetTensorHash {
            tensor,
            offset: 0,
            hash: fnv1a64(&[])
        }),
        hash_frame
    );

    let mut get_frame = vec![0x08];
    get_frame.extend_from_slice(&le64(312));
    get_frame.extend_from_slice(&t);
    get_frame.extend_from_slice(&le64(2));
    get_frame.extend_from_slice(&le64(4));
    assert_eq!(
        encode_req(&Request::GetTensor {
            tensor,
            offset: 2,
            size: 4
        }),
        get_frame
    );

    let mut memset = vec![0x11];
    memset.extend_from_slice(&le64(313));
    memset.extend_from_slice(&t);
    memset.extend_from_slice(&le64(2));
    memset.extend_from_slice(&le64(4));
    memset.push(0xee);
    assert_eq!(
        encode_req(&Request::MemsetTensor {
            tensor,
            offset: 2,
            size: 4,
            value: 0xee
        }),
        memset
    );
}

#[test]
fn graph_compute_c_equals_a_plus_b() {
    // Spec §18: 3 tensors, 1 node (ADD = op 2), flags = COMPUTE, DFS post-order.
    let a = hand_tensor(
        0xA,
        0,
        0xB0,
        [4, 1, 1, 1],
        [4, 16, 16, 16],
        0,
        0,
        &[],
        0xD000,
        "a",
    );
    let b = hand_tensor(
        0xB,
        0,
        0xB0,
        [4, 1, 1, 1],
        [4, 16, 16, 16],
        0,
        0,
        &[],
        0xD020,
        "b",
    );
    let c = hand_tensor(
        0xC,
        0,
        0xB0,
        [4, 1, 1, 1],
        [4, 16, 16, 16],
        2,
        TENSOR_FLAG_COMPUTE,
        &[0xA, 0xB],
        0xD040,
        "c",
    );
    let mut payload = Vec::new();
    payload.extend_from_slice(&le32(0)); // device
    payload.extend_from_slice(&le32(1)); // n_nodes
    payload.extend_from_slice(&le64(0xC)); // node ids
    payload.extend_from_slice(&le32(3)); // n_tensors
    payload.extend_from_slice(&a);
    payload.extend_from_slice(&b);
    payload.extend_from_slice(&c);
    assert_eq!(payload.len(), 4 + 4 + 8 + 4 + 3 * 296);

    let tensors: Vec<RpcTensor> = [&a, &b, &c]
        .iter()
        .map(|t| RpcTensor::from_wire(t).unwrap())
        .collect();
    let mut built = Vec::new();
    encode_graph(0, None, &[0xC], &tensors, &mut built);
    assert_eq!(built, payload);

    let g = Graph::decode(Major::V7, &payload, &Limits::default()).unwrap();
    assert_eq!(g.device, 0);
    assert_eq!(g.nodes().collect::<Vec<_>>(), [0xC]);
    assert_eq!(g.tensors, tensors.as_slice());
    assert_eq!(g.tensors[2].src_ids()[..2], [0xA, 0xB]);

    let mut frame = Vec::new();
    Request::GraphCompute(g).encode(&mut frame);
    assert_eq!(frame[0], 10);
    assert_eq!(frame[1..9], le64(payload.len() as u64));
    assert_eq!(frame[9..], payload[..]);
}

#[test]
fn get_alloc_size_request_is_3260_bytes() {
    let t = TensorBuilder::new(1, 12)
        .ne(&[256, 1, 1, 1])
        .nb([144, 144, 144, 144])
        .build();
    let mut srcs = Box::new([RpcTensor::default(); 10]);
    srcs[0] = RpcTensor::new(2, 0);
    let frame = encode_req(&Request::GetAllocSize {
        device: 5,
        tensor: t,
        srcs,
    });
    assert_eq!(frame.len(), 9 + 3260);
    assert_eq!(frame[..13], [13, 0xbc, 0x0c, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0]);
    assert_eq!(frame[13..13 + 296], t.to_wire());
    assert_eq!(frame[13 + 296], 2); // srcs[0].id
    assert!(frame[13 + 2 * 296..].iter().all(|&b| b == 0));
}

#[test]
fn version_check_like_the_client() {
    assert!(Major::V7.accepts(7, 0));
    assert!(!Major::V7.accepts(7, 1));
    assert!(!Major::V7.accepts(6, 0));
    assert!(!Major::V7.accepts(8, 0));
    assert!(Major::V8.accepts(8, 0));
    assert!(!Major::V8.accepts(8, 1));
    assert!(!Major::V8.accepts(7, 0));
}

/// 8.0 delta §A: the HELLO request is the same 33 bytes in both majors; the replies differ only in
/// the major byte.
#[test]
fn hello_bytes_of_both_majors() {
    let mut req = Vec::new();
    Request::Hello { caps: [0; 24] }.encode(&mut req);
    let mut expected = vec![14, 24, 0, 0, 0, 0, 0, 0, 0];
    expected.extend([0; 24]);
    assert_eq!(req, expected);
    for (major, byte) in [(Major::V7, 7u8), (Major::V8, 8)] {
        let mut rsp = Vec::new();
        Response::hello(major, [0; 24]).encode(&mut rsp);
        let mut want = vec![28, 0, 0, 0, 0, 0, 0, 0, byte, 0, 0, 0];
        want.extend([0; 24]);
        assert_eq!(rsp, want, "{major}");
    }
}

/// 8.0 delta §B/§D: frames of the new and changed commands, byte for byte.
#[test]
fn v8_frames() {
    let t = RpcTensor::new(0x55, 0);
    // GRAPH_RECOMPUTE {device 0, uid 24}: 9 + 12 = 21 bytes, as in the per-token trace.
    let mut f = Vec::new();
    Request::GraphRecompute {
        device: 0,
        uid: Some(24),
    }
    .encode(&mut f);
    assert_eq!(f.len(), 21);
    assert_eq!(f[..9], [16, 12, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(f[9..13], [0, 0, 0, 0]);
    assert_eq!(f[13..], 24u64.to_le_bytes());
    // COMM_ALLREDUCE: 9 + 4 + 296 = 309 bytes (the trace's "300 B each" is the payload).
    let mut f = Vec::new();
    Request::CommAllreduce {
        device: 0,
        tensor: t,
    }
    .encode(&mut f);
    assert_eq!((f[0], f.len()), (21, 309));
    // COMM_INIT as the stock client sends it to rank 1.
    let mut f = Vec::new();
    Request::CommInit(CommInit {
        device: 0,
        rank: 1,
        world: 2,
        port: 52111,
        host: CommInit::host_field("127.0.0.1").unwrap(),
    })
    .encode(&mut f);
    assert_eq!(f.len(), 9 + 80);
    assert_eq!(f[..9], [20, 80, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        f[9..25],
        [0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0x8f, 0xcb, 0, 0]
    );
    assert_eq!(&f[25..34], b"127.0.0.1");
    assert!(f[34..].iter().all(|&b| b == 0));
    let back = Request::decode(Major::V8, Command::CommInit, &f[9..], &Limits::default()).unwrap();
    let Request::CommInit(c) = back else {
        panic!("not COMM_INIT")
    };
    assert_eq!(c.host_str(), Some("127.0.0.1"));
    assert_eq!(CommInit::host_field(&"x".repeat(64)), None);
    // SET_TENSOR_2D of the probe in §B.3: 32-byte tensor, 2 chunks of 8, stride 16.
    let data: Vec<u8> = (1..=8).chain(11..=18).collect();
    let region = Region2d {
        offset: 0,
        size: 8,
        n_copies: 2,
        stride: 16,
    };
    let mut f = Vec::new();
    Request::SetTensor2d {
        tensor: t,
        region,
        data: &data,
    }
    .encode(&mut f);
    assert_eq!(f.len(), 9 + 328 + 16);
    assert_eq!(f[0], 18);
    assert_eq!(region.span(), Some(24));
    // Data must be exactly size × n_copies.
    let short = &f[9..f.len() - 1];
    assert!(Request::decode(Major::V8, Command::SetTensor2d, short, &Limits::default()).is_err());
    // The 8.0 commands are not commands on a 7.0 connection.
    for b in 18..=22u8 {
        let h = FrameHeader { cmd: b, size: 4 };
        assert_eq!(
            check_frame(Major::V7, &h, &Limits::default()),
            Err(DecodeError::UnknownCommand(b))
        );
    }
    // RPC_CMD_NONE moved to 23.
    let h = FrameHeader { cmd: 23, size: 0 };
    assert!(check_frame(Major::V8, &h, &Limits::default()).is_err());
}
