//! `RDMA_VERBS_SYMBOLS=apple`: the verbs library is loaded with exactly the 17 entry points of
//! upstream's Apple transport, the rest absent (as on a macOS `librdma.dylib` that lacks them),
//! while the full set resolves more. Each case runs in a child process (the library is loaded
//! once per process). Skipped where no verbs library is installed.

use std::process::Command;

fn child(test: &str, symbols: Option<&str>) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("RV_SYMBOL_SET_CHILD", "1")
        .env_remove(rdma_verbs::SYMBOLS_ENV);
    if let Some(s) = symbols {
        c.env(rdma_verbs::SYMBOLS_ENV, s);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn in_child() -> bool {
    std::env::var_os("RV_SYMBOL_SET_CHILD").is_some()
}

#[test]
fn loaded_symbol_count() {
    if !in_child() {
        return; // only meaningful as a child of the cases below
    }
    match rdma_verbs::load() {
        Ok(()) => println!(
            "set={:?} symbols={}",
            rdma_verbs::symbol_set(),
            rdma_verbs::symbols_loaded()
        ),
        Err(e) => println!("no-library {e}"),
    }
}

fn count(out: &str) -> Option<usize> {
    out.lines()
        .find_map(|l| l.split("symbols=").nth(1))
        .and_then(|n| n.trim().parse().ok())
}

#[test]
fn the_apple_set_loads_only_upstreams_17_entry_points() {
    if in_child() {
        return;
    }
    let (ok, apple) = child("loaded_symbol_count", Some("apple"));
    assert!(ok, "{apple}");
    if apple.contains("no-library") || !rdma_verbs::built_with_verbs() {
        eprintln!("no verbs library here; skipped: {apple}");
        return;
    }
    assert!(apple.contains("set=Apple"), "{apple}");
    assert_eq!(
        count(&apple),
        Some(rdma_verbs::SymbolSet::APPLE.len()),
        "{apple}"
    );
    let (ok, full) = child("loaded_symbol_count", None);
    assert!(ok, "{full}");
    if cfg!(target_os = "linux") {
        assert!(full.contains("set=Full"), "{full}");
        let n = count(&full).unwrap_or(0);
        assert!(
            n > rdma_verbs::SymbolSet::APPLE.len(),
            "the full set resolves the completion channel and ibv_query_qp too: {full}"
        );
    }
}
