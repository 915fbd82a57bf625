//! Every protocol command through the session alone (`Session::handle`/`reply`, `Session::hello`),
//! in memory on a CPU session: at least one test per command, each asserting the command's effect
//! or its refusal (the exact [`SessionError`] variant).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rpc_proto::{
    ggml_op, ggml_type, CommInit, Graph, Major, Region2d, Request, Response, RpcTensor,
    TensorBuilder, COMM_HOST_SIZE, CONN_CAPS_SIZE, TENSOR_FLAG_COMPUTE, U64,
};

use super::*;
use crate::peer::memory::{pair, MemLink};
use rpc_ggml::{Device, DeviceKind};
use rpc_weights::cache::WeightCache;

// ---- helpers -----------------------------------------------------------------------------

/// The CPU device.
pub(crate) fn cpu() -> Device {
    Device::all()
        .into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .expect("a CPU device")
}

/// A session of `major` on `devices`, counting against `budget`.
pub(crate) fn session_on(
    devices: Vec<Device>,
    major: Major,
    budget: Arc<MemoryBudget>,
    cache: Option<WeightCache>,
) -> Session {
    let config = SessionConfig {
        devices,
        n_threads: 1,
        cache,
        local: None,
    };
    Session::new(Arc::new(config), major, budget)
}

/// A CPU session of `major`, unlimited, without a cache.
pub(crate) fn session(major: Major) -> Session {
    session_on(
        vec![cpu()],
        major,
        Arc::new(MemoryBudget::unlimited()),
        None,
    )
}

/// ALLOC_BUFFER + BUFFER_GET_BASE on device 0: `(handle, base)`.
pub(crate) fn alloc(s: &mut Session, size: u64) -> (u64, u64) {
    let Ok(Some(Response::AllocBuffer { remote_ptr, .. })) =
        s.handle(Request::AllocBuffer { device: 0, size })
    else {
        panic!("ALLOC_BUFFER of {size} bytes failed");
    };
    assert_ne!(remote_ptr, 0, "a null handle");
    let Ok(Some(Response::BufferGetBase { base_ptr })) =
        s.handle(Request::BufferGetBase { remote_ptr })
    else {
        panic!("BUFFER_GET_BASE");
    };
    (remote_ptr, base_ptr)
}

/// `err` is the region check of command `what`.
#[track_caller]
pub(crate) fn assert_out_of_bounds(err: &SessionError, what: &str) {
    assert!(
        matches!(err, SessionError::OutOfBounds { what: w, .. } if *w == what),
        "{what}: {err}"
    );
}

/// An F32 vector of `n` at `addr` in buffer `h`.
pub(crate) fn f32_at(id: u64, n: u32, h: u64, addr: u64) -> RpcTensor {
    TensorBuilder::f32(id).ne(&[n]).data(h, addr).build()
}

pub(crate) fn set(s: &mut Session, t: &RpcTensor, offset: u64, data: &[u8]) {
    let r = s.handle(Request::SetTensor {
        tensor: *t,
        cache_flag: 0,
        offset,
        data,
    });
    assert!(matches!(r, Ok(None)), "SET_TENSOR: {r:?}");
}

/// GET_TENSOR through `handle` (the owned reply).
pub(crate) fn get(s: &mut Session, t: &RpcTensor, offset: u64, size: u64) -> Vec<u8> {
    match s.handle(Request::GetTensor {
        tensor: *t,
        offset,
        size,
    }) {
        Ok(Some(Response::GetTensor(b))) => b,
        other => panic!("GET_TENSOR: {other:?}"),
    }
}

pub(crate) fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!(
            "rpc-session-tests-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bytes(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i * 31 + seed) as u8).collect()
}

// ---- device queries --------------------------------------------------------------------------

#[test]
fn device_count_is_the_number_of_configured_devices() {
    let mut s = session(Major::V8);
    assert!(matches!(
        s.handle(Request::DeviceCount),
        Ok(Some(Response::DeviceCount { count: 1 }))
    ));
    let budget = Arc::new(MemoryBudget::unlimited());
    let mut two = session_on(vec![cpu(), cpu()], Major::V7, budget, None);
    assert!(matches!(
        two.handle(Request::DeviceCount),
        Ok(Some(Response::DeviceCount { count: 2 }))
    ));
}

#[test]
fn get_alignment_is_the_devices_and_a_bad_device_is_refused() {
    let mut s = session(Major::V8);
    let Ok(Some(Response::GetAlignment { alignment })) =
        s.handle(Request::GetAlignment { device: 0 })
    else {
        panic!("GET_ALIGNMENT");
    };
    assert_eq!(alignment, cpu().alignment());
    assert!(alignment.is_power_of_two(), "{alignment}");
    assert!(matches!(
        s.handle(Request::GetAlignment { device: 1 }),
        Err(SessionError::BadDevice {
            device: 1,
            count: 1
        })
    ));
}

#[test]
fn get_max_size_is_the_devices_and_a_bad_device_is_refused() {
    let mut s = session(Major::V8);
    let Ok(Some(Response::GetMaxSize { max_size })) = s.handle(Request::GetMaxSize { device: 0 })
    else {
        panic!("GET_MAX_SIZE");
    };
    assert_eq!(max_size, cpu().max_size());
    assert!(max_size >= 1 << 20, "{max_size}");
    assert!(matches!(
        s.handle(Request::GetMaxSize { device: 7 }),
        Err(SessionError::BadDevice {
            device: 7,
            count: 1
        })
    ));
}

#[test]
fn get_device_memory_reports_free_within_total_and_refuses_a_bad_device() {
    let mut s = session(Major::V7);
    let Ok(Some(Response::GetDeviceMemory { free, total })) =
        s.handle(Request::GetDeviceMemory { device: 0 })
    else {
        panic!("GET_DEVICE_MEMORY");
    };
    assert!(total > 0 && free <= total, "free {free} total {total}");
    let err = s
        .handle(Request::GetDeviceMemory { device: 1 })
        .unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::BadDevice {
                device: 1,
                count: 1
            }
        ),
        "{err}"
    );
}

// ---- buffers ---------------------------------------------------------------------------------

#[test]
fn alloc_buffer_answers_a_handle_and_its_size_charged_to_the_budget() {
    let budget = Arc::new(MemoryBudget::unlimited());
    let mut s = session_on(vec![cpu()], Major::V8, budget.clone(), None);
    let Ok(Some(Response::AllocBuffer {
        remote_ptr,
        remote_size,
    })) = s.handle(Request::AllocBuffer {
        device: 0,
        size: 10_000,
    })
    else {
        panic!("ALLOC_BUFFER");
    };
    assert_ne!(remote_ptr, 0);
    assert!(remote_size >= 10_000, "{remote_size}");
    assert_eq!(budget.used(), remote_size);
    assert_eq!(s.allocated(), (1, remote_size));
    // A second buffer has a handle of its own.
    let (h2, _) = alloc(&mut s, 4096);
    assert_ne!(h2, remote_ptr);
    assert_eq!(s.allocated().0, 2);
    assert!(matches!(
        s.handle(Request::AllocBuffer {
            device: 3,
            size: 16
        }),
        Err(SessionError::BadDevice { device: 3, .. })
    ));
}

#[test]
fn alloc_buffer_over_a_limit_answers_the_null_handle() {
    const NULL: Response = Response::AllocBuffer {
        remote_ptr: 0,
        remote_size: 0,
    };
    // Per connection.
    let budget = Arc::new(MemoryBudget::new(MemoryLimits {
        per_connection: 8192,
        total: u64::MAX,
    }));
    let mut s = session_on(vec![cpu()], Major::V8, budget.clone(), None);
    alloc(&mut s, 4096);
    let used = budget.used();
    let r = s.handle(Request::AllocBuffer {
        device: 0,
        size: 8192,
    });
    assert_eq!(r.unwrap(), Some(NULL));
    assert_eq!(budget.used(), used, "nothing charged");
    assert_eq!(budget.refused(), 1);
    assert_eq!(s.allocated().0, 1, "no buffer added");
    // Server-wide: a second session on the same budget.
    let shared = Arc::new(MemoryBudget::new(MemoryLimits {
        per_connection: u64::MAX,
        total: 6000,
    }));
    let mut a = session_on(vec![cpu()], Major::V8, shared.clone(), None);
    let mut b = session_on(vec![cpu()], Major::V8, shared.clone(), None);
    alloc(&mut a, 4096);
    let r = b.handle(Request::AllocBuffer {
        device: 0,
        size: 4096,
    });
    assert_eq!(r.unwrap(), Some(NULL));
    assert!(!b.holds_state());
    // a's memory given back: b may allocate.
    drop(a);
    assert_eq!(shared.used(), 0);
    alloc(&mut b, 4096);
}

#[test]
fn buffer_get_base_is_aligned_and_far_from_zero() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let align = cpu().alignment().next_power_of_two().max(4096);
    assert_eq!(base % align, 0, "{base:#x}");
    assert!(((1 << 40)..(1 << 47)).contains(&base), "{base:#x}");
    // Asked again: the same base.
    assert_eq!(
        s.handle(Request::BufferGetBase { remote_ptr: h }).unwrap(),
        Some(Response::BufferGetBase { base_ptr: base })
    );
    assert!(matches!(
        s.handle(Request::BufferGetBase { remote_ptr: h ^ 1 }),
        Err(SessionError::UnknownBuffer(x)) if x == h ^ 1
    ));
}

#[test]
fn free_buffer_forgets_the_handle_and_gives_the_memory_back() {
    let budget = Arc::new(MemoryBudget::unlimited());
    let mut s = session_on(vec![cpu()], Major::V7, budget.clone(), None);
    assert!(matches!(
        s.handle(Request::FreeBuffer { remote_ptr: 0x1234 }),
        Err(SessionError::UnknownBuffer(0x1234))
    ));
    let (h, _) = alloc(&mut s, 4096);
    let (keep, _) = alloc(&mut s, 8192);
    let both = budget.used();
    assert!(both >= 4096 + 8192);
    assert!(matches!(
        s.handle(Request::FreeBuffer { remote_ptr: h }),
        Ok(None)
    ));
    assert_eq!(budget.used(), s.allocated().1, "what the kept buffer holds");
    assert!(budget.used() >= 8192 && budget.used() <= both - 4096);
    // The handle is unknown now, to every command.
    assert!(matches!(
        s.handle(Request::BufferGetBase { remote_ptr: h }),
        Err(SessionError::UnknownBuffer(x)) if x == h
    ));
    assert!(matches!(
        s.handle(Request::FreeBuffer { remote_ptr: h }),
        Err(SessionError::UnknownBuffer(x)) if x == h
    ));
    assert!(matches!(
        s.handle(Request::FreeBuffer { remote_ptr: keep }),
        Ok(None)
    ));
    assert_eq!(budget.used(), 0);
    assert_eq!(s.allocated(), (0, 0));
}

#[test]
fn holds_state_follows_the_buffers() {
    let mut s = session(Major::V8);
    assert!(!s.holds_state(), "a fresh session holds nothing");
    let (h, _) = alloc(&mut s, 4096);
    assert!(s.holds_state());
    s.handle(Request::FreeBuffer { remote_ptr: h }).unwrap();
    assert!(!s.holds_state());
}

#[test]
fn buffer_clear_sets_every_byte_of_the_buffer() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let all = TensorBuilder::new(1, ggml_type::I8)
        .ne(&[4096])
        .data(h, base)
        .build();
    set(&mut s, &all, 0, &bytes(4096, 3));
    assert!(matches!(
        s.handle(Request::BufferClear {
            remote_ptr: h,
            value: 0x5A
        }),
        Ok(None)
    ));
    assert_eq!(get(&mut s, &all, 0, 4096), vec![0x5A; 4096]);
    assert!(matches!(
        s.handle(Request::BufferClear {
            remote_ptr: h ^ 1,
            value: 0
        }),
        Err(SessionError::UnknownBuffer(_))
    ));
}

// ---- tensor data -----------------------------------------------------------------------------

#[test]
fn set_tensor_whole_request_writes_and_stores_a_flagged_upload() {
    let dir = TempDir::new("set");
    let cache = WeightCache::open(&dir.0, None).unwrap();
    let mut s = session_on(
        vec![cpu()],
        Major::V8,
        Arc::new(MemoryBudget::unlimited()),
        Some(cache),
    );
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base);
    let data = bytes(700, 1);
    let hash = rpc_proto::fnv1a64(&data);
    set(&mut s, &t, 16, &data);
    assert_eq!(get(&mut s, &t, 16, 700), data);
    assert_eq!(s.cache().unwrap().entry_len(hash), None, "not flagged");
    let r = s.handle(Request::SetTensor {
        tensor: t,
        cache_flag: 1,
        offset: 16,
        data: &data,
    });
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(s.cache().unwrap().entry_len(hash), Some(700));
    assert_eq!(get(&mut s, &t, 16, 700), data);
    // Beyond the buffer: refused.
    let err = s
        .handle(Request::SetTensor {
            tensor: t,
            cache_flag: 1,
            offset: 4000,
            data: &data,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "SET_TENSOR");
}

#[test]
fn set_tensor_hash_without_a_cache_is_not_found() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base);
    set(&mut s, &t, 0, &[0; 1024]);
    let data = bytes(512, 9);
    let r = s.handle(Request::SetTensorHash {
        tensor: t,
        offset: 0,
        hash: rpc_proto::fnv1a64(&data),
    });
    assert_eq!(r.unwrap(), Some(Response::SetTensorHash { result: 0 }));
    assert_eq!(get(&mut s, &t, 0, 1024), vec![0; 1024], "nothing written");
}

#[test]
fn set_tensor_hash_from_the_cache_writes_the_entry() {
    let dir = TempDir::new("hash");
    let cache = WeightCache::open(&dir.0, None).unwrap();
    let data = bytes(600, 5);
    let hash = rpc_proto::fnv1a64(&data);
    cache.store(&data);
    assert_eq!(cache.entry_len(hash), Some(600));
    let mut s = session_on(
        vec![cpu()],
        Major::V7,
        Arc::new(MemoryBudget::unlimited()),
        Some(cache),
    );
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base);
    set(&mut s, &t, 0, &[0; 1024]);
    let r = s.handle(Request::SetTensorHash {
        tensor: t,
        offset: 100,
        hash,
    });
    assert_eq!(r.unwrap(), Some(Response::SetTensorHash { result: 1 }));
    assert_eq!(get(&mut s, &t, 100, 600), data);
    assert_eq!(get(&mut s, &t, 0, 100), vec![0; 100], "before the region");
    // A hash the cache does not hold.
    let r = s.handle(Request::SetTensorHash {
        tensor: t,
        offset: 0,
        hash: hash ^ 1,
    });
    assert_eq!(r.unwrap(), Some(Response::SetTensorHash { result: 0 }));
    let c = s.cache().unwrap().counters();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(
        (c.hits.load(Relaxed), c.bytes_served.load(Relaxed)),
        (1, 600)
    );
    assert_eq!(c.misses.load(Relaxed), 1);
    // The entry's bytes do not fit at that offset of the buffer: refused.
    let err = s
        .handle(Request::SetTensorHash {
            tensor: t,
            offset: 3600,
            hash,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "SET_TENSOR_HASH");
}

#[test]
fn get_tensor_reads_the_region_and_refuses_one_outside_the_buffer() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base + 1024);
    let data = bytes(1024, 2);
    set(&mut s, &t, 0, &data);
    assert_eq!(get(&mut s, &t, 200, 300), data[200..500]);
    // 1024 + 3000 + 200 > 4096.
    let err = s
        .handle(Request::GetTensor {
            tensor: t,
            offset: 3000,
            size: 200,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "GET_TENSOR");
    // Below the buffer's base.
    let below = f32_at(2, 4, h, base - 64);
    let err = s
        .handle(Request::GetTensor {
            tensor: below,
            offset: 0,
            size: 16,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "GET_TENSOR");
    // The borrowed reply has the same bytes.
    match s.reply(Request::GetTensor {
        tensor: t,
        offset: 0,
        size: 1024,
    }) {
        Ok(Some(r)) => assert_eq!(r.into_response(), Response::GetTensor(data)),
        Ok(None) => panic!("no reply"),
        Err(e) => panic!("{e}"),
    };
}

#[test]
fn memset_tensor_sets_the_region_and_refuses_beyond_the_tensor() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base);
    set(&mut s, &t, 0, &[0; 1024]);
    let r = s.handle(Request::MemsetTensor {
        tensor: t,
        offset: 100,
        size: 50,
        value: 7,
    });
    assert!(matches!(r, Ok(None)), "{r:?}");
    let got = get(&mut s, &t, 0, 1024);
    assert!(got[100..150].iter().all(|&b| b == 7));
    assert_eq!(got[99], 0);
    assert_eq!(got[150], 0);
    // Inside the buffer but beyond the tensor's 1024 bytes.
    let err = s
        .handle(Request::MemsetTensor {
            tensor: t,
            offset: 1000,
            size: 100,
            value: 9,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "MEMSET_TENSOR");
    assert_eq!(get(&mut s, &t, 1000, 24), vec![0; 24], "nothing written");
}

#[test]
fn copy_tensor_copies_between_tensors_and_refuses_a_short_destination() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let (h2, base2) = alloc(&mut s, 4096);
    let src = f32_at(1, 256, h, base);
    let dst = f32_at(2, 256, h, base + 1024);
    let other = f32_at(3, 256, h2, base2 + 512);
    let data = bytes(1024, 4);
    set(&mut s, &src, 0, &data);
    set(&mut s, &dst, 0, &[0; 1024]);
    let r = s.handle(Request::CopyTensor { src, dst });
    assert_eq!(r.unwrap(), Some(Response::CopyTensor { result: 1 }));
    assert_eq!(get(&mut s, &dst, 0, 1024), data);
    // Into another buffer.
    let r = s.handle(Request::CopyTensor { src, dst: other });
    assert_eq!(r.unwrap(), Some(Response::CopyTensor { result: 1 }));
    assert_eq!(get(&mut s, &other, 0, 1024), data);
    // 1024 bytes into a 64-byte tensor at the buffer's end.
    let short = f32_at(4, 16, h, base + 4096 - 64);
    set(&mut s, &short, 0, &[0; 64]);
    let err = s
        .handle(Request::CopyTensor { src, dst: short })
        .unwrap_err();
    assert_out_of_bounds(&err, "COPY_TENSOR");
    assert_eq!(get(&mut s, &short, 0, 64), vec![0; 64], "nothing written");
    let lost = f32_at(5, 256, h ^ h2 ^ 1, base);
    assert!(matches!(
        s.handle(Request::CopyTensor { src: lost, dst }),
        Err(SessionError::UnknownBuffer(_))
    ));
}

#[test]
fn init_tensor_accepts_a_tensor_of_a_buffer_and_refuses_others() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 256, h, base);
    let data = bytes(1024, 6);
    set(&mut s, &t, 0, &data);
    let r = s.handle(Request::InitTensor { tensor: t });
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(
        get(&mut s, &t, 0, 1024),
        data,
        "the CPU hook leaves the bytes"
    );
    // Without a buffer: nothing to initialise.
    let loose = TensorBuilder::f32(2).ne(&[4]).build();
    assert!(matches!(
        s.handle(Request::InitTensor { tensor: loose }),
        Ok(None)
    ));
    // An unknown buffer; a tensor reaching past its buffer; a data pointer without a buffer.
    assert!(matches!(
        s.handle(Request::InitTensor {
            tensor: f32_at(3, 4, h ^ 1, base)
        }),
        Err(SessionError::UnknownBuffer(_))
    ));
    assert!(matches!(
        s.handle(Request::InitTensor {
            tensor: f32_at(4, 256, h, base + 3584)
        }),
        Err(SessionError::InvalidTensor { .. })
    ));
    assert!(matches!(
        s.handle(Request::InitTensor {
            tensor: f32_at(5, 4, 0, base)
        }),
        Err(SessionError::InvalidTensor { .. })
    ));
}

#[test]
fn get_alloc_size_is_at_least_the_tensors_bytes() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let ask = |s: &mut Session, tensor: RpcTensor, device: u32| {
        s.handle(Request::GetAllocSize {
            device,
            tensor,
            srcs: Box::new([RpcTensor::default(); rpc_proto::GGML_MAX_SRC]),
        })
    };
    let t = f32_at(1, 256, h, base);
    let Ok(Some(Response::GetAllocSize { alloc_size })) = ask(&mut s, t, 0) else {
        panic!("GET_ALLOC_SIZE");
    };
    assert!((1024..=1024 + 4096).contains(&alloc_size), "{alloc_size}");
    // A quantized tensor without a buffer: 2 rows of 64 Q4_0 values, 72 bytes.
    let q = TensorBuilder::new(2, ggml_type::Q4_0).ne(&[64, 2]).build();
    let Ok(Some(Response::GetAllocSize { alloc_size })) = ask(&mut s, q, 0) else {
        panic!("GET_ALLOC_SIZE");
    };
    assert!((72..=72 + 4096).contains(&alloc_size), "{alloc_size}");
    // A buffer of another connection is ignored, as stock.
    let elsewhere = f32_at(3, 256, h ^ 1, 0x1000);
    assert!(matches!(
        ask(&mut s, elsewhere, 0),
        Ok(Some(Response::GetAllocSize { alloc_size })) if alloc_size >= 1024
    ));
    assert!(matches!(
        ask(&mut s, t, 1),
        Err(SessionError::BadDevice { device: 1, .. })
    ));
}

// ---- graphs ----------------------------------------------------------------------------------

/// `c = a + b` on vectors of 4: the three tensors at `base`, `base + 16`, `base + 32`.
fn add_graph(h: u64, base: u64) -> [RpcTensor; 3] {
    let a = TensorBuilder::f32(1)
        .ne(&[4])
        .data(h, base)
        .name("a")
        .build();
    let b = TensorBuilder::f32(2)
        .ne(&[4])
        .data(h, base + 16)
        .name("b")
        .build();
    let c = TensorBuilder::f32(3)
        .ne(&[4])
        .data(h, base + 32)
        .op(ggml_op::ADD, &[])
        .srcs(&[1, 2])
        .flags(TENSOR_FLAG_COMPUTE)
        .name("c")
        .build();
    [a, b, c]
}

fn compute(s: &mut Session, uid: Option<u64>, ts: &[RpcTensor]) -> Result<(), SessionError> {
    let nodes = [U64::new(3)];
    let g = Graph {
        device: 0,
        uid,
        node_ids: &nodes,
        tensors: ts,
    };
    s.handle(Request::GraphCompute(g))
        .map(|r| assert!(r.is_none()))
}

#[test]
fn graph_compute_then_recompute_by_uid_sees_new_inputs() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let ts = add_graph(h, base);
    let [a, b, c] = ts;
    set(&mut s, &a, 0, &f32s(&[1., 2., 3., 4.]));
    set(&mut s, &b, 0, &f32s(&[10., 20., 30., 40.]));
    compute(&mut s, Some(7), &ts).expect("GRAPH_COMPUTE");
    assert_eq!(floats(&get(&mut s, &c, 0, 16)), [11., 22., 33., 44.]);
    // A new input, the kept graph run again.
    set(&mut s, &a, 0, &f32s(&[100., 200., 300., 400.]));
    let r = s.handle(Request::GraphRecompute {
        device: 0,
        uid: Some(7),
    });
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(floats(&get(&mut s, &c, 0, 16)), [110., 220., 330., 440.]);
    // A uid never computed.
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 0,
            uid: Some(8)
        }),
        Err(SessionError::GraphNotFound { device: 0, uid: 8 })
    ));
    // uid 0 runs but is not kept.
    set(&mut s, &b, 0, &f32s(&[0.; 4]));
    compute(&mut s, Some(0), &ts).expect("GRAPH_COMPUTE uid 0");
    assert_eq!(floats(&get(&mut s, &c, 0, 16)), [100., 200., 300., 400.]);
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 0,
            uid: Some(0)
        }),
        Err(SessionError::GraphNotFound { device: 0, uid: 0 })
    ));
    // uid 7 is still there.
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 0,
            uid: Some(7)
        }),
        Ok(None)
    ));
    // A device that does not exist.
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 1,
            uid: Some(7)
        }),
        Err(SessionError::BadDevice { device: 1, .. })
    ));
}

#[test]
fn free_buffer_drops_every_stored_graph_in_8_0() {
    let budget = Arc::new(MemoryBudget::unlimited());
    let mut s = session_on(vec![cpu()], Major::V8, budget.clone(), None);
    let (h, base) = alloc(&mut s, 4096);
    let (other, _) = alloc(&mut s, 4096);
    let buffers = budget.used();
    compute(&mut s, Some(7), &add_graph(h, base)).expect("GRAPH_COMPUTE");
    assert!(budget.used() > buffers, "the kept graph is charged");
    // Freeing a buffer the graph does not use still drops it (stock 8.0 rule).
    s.handle(Request::FreeBuffer { remote_ptr: other }).unwrap();
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 0,
            uid: Some(7)
        }),
        Err(SessionError::GraphNotFound { device: 0, uid: 7 })
    ));
    assert_eq!(
        budget.used(),
        s.allocated().1,
        "the graph's charge given back"
    );
}

#[test]
fn graph_recompute_in_7_0_runs_the_last_graph() {
    let mut s = session(Major::V7);
    assert!(matches!(
        s.handle(Request::GraphRecompute {
            device: 0,
            uid: None
        }),
        Err(SessionError::NoStoredGraph(0))
    ));
    let (h, base) = alloc(&mut s, 4096);
    let ts = add_graph(h, base);
    let [a, b, c] = ts;
    set(&mut s, &a, 0, &f32s(&[1.; 4]));
    set(&mut s, &b, 0, &f32s(&[2.; 4]));
    compute(&mut s, None, &ts).expect("GRAPH_COMPUTE");
    assert_eq!(floats(&get(&mut s, &c, 0, 16)), [3.; 4]);
    set(&mut s, &b, 0, &f32s(&[5.; 4]));
    s.handle(Request::GraphRecompute {
        device: 0,
        uid: None,
    })
    .expect("GRAPH_RECOMPUTE");
    assert_eq!(floats(&get(&mut s, &c, 0, 16)), [6.; 4]);
}

// ---- 8.0's strided copies --------------------------------------------------------------------

#[test]
fn set_and_get_tensor_2d_round_trip_a_strided_region() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    // 16 rows of 16 floats (64 bytes a row).
    let t = TensorBuilder::f32(1).ne(&[16, 16]).data(h, base).build();
    set(&mut s, &t, 0, &[0; 1024]);
    // 8 bytes at offset 8 of rows 2..6.
    let region = Region2d {
        offset: 2 * 64 + 8,
        size: 8,
        n_copies: 4,
        stride: 64,
    };
    let data = bytes(32, 11);
    let r = s.handle(Request::SetTensor2d {
        tensor: t,
        region,
        data: &data,
    });
    assert!(matches!(r, Ok(None)), "{r:?}");
    let all = get(&mut s, &t, 0, 1024);
    let mut want = vec![0u8; 1024];
    for i in 0..4 {
        let at = (2 + i) * 64 + 8;
        want[at..at + 8].copy_from_slice(&data[i * 8..i * 8 + 8]);
    }
    assert_eq!(all, want);
    assert_eq!(
        s.handle(Request::GetTensor2d { tensor: t, region })
            .unwrap(),
        Some(Response::GetTensor2d(data))
    );
}

#[test]
fn tensor_2d_regions_outside_the_tensor_are_refused() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    let t = TensorBuilder::f32(1).ne(&[16, 16]).data(h, base).build();
    set(&mut s, &t, 0, &[0; 1024]);
    // The last chunk ends at 960 + 3·64 + 8 > 1024 (inside the buffer, beyond the tensor).
    let beyond = Region2d {
        offset: 960,
        size: 8,
        n_copies: 4,
        stride: 64,
    };
    let err = s
        .handle(Request::SetTensor2d {
            tensor: t,
            region: beyond,
            data: &[1; 32],
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "SET_TENSOR_2D");
    assert_eq!(get(&mut s, &t, 0, 1024), vec![0; 1024], "nothing written");
    let err = s
        .handle(Request::GetTensor2d {
            tensor: t,
            region: beyond,
        })
        .unwrap_err();
    assert_out_of_bounds(&err, "GET_TENSOR_2D");
    // Stride 0: one chunk repeated into a reply larger than the tensor.
    let repeated = Region2d {
        offset: 0,
        size: 512,
        n_copies: 3,
        stride: 0,
    };
    assert!(matches!(
        s.handle(Request::GetTensor2d {
            tensor: t,
            region: repeated
        }),
        Err(SessionError::OutOfBounds {
            what: "GET_TENSOR_2D",
            ..
        })
    ));
    // Zero-sized chunks.
    let empty = Region2d {
        offset: 0,
        size: 0,
        n_copies: 1,
        stride: 0,
    };
    assert!(matches!(
        s.handle(Request::GetTensor2d {
            tensor: t,
            region: empty
        }),
        Err(SessionError::OutOfBounds { .. })
    ));
}

// ---- 8.0's collectives -----------------------------------------------------------------------

fn comm_init(device: u32, rank: u32, world: u32) -> Request<'static> {
    let mut host = [0u8; COMM_HOST_SIZE];
    host[..9].copy_from_slice(b"127.0.0.1");
    Request::CommInit(CommInit {
        device,
        rank,
        world,
        port: 51052,
        host,
    })
}

#[test]
fn comm_init_without_a_connector_answers_0_and_allreduce_is_refused() {
    let mut s = session(Major::V8);
    let (h, base) = alloc(&mut s, 4096);
    assert_eq!(
        s.handle(comm_init(0, 0, 2)).unwrap(),
        Some(Response::CommInit { ok: 0 })
    );
    let t = f32_at(1, 4, h, base);
    assert!(matches!(
        s.handle(Request::CommAllreduce {
            device: 0,
            tensor: t
        }),
        Err(SessionError::NoCommunicator(0))
    ));
    assert!(matches!(
        s.handle(Request::CommAllreduce {
            device: 2,
            tensor: t
        }),
        Err(SessionError::BadDevice { device: 2, .. })
    ));
}

/// A connector that hands out one end of an in-memory link, once.
struct OneLink(Mutex<Option<MemLink>>);

impl std::fmt::Debug for OneLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneLink")
    }
}

impl crate::peer::Connector for OneLink {
    fn connect(&self, _: &CommInit) -> std::io::Result<Box<dyn crate::peer::PeerLink>> {
        let link = self.0.lock().unwrap().take();
        link.map(|l| Box::new(l) as Box<dyn crate::peer::PeerLink>)
            .ok_or_else(|| std::io::Error::other("used"))
    }
}

#[test]
fn comm_init_joins_allreduce_sums_with_the_peer_and_comm_free_leaves() {
    use crate::peer::PeerLink;
    let mut s = session(Major::V8);
    let (ours, mut peer) = pair();
    s.set_connector(Arc::new(OneLink(Mutex::new(Some(ours)))));
    // Not world 2, or a rank outside it: 0, and no link taken.
    assert_eq!(
        s.handle(comm_init(0, 0, 3)).unwrap(),
        Some(Response::CommInit { ok: 0 })
    );
    assert_eq!(
        s.handle(comm_init(0, 2, 2)).unwrap(),
        Some(Response::CommInit { ok: 0 })
    );
    assert_eq!(
        s.handle(comm_init(0, 0, 2)).unwrap(),
        Some(Response::CommInit { ok: 1 })
    );
    // Joined already: 1 again, without a new link.
    assert_eq!(
        s.handle(comm_init(0, 0, 2)).unwrap(),
        Some(Response::CommInit { ok: 1 })
    );
    let (h, base) = alloc(&mut s, 4096);
    let t = f32_at(1, 4, h, base);
    set(&mut s, &t, 0, &f32s(&[1., 2., 3., 4.]));
    let peer_side = std::thread::spawn(move || {
        let mut got = [0u8; 16];
        peer.exchange(&f32s(&[10., 20., 30., 40.]), &mut got)
            .expect("the peer's exchange");
        floats(&got)
    });
    let r = s.handle(Request::CommAllreduce {
        device: 0,
        tensor: t,
    });
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(
        peer_side.join().unwrap(),
        [1., 2., 3., 4.],
        "our partial sent"
    );
    assert_eq!(floats(&get(&mut s, &t, 0, 16)), [11., 22., 33., 44.]);
    assert_eq!(s.take_link_bytes(), (16, 16));
    // COMM_FREE leaves the link: the next allreduce has no communicator.
    assert!(matches!(
        s.handle(Request::CommFree { device: 0 }),
        Ok(None)
    ));
    assert!(matches!(
        s.handle(Request::CommAllreduce {
            device: 0,
            tensor: t
        }),
        Err(SessionError::NoCommunicator(0))
    ));
    assert!(matches!(
        s.handle(Request::CommFree { device: 1 }),
        Err(SessionError::BadDevice { device: 1, .. })
    ));
}

#[test]
fn comm_free_without_a_link_is_accepted() {
    let mut s = session(Major::V8);
    assert!(matches!(
        s.handle(Request::CommFree { device: 0 }),
        Ok(None)
    ));
    assert!(!s.holds_state());
}

// ---- our LINK_* extension (worker-to-worker copies) -------------------------------------------

fn link_open(slot: u32, rank: u32) -> Request<'static> {
    let Request::CommInit(init) = comm_init(0, rank, 2) else {
        unreachable!()
    };
    Request::LinkOpen { slot, init }
}

/// Two sessions whose slot `slot` holds the two ends of one in-memory link.
fn linked_sessions(slot: u32) -> (Session, Session) {
    let (a_end, b_end) = pair();
    let mut a = session(Major::V8);
    let mut b = session(Major::V8);
    a.set_connector(Arc::new(OneLink(Mutex::new(Some(a_end)))));
    b.set_connector(Arc::new(OneLink(Mutex::new(Some(b_end)))));
    for (s, rank) in [(&mut a, 0), (&mut b, 1)] {
        assert_eq!(
            s.handle(link_open(slot, rank)).unwrap(),
            Some(Response::LinkOpen { ok: 1 })
        );
    }
    (a, b)
}

#[test]
fn link_probe_answers_the_version_and_the_port_the_connector_knows() {
    let s = session(Major::V8);
    assert_eq!(
        s.link_probe(),
        Response::LinkProbe {
            version: rpc_proto::LINK_VERSION,
            port: 0
        }
    );
    // A connector that knows the port its client came in on (the server's `CommPolicy`: the
    // port of the address the client reached; its own test checks that it says so).
    #[derive(Debug)]
    struct OnPort(u16);
    impl crate::peer::Connector for OnPort {
        fn connect(&self, _: &CommInit) -> std::io::Result<Box<dyn crate::peer::PeerLink>> {
            Err(std::io::Error::other("no link"))
        }
        fn port(&self) -> Option<u16> {
            Some(self.0)
        }
    }
    let mut s = session(Major::V8);
    s.set_connector(Arc::new(OnPort(50052)));
    assert_eq!(
        s.handle(Request::LinkProbe).unwrap(),
        Some(Response::LinkProbe {
            version: rpc_proto::LINK_VERSION,
            port: 50052
        })
    );
}

#[test]
fn link_send_and_recv_copy_a_tensor_from_one_session_into_another() {
    let (mut a, mut b) = linked_sessions(3);
    let (ha, base_a) = alloc(&mut a, 4096);
    let (hb, base_b) = alloc(&mut b, 4096);
    let src = f32_at(1, 4, ha, base_a);
    let dst = f32_at(2, 4, hb, base_b + 64);
    for want in [[1., 2., 3., 4.], [5., 6., 7., 8.]] {
        set(&mut a, &src, 0, &f32s(&want));
        assert!(matches!(
            a.handle(Request::LinkSend {
                slot: 3,
                tensor: src,
                size: 16
            }),
            Ok(None)
        ));
        assert!(matches!(
            b.handle(Request::LinkRecv {
                slot: 3,
                tensor: dst,
                size: 16
            }),
            Ok(None)
        ));
        assert_eq!(floats(&get(&mut b, &dst, 0, 16)), want);
    }
    assert_eq!(a.take_link_bytes(), (32, 0));
    assert_eq!(b.take_link_bytes(), (0, 32));
    // Closed: the slot has no link any more.
    assert!(matches!(a.handle(Request::LinkClose { slot: 3 }), Ok(None)));
    assert!(matches!(
        a.handle(Request::LinkSend {
            slot: 3,
            tensor: src,
            size: 16
        }),
        Err(SessionError::Comm(_))
    ));
}

#[test]
fn link_commands_refuse_bad_slots_sizes_and_tensors_without_hanging_the_peer() {
    let (mut a, mut b) = linked_sessions(0);
    let (ha, base_a) = alloc(&mut a, 4096);
    let (hb, base_b) = alloc(&mut b, 4096);
    let src = f32_at(1, 4, ha, base_a);
    let dst = f32_at(2, 4, hb, base_b);
    // Slots past LINK_SLOTS: no link opens, and copies on them are refused.
    assert_eq!(
        a.handle(link_open(rpc_proto::LINK_SLOTS, 0)).unwrap(),
        Some(Response::LinkOpen { ok: 0 })
    );
    assert!(matches!(
        a.handle(Request::LinkSend {
            slot: rpc_proto::LINK_SLOTS,
            tensor: src,
            size: 16
        }),
        Err(SessionError::Comm(_))
    ));
    assert!(matches!(
        a.handle(Request::LinkClose { slot: u32::MAX }),
        Ok(None)
    ));
    // A world other than 2 or a rank outside it: 0 (as COMM_INIT).
    let Request::LinkOpen { init, .. } = link_open(5, 0) else {
        unreachable!()
    };
    for bad in [CommInit { world: 3, ..init }, CommInit { rank: 2, ..init }] {
        assert_eq!(
            a.handle(Request::LinkOpen { slot: 5, init: bad }).unwrap(),
            Some(Response::LinkOpen { ok: 0 })
        );
    }
    // A size that is not the tensor's: refused, and the peer told at once (no wait).
    assert!(matches!(
        a.handle(Request::LinkSend {
            slot: 0,
            tensor: src,
            size: 12
        }),
        Err(SessionError::InvalidTensor { .. })
    ));
    let r = b.handle(Request::LinkRecv {
        slot: 0,
        tensor: dst,
        size: 12,
    });
    assert!(
        matches!(&r, Err(SessionError::Comm(m)) if m.contains("failed")),
        "{r:?}"
    );
    // The link is still in step: a good copy goes through.
    set(&mut a, &src, 0, &f32s(&[1., 2., 3., 4.]));
    a.handle(Request::LinkSend {
        slot: 0,
        tensor: src,
        size: 16,
    })
    .unwrap();
    // A receiver that expects another count than was sent: refused (the link is dropped).
    let r = b.handle(Request::LinkRecv {
        slot: 0,
        tensor: dst,
        size: 8,
    });
    assert!(
        matches!(&r, Err(SessionError::Comm(m)) if m.contains("LINK_SEND of 16")),
        "{r:?}"
    );
    // A destination outside its buffer is refused before a byte is read.
    let (mut c, mut d) = linked_sessions(1);
    let (hc, base_c) = alloc(&mut c, 4096);
    let (hd, base_d) = alloc(&mut d, 4096);
    let big = f32_at(1, 4, hc, base_c);
    let near_end = f32_at(2, 4, hd, base_d + 4096 - 8);
    c.handle(Request::LinkSend {
        slot: 1,
        tensor: big,
        size: 16,
    })
    .unwrap();
    let r = d.handle(Request::LinkRecv {
        slot: 1,
        tensor: near_end,
        size: 16,
    });
    assert!(
        matches!(
            &r,
            Err(SessionError::OutOfBounds {
                what: "LINK_RECV",
                ..
            }) | Err(SessionError::InvalidTensor { .. })
        ),
        "{r:?}"
    );
    // A handle this session never gave: refused.
    let foreign = f32_at(3, 4, 0xdead_beef, base_d);
    assert!(d
        .handle(Request::LinkRecv {
            slot: 1,
            tensor: foreign,
            size: 16
        })
        .is_err());
}

// ---- HELLO -----------------------------------------------------------------------------------

#[test]
fn hello_after_the_first_command_is_refused() {
    let mut s = session(Major::V8);
    assert!(s.handle(Request::DeviceCount).is_ok());
    let err = s
        .handle(Request::Hello {
            caps: [0; CONN_CAPS_SIZE],
        })
        .unwrap_err();
    assert!(matches!(err, SessionError::UnexpectedHello), "{err}");
}

#[test]
fn hello_replies_the_sessions_major_with_the_caps() {
    let caps: [u8; CONN_CAPS_SIZE] = std::array::from_fn(|i| i as u8 + 1);
    for (major, number) in [(Major::V7, 7), (Major::V8, 8)] {
        let s = session(major);
        assert_eq!(
            s.hello(caps),
            Response::Hello {
                major: number,
                minor: 0,
                patch: 0,
                caps
            }
        );
    }
}
