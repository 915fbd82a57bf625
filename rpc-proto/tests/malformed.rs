//! Invalid input gives typed errors, never a panic or an allocation.

mod common;

use rpc_proto::*;

fn frame(cmd: u8, size: u64) -> FrameHeader {
    FrameHeader { cmd, size }
}

/// A graph payload header: device, n_nodes, then raw bytes.
fn graph_head(device: u32, n_nodes: u32) -> Vec<u8> {
    let mut v = device.to_le_bytes().to_vec();
    v.extend_from_slice(&n_nodes.to_le_bytes());
    v
}

#[test]
fn unknown_commands() {
    let l = Limits::default();
    for b in [18u8, 19, 20, 100, 255] {
        assert_eq!(
            check_frame(Major::V7, &frame(b, 0), &l),
            Err(DecodeError::UnknownCommand(b))
        );
        assert_eq!(Major::V7.command(b), None);
    }
    for b in [23u8, 24, 100, 255] {
        assert_eq!(
            check_frame(Major::V8, &frame(b, 0), &l),
            Err(DecodeError::UnknownCommand(b))
        );
    }
    assert_eq!(
        DecodeError::UnknownCommand(18).to_string(),
        "unknown command 18"
    );
}

#[test]
fn fixed_size_commands_need_the_exact_size() {
    for major in Major::ALL {
        fixed_sizes(major);
    }
}

fn fixed_sizes(major: Major) {
    let l = Limits::default();
    for cmd in Command::EVERY
        .into_iter()
        .filter(|c| major.command(c.as_u8()).is_some())
    {
        let PayloadSize::Exact(n) = cmd.request_size(major) else {
            continue;
        };
        assert_eq!(check_frame(major, &frame(cmd as u8, n), &l), Ok(cmd));
        let mut wrong = vec![n + 1, n.wrapping_add(1 << 32), u64::MAX, 1 << 40];
        if n > 0 {
            wrong.extend([0, n - 1]);
        }
        for got in wrong {
            let expected = Err(DecodeError::BadSize {
                cmd,
                got,
                expected: n,
            });
            assert_eq!(check_frame(major, &frame(cmd as u8, got), &l), expected);
        }
        // Same through Request::decode with real (wrong-length) payloads.
        let too_long = vec![0u8; n as usize + 1];
        assert!(matches!(
            Request::decode(major, cmd, &too_long, &l),
            Err(DecodeError::BadSize { .. })
        ));
        if n > 0 {
            let too_short = vec![0u8; n as usize - 1];
            assert!(matches!(
                Request::decode(major, cmd, &too_short, &l),
                Err(DecodeError::BadSize { .. })
            ));
        }
    }
}

#[test]
fn hello_of_old_clients_is_refused() {
    // Spec §4.2: the 0-byte HELLO of pre-4.0 clients.
    let err = check_frame(Major::V7, &frame(14, 0), &Limits::default()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::BadSize {
            cmd: Command::Hello,
            got: 0,
            expected: 24
        }
    );
    assert_eq!(
        err.to_string(),
        "HELLO payload is 0 bytes, expected exactly 24"
    );
    assert!(check_frame(Major::V7, &frame(15, 1), &Limits::default()).is_err());
    // DEVICE_COUNT must be empty
}

#[test]
fn set_tensor_size_bounds() {
    let l = Limits {
        max_request_size: 1 << 20,
        ..Limits::default()
    };
    let st = Command::SetTensor as u8;
    assert_eq!(
        check_frame(Major::V7, &frame(st, 304), &l),
        Err(DecodeError::TooShort {
            what: "SET_TENSOR payload",
            need: 305,
            got: 304
        })
    );
    assert_eq!(
        check_frame(Major::V7, &frame(st, 0), &l)
            .unwrap_err()
            .to_string(),
        "SET_TENSOR payload too short: need 305 bytes, got 0"
    );
    assert_eq!(
        check_frame(Major::V7, &frame(st, 305), &l),
        Ok(Command::SetTensor)
    );
    assert_eq!(
        check_frame(Major::V7, &frame(st, 1 << 20), &l),
        Ok(Command::SetTensor)
    );
    for got in [(1 << 20) + 1, 1 << 63, u64::MAX] {
        assert_eq!(
            check_frame(Major::V7, &frame(st, got), &l),
            Err(DecodeError::TooLarge {
                what: "SET_TENSOR payload",
                got,
                limit: 1 << 20
            })
        );
    }
    // Default: 8 GiB.
    assert!(check_frame(Major::V7, &frame(st, 8 << 30), &Limits::default()).is_ok());
    assert!(check_frame(Major::V7, &frame(st, (8 << 30) + 1), &Limits::default()).is_err());
    assert!(matches!(
        SetTensorHeader::decode(&[0u8; 304]),
        Err(DecodeError::TooShort {
            need: 305,
            got: 304,
            ..
        })
    ));
    assert!(Request::decode(Major::V7, Command::SetTensor, &[0u8; 304], &l).is_err());
}

#[test]
fn graph_compute_size_bounds() {
    let gc = Command::GraphCompute as u8;
    let l = Limits::default();
    assert!(matches!(
        check_frame(Major::V7, &frame(gc, 11), &l),
        Err(DecodeError::TooShort {
            need: 12,
            got: 11,
            ..
        })
    ));
    assert_eq!(
        check_frame(Major::V7, &frame(gc, 12), &l),
        Ok(Command::GraphCompute)
    );
    // Capped by the largest graph the node/tensor limits allow, well under max_request_size.
    let cap = graph_payload_size(1 << 20, 1 << 20).unwrap();
    assert_eq!(l.max_payload(Major::V7, Command::GraphCompute), cap);
    assert_eq!(
        check_frame(Major::V7, &frame(gc, cap), &l),
        Ok(Command::GraphCompute)
    );
    assert_eq!(
        check_frame(Major::V7, &frame(gc, cap + 1), &l),
        Err(DecodeError::TooLarge {
            what: "GRAPH_COMPUTE payload",
            got: cap + 1,
            limit: cap
        })
    );
    assert!(check_frame(Major::V7, &frame(gc, u64::MAX), &l).is_err());
    let small = Limits {
        max_request_size: 100,
        ..l
    };
    assert_eq!(small.max_payload(Major::V7, Command::GraphCompute), 100);
    assert!(check_frame(Major::V7, &frame(gc, 101), &small).is_err());
}

#[test]
fn truncated_graphs() {
    let l = Limits::default();
    let fx = common::Fixture::new();
    let g = &fx.graph;
    // Every strict prefix is an error, and none panics.
    for len in 0..g.len() {
        let err = Graph::decode(Major::V7, &g[..len], &l).unwrap_err();
        assert!(
            matches!(err, DecodeError::TooShort { .. }),
            "prefix {len}: {err}"
        );
    }
    assert!(Graph::decode(Major::V7, g, &l).is_ok());
}

#[test]
fn graph_trailing_bytes_rejected() {
    let fx = common::Fixture::new();
    let mut g = fx.graph.clone();
    g.push(0);
    assert_eq!(
        Graph::decode(Major::V7, &g, &Limits::default()),
        Err(DecodeError::Malformed(
            "trailing bytes after GRAPH_COMPUTE tensors"
        ))
    );
    assert!(Request::decode(Major::V7, Command::GraphCompute, &g, &Limits::default()).is_err());
}

#[test]
fn graph_count_overflow() {
    // n_nodes = u32::MAX with a short payload: refused by the limit...
    let mut p = graph_head(0, u32::MAX);
    p.extend_from_slice(&[0u8; 16]);
    assert_eq!(
        Graph::decode(Major::V7, &p, &Limits::default()),
        Err(DecodeError::TooLarge {
            what: "GRAPH_COMPUTE n_nodes",
            got: u32::MAX as u64,
            limit: 1 << 20
        })
    );
    // ...and by the length check when the limit is wide open.
    let open = Limits {
        max_request_size: u64::MAX,
        max_graph_nodes: u32::MAX,
        max_graph_tensors: u32::MAX,
    };
    assert!(matches!(
        Graph::decode(Major::V7, &p, &open),
        Err(DecodeError::TooShort { .. })
    ));

    // n_tensors = u32::MAX after a valid node list.
    let mut p = graph_head(0, 1);
    p.extend_from_slice(&7u64.to_le_bytes());
    p.extend_from_slice(&u32::MAX.to_le_bytes());
    p.extend_from_slice(&[0u8; 296]);
    assert!(matches!(
        Graph::decode(Major::V7, &p, &Limits::default()),
        Err(DecodeError::TooLarge {
            what: "GRAPH_COMPUTE n_tensors",
            ..
        })
    ));
    assert!(matches!(
        Graph::decode(Major::V7, &p, &open),
        Err(DecodeError::TooShort { .. })
    ));

    // n_nodes whose 8x multiple wraps a u32 (0x2000_0000 * 8 = 2^32).
    let mut p = graph_head(0, 0x2000_0000);
    p.extend_from_slice(&0u32.to_le_bytes());
    assert!(matches!(
        Graph::decode(Major::V7, &p, &open),
        Err(DecodeError::TooShort { .. })
    ));
}

#[test]
fn graph_limits_are_inclusive() {
    let l = Limits {
        max_request_size: 1 << 20,
        max_graph_nodes: 2,
        max_graph_tensors: 1,
    };
    let t = RpcTensor::new(1, 0);
    let mut ok = Vec::new();
    encode_graph(0, None, &[1, 1], &[t], &mut ok);
    assert!(Graph::decode(Major::V7, &ok, &l).is_ok());
    let mut too_many_nodes = Vec::new();
    encode_graph(0, None, &[1, 1, 1], &[t], &mut too_many_nodes);
    assert!(matches!(
        Graph::decode(Major::V7, &too_many_nodes, &l),
        Err(DecodeError::TooLarge {
            got: 3,
            limit: 2,
            ..
        })
    ));
    let mut too_many_tensors = Vec::new();
    encode_graph(0, None, &[1], &[t, t], &mut too_many_tensors);
    assert!(matches!(
        Graph::decode(Major::V7, &too_many_tensors, &l),
        Err(DecodeError::TooLarge {
            got: 2,
            limit: 1,
            ..
        })
    ));
}

#[test]
fn bad_responses() {
    // Every response of a fixed size (GET_TENSOR's and GET_TENSOR_2D's are the requested one).
    for (cmd, n) in Command::EVERY
        .into_iter()
        .filter_map(|c| Some((c, Response::fixed_size(c)? as usize)))
    {
        for len in [0, n.saturating_sub(1), n + 1] {
            if len == n {
                continue;
            }
            let err = Response::decode(cmd, &vec![0u8; len]).unwrap_err();
            assert_eq!(
                err,
                DecodeError::BadSize {
                    cmd,
                    got: len as u64,
                    expected: n as u64
                }
            );
        }
    }
    assert_eq!(
        Response::check_size(Command::GetTensor, 5, 4),
        Err(DecodeError::BadSize {
            cmd: Command::GetTensor,
            got: 5,
            expected: 4
        })
    );
    assert!(Response::check_size(Command::GetTensor, 4, 4).is_ok());
    assert_eq!(
        Response::check_size(Command::SetTensor, 0, 0),
        Err(DecodeError::NoResponse(Command::SetTensor))
    );
    assert_eq!(
        DecodeError::NoResponse(Command::FreeBuffer).to_string(),
        "FREE_BUFFER has no response"
    );
}

#[test]
fn error_messages_are_readable() {
    let e = DecodeError::TooLarge {
        what: "GRAPH_COMPUTE n_nodes",
        got: 5,
        limit: 4,
    };
    assert_eq!(
        e.to_string(),
        "GRAPH_COMPUTE n_nodes is 5, over the limit of 4"
    );
    let e = DecodeError::Malformed("trailing bytes after GRAPH_COMPUTE tensors");
    assert_eq!(
        e.to_string(),
        "malformed message: trailing bytes after GRAPH_COMPUTE tensors"
    );
}

/// A streamed body's head is refused exactly when the whole request is: the server that decodes
/// only the head (`DataHead::decode`) applies the decoder's rules before the data arrives.
#[test]
fn a_data_head_is_refused_exactly_when_its_whole_request_is() {
    let l = Limits::default();
    let t = common::busy_tensor(7);
    let regions = [
        (8, 2, 16),
        (8, 1, 0),
        (0, 2, 16),
        (8, 0, 16),
        (u64::MAX, 2, 1),
        (1 << 33, 1 << 33, 0),
    ];
    for (size, n_copies, stride) in regions {
        let region = Region2d {
            offset: 4,
            size,
            n_copies,
            stride,
        };
        let mut head = Vec::new();
        Request::GetTensor2d { tensor: t, region }.encode_payload(&mut head);
        assert_eq!(head.len(), SET_TENSOR_2D_HEADER_SIZE);
        for data_len in [0u64, 15, 16, 17, 8] {
            let data = vec![0u8; data_len as usize];
            let whole = [&head[..], &data].concat();
            let decoded = Request::decode(Major::V8, Command::SetTensor2d, &whole, &l);
            let streamed = DataHead::decode(Command::SetTensor2d, &head, data_len);
            match (decoded, streamed) {
                (Ok(Request::SetTensor2d { tensor, region, .. }), Ok(h)) => {
                    assert_eq!(h, DataHead::SetTensor2d { tensor, region })
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "{region:?} + {data_len}"),
                (a, b) => panic!("{region:?} + {data_len}: whole {a:?}, head {b:?}"),
            }
        }
    }
    let hdr = SetTensorHeader {
        tensor: t,
        cache_flag: 1,
        offset: 9,
    };
    let mut head = Vec::new();
    hdr.encode(&mut head);
    assert_eq!(
        DataHead::decode(Command::SetTensor, &head, 1 << 40),
        Ok(DataHead::SetTensor(hdr))
    );
    assert!(DataHead::decode(Command::SetTensor, &head[..100], 0).is_err());
    assert!(DataHead::decode(Command::SetTensor2d, &head, 0).is_err());
    for c in Command::EVERY
        .into_iter()
        .filter(|c| c.data_head().is_none())
    {
        assert!(DataHead::decode(c, &[0; 400], 0).is_err(), "{c}");
    }
}
