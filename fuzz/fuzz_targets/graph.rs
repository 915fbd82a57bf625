//! Fuzzing of GRAPH_COMPUTE validation and execution: three zeroed buffers, then the
//! input as one GRAPH_COMPUTE payload (symbolic buffers, see `common/mod.rs`), computed, and
//! recomputed. Whatever the validator accepts is executed, so an accepted graph that reads or
//! writes out of bounds is caught by AddressSanitizer (ggml built with -fsanitize=address, see
//! README), and a ggml assertion aborts.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fn alloc(size: u64) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend_from_slice(&size.to_le_bytes());
    p
}

fuzz_target!(|data: &[u8]| {
    let mut h = common::Harness::new();
    // Three buffers shaped like a llama.cpp client's (weights, KV cache, compute; the captured
    // seeds use these sizes). Zeroed: all-zero index tensors are valid row ids, so graphs go on
    // to compute.
    for size in [3u64 << 19, 1 << 20, 9 << 19] {
        assert!(h.exec(0, &alloc(size)));
    }
    for (idx, fill) in [(1u64, 0u8), (2, 0), (3, 0)] {
        let mut p = idx.to_le_bytes().to_vec();
        p.push(fill);
        assert!(h.exec(5, &p)); // BUFFER_CLEAR
    }
    if h.exec(10, data) {
        let _ = h.exec(16, &0u32.to_le_bytes()); // GRAPH_RECOMPUTE
    }
});
