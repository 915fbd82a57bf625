//! The stock llama.cpp tools the benchmarks drive: where they are ([`default_bin`]), and a run
//! through `link-emu`'s counting relay with the traffic it caused ([`through_relay`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rpc_proto::Major;

use crate::relay::{Relay, RelayOptions, Wire};
use crate::traffic::Traffic;

/// Default directory of the stock tools speaking `major` (`--bin`'s help), the newest TCP-only
/// build in the cache `$RPC_CACHE_DIR` (default `~/.cache/ggml-rpc-rs`) of each package.
pub fn default_bin(major: Major) -> PathBuf {
    let (var, package) = match major {
        Major::V7 => ("STOCK_BIN", "llama-cpp-python-0.3.36"),
        Major::V8 => ("STOCK_BIN8", "xllamacpp-2026.10.11549"),
    };
    if let Some(b) = std::env::var_os(var).filter(|b| !b.is_empty()) {
        return b.into();
    }
    let cache = std::env::var_os("RPC_CACHE_DIR")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/ggml-rpc-rs")
        });
    let root = cache.join(package);
    let newest = std::fs::read_dir(&root).ok().and_then(|rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("src-rdma-OFF"))
            .map(|e| e.path().join("build/bin"))
            .filter(|b| b.join("ggml-rpc-server").is_file())
            .max_by_key(|b| b.metadata().and_then(|m| m.modified()).ok())
    });
    newest.unwrap_or_else(|| root.join("src-rdma-OFF/build/bin"))
}

/// Runs `f` against one relay per server over `wire` (`f` gets the relays' addresses, in the
/// order of `servers`) and returns its result and the traffic it caused, summed over the relays;
/// with no `wire`, against the servers themselves (no traffic counted).
pub fn through_relay<T>(
    servers: &[SocketAddr],
    wire: Option<Wire>,
    f: impl FnOnce(&[SocketAddr]) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Traffic)> {
    let Some(wire) = wire else {
        return Ok((f(servers)?, Traffic::default()));
    };
    let relays = servers
        .iter()
        .map(|&s| Relay::start(s, wire, RelayOptions::default()))
        .collect::<Result<Vec<_>, _>>()?;
    let traffic = || {
        relays
            .iter()
            .fold(Traffic::default(), |t, r| t.plus(&r.counters().snapshot()))
    };
    let before = traffic();
    let out = f(&relays.iter().map(Relay::addr).collect::<Vec<_>>())?;
    // The client has exited; let the relay threads forward the last bytes.
    std::thread::sleep(Duration::from_millis(100));
    Ok((out, traffic().since(&before)))
}
