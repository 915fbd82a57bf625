//! Fuzz the rpc-proto codec: `cargo fuzz run codec` (from /work/main, nightly).
//!
//! The input is read as a server would read a connection: a stream of
//! `| u8 cmd | u64 size | payload |` frames. Every frame goes through
//! `check_frame` and `Request::decode`; the raw input also goes through
//! `Graph::decode`, `SetTensorHeader::decode` and `Response::decode`.
//! Whatever decodes must re-encode to the very same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_proto::{
    check_frame, Command, FrameHeader, Graph, Limits, Request, Response, SetTensorHeader,
    FRAME_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};

/// Small limits so that the interesting boundaries are reachable with small inputs.
const SMALL: Limits = Limits {
    max_request_size: 1 << 16,
    max_graph_nodes: 64,
    max_graph_tensors: 64,
};

fn check_request(cmd: Command, payload: &[u8], limits: &Limits) {
    if let Ok(req) = Request::decode(cmd, payload, limits) {
        assert_eq!(req.command(), cmd);
        let mut again = Vec::new();
        req.encode_payload(&mut again);
        assert_eq!(again, payload, "{cmd} request does not round-trip");

        let mut frame = Vec::new();
        req.encode(&mut frame);
        let (head, rest) = frame
            .split_first_chunk::<FRAME_HEADER_SIZE>()
            .expect("encoded frame has a header");
        let h = FrameHeader::decode(head);
        assert_eq!(h.size, rest.len() as u64);
        assert_eq!(check_frame(&h, limits), Ok(cmd));
    }
}

fn check_stream(mut data: &[u8], limits: &Limits) {
    while let Some((head, rest)) = data.split_first_chunk::<FRAME_HEADER_SIZE>() {
        let h = FrameHeader::decode(head);
        assert_eq!(&h.encode(), head);
        let Ok(cmd) = check_frame(&h, limits) else {
            return; // a server closes the connection here
        };
        let Some(len) = usize::try_from(h.size).ok().filter(|&n| n <= rest.len()) else {
            return; // truncated stream
        };
        let (payload, tail) = rest.split_at(len);
        if cmd == Command::SetTensor {
            let hdr = SetTensorHeader::decode(payload).expect("check_frame guarantees 305 bytes");
            let mut again = Vec::new();
            hdr.encode(&mut again);
            assert_eq!(again, &payload[..SET_TENSOR_HEADER_SIZE]);
        }
        check_request(cmd, payload, limits);
        data = tail;
    }
}

fuzz_target!(|data: &[u8]| {
    for limits in [Limits::default(), SMALL] {
        check_stream(data, &limits);

        if let Ok(g) = Graph::decode(data, &limits) {
            let mut again = Vec::new();
            g.encode(&mut again);
            assert_eq!(again, data, "graph does not round-trip");
        }
    }

    // The first byte picks a command; the rest is a bare payload.
    if let Some((&b, payload)) = data.split_first() {
        if let Some(cmd) = Command::from_u8(b) {
            check_request(cmd, payload, &Limits::default());
            if let Ok(rsp) = Response::decode(cmd, payload) {
                assert_eq!(rsp.command(), cmd);
                let mut again = Vec::new();
                rsp.encode_payload(&mut again);
                assert_eq!(Response::decode(cmd, &again).as_ref(), Ok(&rsp));
            }
        }
    }
});
