//! Fuzz the rpc-proto codec: `cargo fuzz run codec` (from /work/main, nightly).
//!
//! The input is read as a server of either major would read a connection: a stream of
//! `| u8 cmd | u64 size | payload |` frames, once as 7.0.0 and once as 8.0.0. Every frame goes
//! through `check_frame` and `Request::decode`; the raw input also goes through
//! `Graph::decode` (both layouts), `SetTensorHeader::decode` and `Response::decode`.
//! Whatever decodes must re-encode to the very same bytes, and what the two majors share must
//! decode the same in both.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_proto::{
    check_frame, Command, FrameHeader, Graph, Limits, Major, Request, Response, SetTensorHeader,
    FRAME_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};

/// Small limits so that the interesting boundaries are reachable with small inputs.
const SMALL: Limits = Limits {
    max_request_size: 1 << 16,
    max_graph_nodes: 64,
    max_graph_tensors: 64,
};

/// Whether `cmd`'s request has the same layout in both majors.
fn same_layout(cmd: Command) -> bool {
    !cmd.is_v8_only() && !matches!(cmd, Command::GraphCompute | Command::GraphRecompute)
}

fn check_request(major: Major, cmd: Command, payload: &[u8], limits: &Limits) {
    let decoded = Request::decode(major, cmd, payload, limits);
    if let Ok(req) = &decoded {
        assert_eq!(req.command(), cmd);
        let mut again = Vec::new();
        req.encode_payload(&mut again);
        assert_eq!(
            again, payload,
            "{cmd} request does not round-trip ({major})"
        );

        let mut frame = Vec::new();
        req.encode(&mut frame);
        let (head, rest) = frame
            .split_first_chunk::<FRAME_HEADER_SIZE>()
            .expect("encoded frame has a header");
        let h = FrameHeader::decode(head);
        assert_eq!(h.size, rest.len() as u64);
        assert_eq!(check_frame(major, &h, limits), Ok(cmd));
        assert!(req.reply_data_len() == 0 || cmd.has_response());
    }
    if major.command(cmd.as_u8()).is_none() {
        assert!(decoded.is_err(), "{cmd} decoded on a {major} connection");
    } else if same_layout(cmd) {
        let other = match major {
            Major::V7 => Major::V8,
            Major::V8 => Major::V7,
        };
        assert_eq!(
            Request::decode(other, cmd, payload, limits),
            decoded,
            "{cmd} decodes differently in {major} and {other}"
        );
    }
}

fn check_stream(major: Major, mut data: &[u8], limits: &Limits) {
    while let Some((head, rest)) = data.split_first_chunk::<FRAME_HEADER_SIZE>() {
        let h = FrameHeader::decode(head);
        assert_eq!(&h.encode(), head);
        let Ok(cmd) = check_frame(major, &h, limits) else {
            return; // a server closes the connection here
        };
        assert!(major.command(h.cmd) == Some(cmd));
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
        check_request(major, cmd, payload, limits);
        data = tail;
    }
}

fuzz_target!(|data: &[u8]| {
    for limits in [Limits::default(), SMALL] {
        for major in Major::ALL {
            check_stream(major, data, &limits);

            if let Ok(g) = Graph::decode(major, data, &limits) {
                assert_eq!(g.uid.is_some(), major == Major::V8);
                assert_eq!(g.payload_len(), data.len() as u64);
                let mut again = Vec::new();
                g.encode(&mut again);
                assert_eq!(again, data, "graph does not round-trip ({major})");
            }
        }
    }

    // The first byte picks a command (8.0's table, a superset of 7.0's); the rest is a bare
    // payload.
    if let Some((&b, payload)) = data.split_first() {
        if let Some(cmd) = Major::V8.command(b) {
            for major in Major::ALL {
                check_request(major, cmd, payload, &Limits::default());
            }
            if let Ok(rsp) = Response::decode(cmd, payload) {
                assert_eq!(rsp.command(), cmd);
                let mut again = Vec::new();
                rsp.encode_payload(&mut again);
                assert_eq!(Response::decode(cmd, &again).as_ref(), Ok(&rsp));
            }
        }
    }
});
