//! CPU buffers ask Linux for transparent huge pages (`rpc-ggml/src/buffer.rs`): the mapping behind
//! a large buffer carries the `hg` flag (MADV_HUGEPAGE) by default and not with
//! `--no-huge-pages` (`use_huge_pages(false)`). Read from the kernel's own account of the mapping
//! (`/proc/self/smaps`), so the test holds whatever the machine's THP mode is.
#![cfg(target_os = "linux")]

use rpc_tests::*;

/// Bytes of this process's mappings that carry the `hg` flag (advised MADV_HUGEPAGE), from
/// `/proc/self/smaps`. (The server does not reveal real addresses: BUFFER_GET_BASE answers a
/// base of its own, so the test looks at the whole account.)
fn advised_bytes() -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("read /proc/self/smaps");
    let (mut total, mut size) = (0, 0);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) {
                size = hi - lo;
                continue;
            }
        }
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if flags.split_whitespace().any(|f| f == "hg") {
                total += size;
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_cpu_buffers_are_advised_huge_pages_unless_turned_off() {
    const SIZE: u64 = 16 << 20;
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        eprintln!("SKIPPED: this kernel has no transparent huge pages");
        return;
    }
    let s = TestServer::start();
    let mut c = connect(s.addr).await;

    let before = advised_bytes();
    alloc(&mut c, SIZE).await;
    let grown = advised_bytes() - before;
    // The 2 MiB-aligned interior: at least SIZE - 2 MiB, at most SIZE.
    assert!(
        (SIZE - (2 << 20)..=SIZE).contains(&grown),
        "default: a 16 MiB buffer adds its interior to the advised mappings, grew by {grown} bytes"
    );

    rpc_ggml::use_huge_pages(false);
    let before = advised_bytes();
    alloc(&mut c, SIZE).await;
    let grown = advised_bytes().saturating_sub(before);
    rpc_ggml::use_huge_pages(true);
    assert_eq!(
        grown, 0,
        "--no-huge-pages: nothing more advised MADV_HUGEPAGE"
    );
}
