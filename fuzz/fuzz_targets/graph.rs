//! Fuzzing of GRAPH_COMPUTE validation and execution: three zeroed buffers, then the
//! input as one GRAPH_COMPUTE payload (symbolic buffers, see `common/mod.rs`), computed, and
//! recomputed, once on a 7.0.0 session (the captured seeds' layout) and once on an 8.0.0 one
//! (the same bytes read with the uid after the device; recomputed by that uid). Whatever the
//! validator accepts is executed, so an accepted graph that reads or writes out of bounds is
//! caught by AddressSanitizer (ggml built with -fsanitize=address, see README), and a ggml
//! assertion aborts.
#![no_main]

#[path = "common/mod.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use rpc_proto::Major;

fn alloc(size: u64) -> Vec<u8> {
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend_from_slice(&size.to_le_bytes());
    p
}

fuzz_target!(|data: &[u8]| {
    for major in Major::ALL {
        let mut h = common::Harness::new(major);
        // Three buffers shaped like a llama.cpp client's (weights, KV cache, compute; the
        // captured seeds use these sizes). Zeroed: all-zero index tensors are valid row ids, so
        // graphs go on to compute.
        for size in [3u64 << 19, 1 << 20, 9 << 19] {
            assert!(h.exec(0, &alloc(size)));
        }
        for (idx, fill) in [(1u64, 0u8), (2, 0), (3, 0)] {
            let mut p = idx.to_le_bytes().to_vec();
            p.push(fill);
            assert!(h.exec(5, &p)); // BUFFER_CLEAR
        }
        if h.exec(10, data) {
            // GRAPH_RECOMPUTE of device 0 (8.0: of the uid the graph was stored under; uid 0 is
            // not stored, and its recompute is refused as the stock server refuses it).
            let mut recompute = 0u32.to_le_bytes().to_vec();
            if major == Major::V8 {
                recompute.extend_from_slice(data.get(4..12).unwrap_or(&[0; 8]));
            }
            let _ = h.exec(16, &recompute);
        }
    }
});
