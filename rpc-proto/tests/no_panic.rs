//! Seeded random and mutated inputs: decoders must never panic, and whatever
//! decodes must re-encode to the same bytes.

mod common;

use common::{Fixture, Rng};
use rpc_proto::*;

fn limit_sets() -> [Limits; 3] {
    [
        Limits::default(),
        Limits {
            max_request_size: 4096,
            max_graph_nodes: 4,
            max_graph_tensors: 4,
        },
        Limits {
            max_request_size: u64::MAX,
            max_graph_nodes: u32::MAX,
            max_graph_tensors: u32::MAX,
        },
    ]
}

/// Drive every decoder over `bytes`, checking round trips of what succeeds.
/// Returns whether `bytes` decoded as a complete request frame.
fn exercise(bytes: &[u8], limits: &Limits) -> bool {
    let mut frame_ok = false;
    for major in Major::ALL {
        frame_ok |= exercise_major(major, bytes, limits);
    }
    frame_ok
}

fn exercise_major(major: Major, bytes: &[u8], limits: &Limits) -> bool {
    let mut frame_ok = false;
    // As a whole frame.
    if let Some((head, payload)) = bytes.split_first_chunk::<FRAME_HEADER_SIZE>() {
        let h = FrameHeader::decode(head);
        assert_eq!(&h.encode(), head);
        if let Ok(cmd) = check_frame(major, &h, limits) {
            let n = usize::try_from(h.size)
                .unwrap_or(usize::MAX)
                .min(payload.len());
            if let Some(p) = payload.get(..n) {
                if let Ok(req) = Request::decode(major, cmd, p, limits) {
                    // check_frame accepted h.size and decode accepted p.len(): for fixed
                    // sizes they are equal.
                    let mut again = Vec::new();
                    req.encode_payload(&mut again);
                    assert_eq!(again, p, "{cmd} payload does not round-trip");
                    frame_ok = true;
                }
            }
        }
    }
    // As a payload of every command.
    for cmd in Command::EVERY {
        if let Ok(req) = Request::decode(major, cmd, bytes, limits) {
            assert_eq!(req.command(), cmd);
            let mut again = Vec::new();
            req.encode_payload(&mut again);
            assert_eq!(again, bytes, "{cmd} payload does not round-trip");
        }
        if let Ok(rsp) = Response::decode(cmd, bytes) {
            let mut again = Vec::new();
            rsp.encode_payload(&mut again);
            assert_eq!(Response::decode(cmd, &again).as_ref(), Ok(&rsp));
        }
    }
    if let Ok(g) = Graph::decode(major, bytes, limits) {
        let mut again = Vec::new();
        g.encode(&mut again);
        assert_eq!(again, bytes);
    }
    if let Ok(h) = SetTensorHeader::decode(bytes) {
        let mut again = Vec::new();
        h.encode(&mut again);
        assert_eq!(again, &bytes[..SET_TENSOR_HEADER_SIZE]);
    }
    frame_ok
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..5_000 {
        let len = match rng.below(4) {
            0 => rng.below(16),
            1 => rng.below(400),
            _ => rng.below(4000),
        };
        let bytes = rng.bytes(len);
        for l in &limit_sets() {
            exercise(&bytes, l);
        }
    }
}

/// Interesting values to splice over length fields.
const SPLICE_U32: [u32; 8] = [0, 1, 2, 3, 0x2000_0000, 0x7fff_ffff, 0x8000_0000, u32::MAX];

fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let n = rng.below(v.len() + 1);
                v.truncate(n);
            }
            2 => {
                let n = rng.below(600);
                v.extend(rng.bytes(n));
            }
            3 if v.len() >= 4 => {
                let i = rng.below(v.len() - 3);
                let x = SPLICE_U32[rng.below(SPLICE_U32.len())];
                v[i..i + 4].copy_from_slice(&x.to_le_bytes());
            }
            4 if v.len() >= 9 => {
                // Rewrite the frame size to something plausible or hostile.
                let sizes = [0u64, 12, 305, v.len() as u64 - 9, u64::MAX, 1 << 33];
                let s = sizes[rng.below(sizes.len())];
                v[1..9].copy_from_slice(&s.to_le_bytes());
            }
            5 if !v.is_empty() => v[0] = rng.below(25) as u8,
            _ => {}
        }
    }
}

#[test]
fn mutated_frames_never_panic() {
    let fx = Fixture::new();
    let seeds: Vec<Vec<u8>> = fx
        .requests(Major::V8)
        .iter()
        .chain(fx.requests(Major::V7).iter())
        .map(|r| {
            let mut v = Vec::new();
            r.encode(&mut v);
            v
        })
        .collect();
    let mut rng = Rng::new(0x5eed_0002);
    let mut decoded = 0;
    for _ in 0..20_000 {
        let mut v = seeds[rng.below(seeds.len())].clone();
        mutate(&mut rng, &mut v);
        for l in &limit_sets() {
            decoded += usize::from(exercise(&v, l));
            // Also as a bare payload (without the 9-byte frame header).
            exercise(v.get(FRAME_HEADER_SIZE..).unwrap_or(&[]), l);
        }
    }
    // The mutations must leave enough valid frames for the round-trip checks to bite.
    assert!(decoded > 5_000, "only {decoded} mutated frames decoded");
}

#[test]
fn every_frame_header_checks_without_panic() {
    let mut rng = Rng::new(0x5eed_0003);
    for cmd in 0..=u8::MAX {
        for _ in 0..50 {
            let size = match rng.below(3) {
                0 => rng.next_u64(),
                1 => rng.next_u64() % 4000,
                _ => [0, 4, 8, 9, 12, 24, 296, 305, 312, 313, 592, 3260][rng.below(12)],
            };
            for l in &limit_sets() {
                let h = FrameHeader { cmd, size };
                for major in Major::ALL {
                    if let Ok(c) = check_frame(major, &h, l) {
                        assert_eq!(c as u8, cmd);
                        assert!(size <= l.max_payload(major, c));
                    }
                }
            }
        }
    }
}
