//! encode → check_frame → decode gives back the original, for every command.

mod common;

use std::collections::HashSet;

use common::{responses, Fixture};
use rpc_proto::*;

#[test]
fn every_request_round_trips() {
    for major in Major::ALL {
        request_round_trips(major);
    }
}

fn request_round_trips(major: Major) {
    let fx = Fixture::new();
    let limits = Limits::default();
    let reqs = fx.requests(major);
    let covered: HashSet<Command> = reqs.iter().map(Request::command).collect();
    assert_eq!(
        covered,
        Command::EVERY
            .into_iter()
            .filter(|c| major.command(c.as_u8()).is_some())
            .collect(),
        "a command of {major} has no sample"
    );

    for req in &reqs {
        let mut wire = Vec::new();
        req.encode(&mut wire);
        let (head, payload) = wire.split_first_chunk::<FRAME_HEADER_SIZE>().unwrap();
        let header = FrameHeader::decode(head);
        assert_eq!(header.size, payload.len() as u64, "{}", req.command());
        assert_eq!(header.encode(), *head);
        let cmd = check_frame(major, &header, &limits).unwrap();
        assert_eq!(cmd, req.command());
        let back = Request::decode(major, cmd, payload, &limits).unwrap();
        assert_eq!(&back, req);

        let mut again = Vec::new();
        back.encode(&mut again);
        assert_eq!(again, wire, "{} re-encodes differently", req.command());

        let mut only_payload = Vec::new();
        req.encode_payload(&mut only_payload);
        assert_eq!(only_payload, payload);
    }
}

#[test]
fn every_response_round_trips() {
    let rsps = responses();
    let covered: HashSet<Command> = rsps.iter().map(Response::command).collect();
    let expected: HashSet<Command> = Command::EVERY
        .into_iter()
        .filter(|c| c.has_response())
        .collect();
    assert_eq!(covered, expected, "a response has no sample");

    for rsp in &rsps {
        let cmd = rsp.command();
        let mut wire = Vec::new();
        rsp.encode(&mut wire);
        let (prefix, payload) = wire.split_first_chunk::<RESPONSE_HEADER_SIZE>().unwrap();
        let size = u64::from_le_bytes(*prefix);
        assert_eq!(size, payload.len() as u64);
        assert_eq!(size, rsp.payload_len());
        // A reply of no fixed size (GET_TENSOR, GET_TENSOR_2D) has the requested one.
        let requested = match Response::fixed_size(cmd) {
            Some(_) => 0,
            None => rsp.payload_len(),
        };
        Response::check_size(cmd, size, requested).unwrap();
        if let Some(n) = Response::fixed_size(cmd) {
            assert_eq!(n, size, "{cmd}");
        }
        assert_eq!(&Response::decode(cmd, payload).unwrap(), rsp);
    }
}

#[test]
fn commands_without_response_have_no_response_size() {
    for cmd in Command::EVERY {
        assert_eq!(
            Response::expected_size(cmd, 5).is_some(),
            cmd.has_response(),
            "{cmd}"
        );
        if !cmd.has_response() {
            assert_eq!(
                Response::decode(cmd, &[]),
                Err(DecodeError::NoResponse(cmd))
            );
        }
    }
}

#[test]
fn pipelined_frames_parse_by_framing() {
    // No-response requests arrive back-to-back (spec §15.1): parse a stream of frames.
    let fx = Fixture::new();
    let limits = Limits::default();
    let reqs = fx.requests(Major::V8);
    let mut stream = Vec::new();
    for r in &reqs {
        r.encode(&mut stream);
    }
    let mut rest = stream.as_slice();
    let mut decoded = Vec::new();
    while let Some((head, tail)) = rest.split_first_chunk::<FRAME_HEADER_SIZE>() {
        let h = FrameHeader::decode(head);
        let cmd = check_frame(Major::V8, &h, &limits).unwrap();
        let (payload, tail) = tail.split_at(usize::try_from(h.size).unwrap());
        decoded.push(Request::decode(Major::V8, cmd, payload, &limits).unwrap());
        rest = tail;
    }
    assert!(rest.is_empty());
    assert_eq!(decoded, reqs);
}

#[test]
fn set_tensor_header_streams() {
    let fx = Fixture::new();
    let h = SetTensorHeader {
        tensor: common::busy_tensor(5),
        cache_flag: 1,
        offset: 77,
    };
    // Client: head of the frame, then the data separately.
    let mut wire = Vec::new();
    h.encode_frame_head(fx.data.len() as u64, &mut wire);
    assert_eq!(wire.len(), FRAME_HEADER_SIZE + SET_TENSOR_HEADER_SIZE);
    wire.extend_from_slice(&fx.data);

    let full = Request::SetTensor {
        tensor: h.tensor,
        cache_flag: 1,
        offset: 77,
        data: &fx.data,
    };
    let mut expected = Vec::new();
    full.encode(&mut expected);
    assert_eq!(wire, expected);

    // Server: decode only the header part of the payload.
    let payload = &wire[FRAME_HEADER_SIZE..];
    assert_eq!(SetTensorHeader::decode(payload).unwrap(), h);
    assert_eq!(
        SetTensorHeader::decode(&payload[..SET_TENSOR_HEADER_SIZE]).unwrap(),
        h
    );
    let mut enc = Vec::new();
    h.encode(&mut enc);
    assert_eq!(enc, &payload[..SET_TENSOR_HEADER_SIZE]);
}

#[test]
fn graph_borrows_and_reencodes() {
    let fx = Fixture::new();
    let g = Graph::decode(Major::V7, &fx.graph, &Limits::default()).unwrap();
    assert_eq!(g.device, 1);
    assert_eq!(g.nodes().collect::<Vec<_>>(), [3, 2]);
    assert_eq!(g.tensors.len(), 3);
    assert_eq!(g.tensors[1], common::busy_tensor(2));
    assert_eq!(g.tensors[1].name_str(), "blk.2.attn_q.weight");
    let mut out = Vec::new();
    g.encode(&mut out);
    assert_eq!(out, fx.graph);
    assert_eq!(g.payload_len(), fx.graph.len() as u64);
    assert_eq!(graph_payload_size(2, 3), Some(fx.graph.len() as u64));
}
