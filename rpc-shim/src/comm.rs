//! COMM_INIT through the shim (protocol 8.0.0, `split_mode tensor` over two workers).
//!
//! The stock 8.0 client tells both ranks where rank 0 listens: port = the port of rank 0's
//! `--rpc` endpoint + 1000, and to rank 1 also rank 0's host as the user spelled it. Through the
//! shim that endpoint is the shim's own listener (e.g. `127.0.0.1:50152`), so rank 0's worker
//! would listen on the shim's port + 1000 and rank 1's worker would dial the shim's host: neither
//! reaches the other. The shim knows which worker is behind each of its listeners, so it rewrites
//! the request to what the client would have sent had it named the workers directly: the port
//! becomes rank 0's worker port + 1000, and rank 1's host rank 0's worker host. A COMM_INIT whose
//! port names none of the shim's listeners is left as it is (rank 0 not behind this shim).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use rpc_proto::{CommInit, COMM_PORT_OFFSET};

/// Local listener port → the `host:port` of the worker behind it, for every running listener of
/// this process.
fn directory() -> &'static Mutex<HashMap<u16, String>> {
    static D: OnceLock<Mutex<HashMap<u16, String>>> = OnceLock::new();
    D.get_or_init(Mutex::default)
}

/// Records that `worker` is behind the listener on local port `port`.
pub(crate) fn register(port: u16, worker: &str) {
    directory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port, worker.to_string());
}

/// Forgets the listener on `port`.
pub(crate) fn unregister(port: u16) {
    directory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&port);
}

/// The worker behind the shim's listener on `port`.
pub(crate) fn worker_behind(port: u16) -> Option<String> {
    directory()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&port)
        .cloned()
}

/// Rewrites `init` for the workers (see the module docs): `lookup` gives the worker behind a
/// local listener port. `Ok(None)`: nothing to rewrite; `Ok(Some(text))`: rewritten, `text`
/// says how; `Err`: rank 0's worker address cannot be put in a COMM_INIT (not `host:port`, or a
/// host of 64 bytes or more).
pub fn rewrite(
    init: &mut CommInit,
    lookup: impl Fn(u16) -> Option<String>,
) -> Result<Option<String>, String> {
    let Some(listener) = init
        .port
        .checked_sub(u32::from(COMM_PORT_OFFSET))
        .and_then(|p| u16::try_from(p).ok())
    else {
        return Ok(None);
    };
    let Some(worker) = lookup(listener) else {
        return Ok(None);
    };
    let (host, port) = worker
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("worker address {worker} is not host:port"))?;
    // An IPv6 literal goes without its brackets, as a user would give it to the stock client.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let was = (init.host_str().unwrap_or("?").to_string(), init.port);
    init.port = u32::from(port) + u32::from(COMM_PORT_OFFSET);
    if init.rank != 0 || init.host_str() != Some("") {
        init.host = CommInit::host_field(host)
            .ok_or_else(|| format!("worker host {host} is too long for COMM_INIT"))?;
    }
    Ok(Some(format!(
        "rank {}: rank 0 at {}:{} (the shim's listener for {worker}) -> {}:{}",
        init.rank,
        was.0,
        was.1,
        init.host_str().unwrap_or("?"),
        init.port
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(rank: u32, host: &str, port: u32) -> CommInit {
        CommInit {
            device: 0,
            rank,
            world: 2,
            port,
            host: CommInit::host_field(host).unwrap(),
        }
    }

    /// `--rpc 127.0.0.1:50152,127.0.0.1:50153` through a shim whose listeners front
    /// 10.0.0.2:50052 and 10.0.0.3:50052: what each worker must get.
    #[test]
    fn ranks_get_the_real_rank0_address() {
        let lookup = |p: u16| match p {
            50152 => Some("10.0.0.2:50052".to_string()),
            50153 => Some("10.0.0.3:50052".to_string()),
            _ => None,
        };
        let mut r0 = init(0, "", 51152);
        assert!(rewrite(&mut r0, lookup).unwrap().is_some());
        assert_eq!(
            (r0.host_str(), r0.port),
            (Some(""), 51052),
            "rank 0 listens, no host"
        );
        let mut r1 = init(1, "127.0.0.1", 51152);
        let how = rewrite(&mut r1, lookup).unwrap().unwrap();
        assert_eq!((r1.host_str(), r1.port), (Some("10.0.0.2"), 51052));
        assert!(
            how.contains("127.0.0.1:51152") && how.contains("10.0.0.2:51052"),
            "{how}"
        );
        assert_eq!(
            (r1.device, r1.rank, r1.world),
            (0, 1, 2),
            "the rest is untouched"
        );
    }

    #[test]
    fn other_ports_and_bad_addresses() {
        // Rank 0 not behind this shim (or a port below 1000): unchanged.
        let none = |_: u16| None;
        let mut r = init(1, "10.0.0.9", 51000);
        assert_eq!(rewrite(&mut r, none), Ok(None));
        assert_eq!((r.host_str(), r.port), (Some("10.0.0.9"), 51000));
        let any = |_: u16| Some("h:1".to_string());
        let mut r = init(1, "x", 999);
        assert_eq!(rewrite(&mut r, any), Ok(None));
        let mut r = init(1, "x", u32::MAX);
        assert_eq!(rewrite(&mut r, any), Ok(None));
        // IPv6 workers: the literal without brackets.
        let v6 = |_: u16| Some("[fd00::2]:50052".to_string());
        let mut r = init(1, "::1", 51152);
        rewrite(&mut r, v6).unwrap();
        assert_eq!((r.host_str(), r.port), (Some("fd00::2"), 51052));
        // A host that does not fit the 64-byte field is an error, not a truncation.
        let long = |_: u16| Some(format!("{}:1", "h".repeat(64)));
        assert!(rewrite(&mut init(1, "x", 51152), long).is_err());
        let bad = |_: u16| Some("no-port".to_string());
        assert!(rewrite(&mut init(1, "x", 51152), bad).is_err());
    }

    #[test]
    fn directory_follows_listeners() {
        register(1, "w:5");
        assert_eq!(worker_behind(1).as_deref(), Some("w:5"));
        unregister(1);
        assert_eq!(worker_behind(1), None);
    }
}
