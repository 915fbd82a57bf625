//! Stateful fuzzing of the server: sequences of commands (ALLOC_BUFFER, SET_TENSOR, GRAPH_COMPUTE,
//! GRAPH_RECOMPUTE, FREE_BUFFER, ...) against an in-process session on the CPU backend.
//! Seeded from real client traffic (`capture.py`). See `common/mod.rs` for the input format.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut h = common::Harness::new();
    for (cmd, payload) in common::frames(data) {
        if !h.exec(cmd, payload) {
            break;
        }
    }
});
