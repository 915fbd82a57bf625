//! Stateful fuzzing of the server: sequences of commands (ALLOC_BUFFER, SET_TENSOR, GRAPH_COMPUTE,
//! GRAPH_RECOMPUTE, FREE_BUFFER, 8.0's SET/GET_TENSOR_2D and COMM_*, ...) against an in-process
//! session on the CPU backend, once as a 7.0.0 connection and once as an 8.0.0 one (the same
//! frames: a 7.0 seed's graphs mostly fail 8.0's layout, which mutation then repairs).
//! Seeded from real client traffic (`capture.py`). See `common/mod.rs` for the input format.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use rpc_proto::Major;

fuzz_target!(|data: &[u8]| {
    for major in Major::ALL {
        let mut h = common::Harness::new(major);
        for (cmd, payload) in common::frames(data) {
            if !h.exec(cmd, payload) {
                break;
            }
        }
    }
});
