//! Integration tests of `--gguf` (weights from the worker's own disk): a scripted client's
//! SET_TENSOR_HASH for a tensor of a local GGUF file is answered "found" and the tensor then
//! holds the file's bytes; a file changed after indexing is never served stale.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rpc_proto::{fnv1a64, ggml_type};
use rpc_tests::*;
use rpc_weights::local_weights::{LocalWeights, HASH_THRESHOLD};

/// Writes a GGUF v3 file with f32 tensors `(name, data)` (alignment 32) and returns the
/// absolute offset of each tensor's data.
fn write_gguf(path: &Path, tensors: &[(&str, &[u8])]) -> Vec<u64> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let s = |b: &mut Vec<u8>, v: &str| {
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    };
    s(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes()); // string
    s(&mut b, "llama");
    let mut rel = Vec::new();
    let mut off = 0u64;
    for (name, data) in tensors {
        s(&mut b, name);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&(data.len() as u64 / 4).to_le_bytes());
        b.extend_from_slice(&ggml_type::F32.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        rel.push(off);
        off = (off + data.len() as u64).next_multiple_of(32);
    }
    b.resize(b.len().next_multiple_of(32), 0);
    let base = b.len() as u64;
    for ((_, data), o) in tensors.iter().zip(&rel) {
        b.resize((base + o) as usize, 0);
        b.extend_from_slice(data);
    }
    std::fs::write(path, b).expect("write gguf");
    rel.iter().map(|o| base + o).collect()
}

fn set_mtime(path: &Path, t: SystemTime) {
    let f = File::options().write(true).open(path).unwrap();
    f.set_modified(t).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tensor_hash_is_served_from_a_local_gguf_and_never_stale() {
    let dir = TempDir::new("gguf");
    let model = dir.path().join("model.gguf");
    let len = (HASH_THRESHOLD + 4096) as usize; // over the client's hashing threshold
    let (a, b) = (pattern(len, 31), pattern(len, 32));
    let small = pattern(64 << 10, 33);
    let offs = write_gguf(&model, &[("a", &a), ("small", &small), ("b", &b)]);
    let t0 = SystemTime::now() - Duration::from_secs(60);
    set_mtime(&model, t0);
    let file = std::fs::read(&model).unwrap();
    assert_eq!(&file[offs[0] as usize..][..len], &a[..]);

    let index = dir.path().join("cache").join("gguf-index");
    let local = LocalWeights::build(&[dir.path().to_path_buf()], Some(index), 2).unwrap();
    assert_eq!(local.summary().tensors, 2, "only tensors over 10 MiB");
    let server = TestServer::start_with_local(local);

    let mut c = connect(server.addr).await;
    let buf = alloc(&mut c, 3 * len as u64).await;
    c.buffer_clear(buf.handle, 0).await.unwrap();
    let ta = buf.f32(1, &[(len / 4) as u32], 0).build();
    assert!(
        c.set_tensor_hash(&ta, 0, fnv1a64(&a)).await.unwrap(),
        "a tensor of the local file is found"
    );
    assert_eq!(c.get_tensor(&ta, 0, len as u64).await.unwrap(), a);
    // At an offset inside a larger tensor, as for the cache.
    let whole = buf.f32(2, &[(2 * len / 4) as u32], len as u64).build();
    assert!(c.set_tensor_hash(&whole, 4096, fnv1a64(&b)).await.unwrap());
    let got = c.get_tensor(&whole, 0, 4096 + len as u64).await.unwrap();
    assert_eq!(&got[..4096], &[0u8; 4096][..]);
    assert_eq!(&got[4096..], &b[..]);
    // Not in the index: small tensors (the client never asks for them) and unknown hashes.
    assert!(!c.set_tensor_hash(&ta, 0, fnv1a64(&small)).await.unwrap());
    assert!(!c
        .set_tensor_hash(&ta, 0, 0x0123_4567_89ab_cdef)
        .await
        .unwrap());
    // A region the client's buffer cannot hold is "not found", and the connection lives on.
    let tiny = alloc(&mut c, 4096).await;
    let tt = tiny.f32(9, &[1024], 0).build();
    assert!(!c.set_tensor_hash(&tt, 0, fnv1a64(&a)).await.unwrap());
    assert!(c.set_tensor_hash(&ta, 0, fnv1a64(&a)).await.unwrap());

    // The file is rewritten in place (same size) and its modification time put back: its
    // change time tells (the kernel sets it on every write and `utime`): "not found", the
    // client uploads.
    let b2 = pattern(len, 34);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = File::options().write(true).open(&model).unwrap();
        f.seek(SeekFrom::Start(offs[2])).unwrap();
        f.write_all(&b2).unwrap();
    }
    set_mtime(&model, t0);
    assert!(
        !c.set_tensor_hash(&whole, 4096, fnv1a64(&b)).await.unwrap(),
        "changed bytes are not served"
    );
    assert!(!c.set_tensor_hash(&whole, 4096, fnv1a64(&b2)).await.unwrap());
    // ... and the whole file is out of the index now (it is not what was indexed).
    assert!(!c.set_tensor_hash(&ta, 0, fnv1a64(&a)).await.unwrap());
    // The connection is fine: the client's upload goes through.
    c.set_tensor(&ta, 0, &a, false).await.unwrap();
    assert_eq!(c.get_tensor(&ta, 0, len as u64).await.unwrap(), a);

    // What --metrics says: three tensors served from the file, one known hash not served.
    let text = rpc_server::metrics::render(&rpc_server::metrics::Sources {
        stats: server.stats.clone(),
        rdma: std::sync::Arc::new(rpc_server::rdma::RdmaConfig::new(
            rpc_server::rdma::TransportMode::Tcp,
            Default::default(),
            1,
        )),
        config: server.config.clone(),
    });
    let sample = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_string()
    };
    assert_eq!(sample("rpc_gguf_hits_total"), "3");
    assert_eq!(sample("rpc_gguf_served_bytes_total"), (3 * len).to_string());
    assert_eq!(sample("rpc_gguf_failed_total"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_a_new_modification_time_is_dropped_before_reading() {
    let dir = TempDir::new("gguf-mtime");
    let model = dir.path().join("m.gguf");
    let len = (HASH_THRESHOLD + 32) as usize;
    let a = pattern(len, 41);
    write_gguf(&model, &[("a", &a)]);
    set_mtime(&model, SystemTime::now() - Duration::from_secs(60));
    let local = LocalWeights::build(std::slice::from_ref(&model), None, 1).unwrap();
    let server = TestServer::start_with_local(local);
    let mut c = connect(server.addr).await;
    let buf = alloc(&mut c, len as u64).await;
    let t = buf.f32(1, &[(len / 4) as u32], 0).build();
    assert!(c.set_tensor_hash(&t, 0, fnv1a64(&a)).await.unwrap());
    // Same bytes, new modification time (e.g. re-downloaded): dropped, not trusted.
    set_mtime(&model, SystemTime::now());
    assert!(!c.set_tensor_hash(&t, 0, fnv1a64(&a)).await.unwrap());
    // Truncated files are likewise never read past their end.
    std::fs::write(&model, b"GGUF").unwrap();
    assert!(!c.set_tensor_hash(&t, 0, fnv1a64(&a)).await.unwrap());
}
