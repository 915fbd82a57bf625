//! The weight cache behind SET_TENSOR_HASH (`-c`): one file per FNV-1a 64 hash, named
//! `%016x`, in the stock server's directory layout, so a cache directory can be shared with it.
//!
//! Better than the stock cache: entries are written atomically (temp file + rename), verified
//! against their hash before use (a corrupt entry is deleted, not served), and the total size can
//! be bounded (`--cache-max-size`), evicting the least recently used entries.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

use rpc_proto::fnv1a64;

/// A directory of cached tensor payloads.
pub struct WeightCache {
    dir: PathBuf,
    max_size: Option<u64>,
    /// Serializes eviction scans; reads and writes are atomic file operations.
    evict_lock: Mutex<()>,
    counters: CacheCounters,
}

/// What the cache did since start (for `--metrics`).
#[derive(Debug, Default)]
pub struct CacheCounters {
    /// SET_TENSOR_HASH answered from the cache, and the bytes written from it.
    pub hits: AtomicU64,
    pub bytes_served: AtomicU64,
    /// SET_TENSOR_HASH not found (or found corrupt): the client uploads.
    pub misses: AtomicU64,
    /// Entries written, and their bytes.
    pub stores: AtomicU64,
    pub bytes_stored: AtomicU64,
}

impl CacheCounters {
    /// Every counter, in a fixed order (reported by a session process, see `isolate.rs`).
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        [
            &self.hits,
            &self.bytes_served,
            &self.misses,
            &self.stores,
            &self.bytes_stored,
        ]
        .into_iter()
    }
}

/// The stock tool's cache directory (its `fs_get_cache_directory()` joined with `rpc`):
/// `$LLAMA_CACHE/rpc`; else on macOS `~/Library/Caches/llama.cpp/rpc` (`XDG_CACHE_HOME` is not
/// looked at there, as by the stock tool); elsewhere `$XDG_CACHE_HOME/llama.cpp/rpc`, else
/// `~/.cache/llama.cpp/rpc`.
pub fn default_cache_dir() -> Option<PathBuf> {
    cache_dir_for(cfg!(target_os = "macos"), |k| std::env::var_os(k))
}

/// [`default_cache_dir`] for either OS, from the environment `env` answers (testable anywhere).
fn cache_dir_for(macos: bool, env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("LLAMA_CACHE") {
        return Some(d.join("rpc"));
    }
    let base = if macos {
        var("HOME")?.join("Library/Caches")
    } else {
        match var("XDG_CACHE_HOME") {
            Some(x) => x,
            None => var("HOME")?.join(".cache"),
        }
    };
    Some(base.join("llama.cpp").join("rpc"))
}

fn entry_name(hash: u64) -> String {
    format!("{hash:016x}")
}

impl WeightCache {
    /// Opens (creating it with its parents) the cache directory.
    pub fn open(dir: &Path, max_size: Option<u64>) -> std::io::Result<WeightCache> {
        fs::create_dir_all(dir)?;
        Ok(WeightCache {
            dir: dir.to_path_buf(),
            max_size,
            evict_lock: Mutex::new(()),
            counters: CacheCounters::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_size(&self) -> Option<u64> {
        self.max_size
    }

    /// Size of the entry for `hash`, if there is one.
    pub fn entry_len(&self, hash: u64) -> Option<u64> {
        let m = fs::metadata(self.dir.join(entry_name(hash))).ok()?;
        m.is_file().then_some(m.len())
    }

    /// Counters since start.
    pub fn counters(&self) -> &CacheCounters {
        &self.counters
    }

    /// Counts a SET_TENSOR_HASH answered from the cache (`Some(bytes)`) or not (`None`).
    pub fn record_lookup(&self, served: Option<u64>) {
        match served {
            Some(n) => {
                self.counters.hits.fetch_add(1, Relaxed);
                self.counters.bytes_served.fetch_add(n, Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Relaxed);
            }
        }
    }

    /// Reads and verifies the entry for `hash`. A file whose content does not hash to its name
    /// (truncated, corrupted) is deleted and reported as missing.
    pub fn load(&self, hash: u64) -> Option<Vec<u8>> {
        let path = self.dir.join(entry_name(hash));
        let data = fs::read(&path).ok()?;
        if fnv1a64(&data) != hash {
            tracing::warn!(path = %path.display(), "cache entry does not match its hash; deleting it");
            let _ = fs::remove_file(&path);
            return None;
        }
        // Mark as recently used for LRU eviction.
        if let Ok(f) = fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(data)
    }

    /// Stores `data` under its hash, atomically. Errors (e.g. a full disk) are logged and leave
    /// no partial entry behind.
    pub fn store(&self, data: &[u8]) {
        let hash = fnv1a64(data);
        let path = self.dir.join(entry_name(hash));
        if path.exists() {
            return;
        }
        let tmp = self
            .dir
            .join(format!(".{}.tmp.{}", entry_name(hash), std::process::id()));
        let res = (|| {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        match res {
            Ok(()) => {
                tracing::info!(path = %path.display(), bytes = data.len(), "saved to cache");
                self.counters.stores.fetch_add(1, Relaxed);
                self.counters
                    .bytes_stored
                    .fetch_add(data.len() as u64, Relaxed);
                self.evict();
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                tracing::warn!(path = %path.display(), error = %e, "could not write cache entry");
            }
        }
    }

    /// Deletes least recently used entries until the cache fits `max_size`.
    fn evict(&self) {
        let Some(max) = self.max_size else { return };
        let _guard = self.evict_lock.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = rd
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit())
            })
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    e.path(),
                ))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort_by_key(|e| e.0);
        for (_, len, path) in entries {
            if total <= max {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "evicted from cache");
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_as_the_stock_tool_per_os() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let all = &[
            ("LLAMA_CACHE", "/lc"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        let no_llama = &[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")];
        let home_only = &[("HOME", "/home/u"), ("LLAMA_CACHE", "")];
        let p = |s: &str| Some(PathBuf::from(s));
        for macos in [false, true] {
            assert_eq!(cache_dir_for(macos, env(all)), p("/lc/rpc"));
        }
        assert_eq!(cache_dir_for(false, env(no_llama)), p("/xdg/llama.cpp/rpc"));
        assert_eq!(
            cache_dir_for(true, env(no_llama)),
            p("/home/u/Library/Caches/llama.cpp/rpc"),
            "macOS ignores XDG_CACHE_HOME"
        );
        assert_eq!(
            cache_dir_for(false, env(home_only)),
            p("/home/u/.cache/llama.cpp/rpc")
        );
        assert_eq!(
            cache_dir_for(true, env(home_only)),
            p("/home/u/Library/Caches/llama.cpp/rpc")
        );
        assert_eq!(cache_dir_for(false, env(&[])), None);
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rpc-cache-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn store_then_load_round_trips_and_names_by_fnv() {
        let d = tmpdir("rt");
        let c = WeightCache::open(&d, None).unwrap();
        let data = vec![7u8; 1000];
        c.store(&data);
        let h = fnv1a64(&data);
        assert!(d.join(format!("{h:016x}")).is_file());
        assert_eq!(c.entry_len(h), Some(1000));
        assert_eq!(c.load(h).unwrap(), data);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn corrupt_entry_is_deleted_not_served() {
        let d = tmpdir("corrupt");
        let c = WeightCache::open(&d, None).unwrap();
        let data = vec![1u8; 64];
        c.store(&data);
        let h = fnv1a64(&data);
        fs::write(d.join(format!("{h:016x}")), &data[..10]).unwrap(); // truncated, as after a full disk
        assert!(c.load(h).is_none());
        assert!(c.entry_len(h).is_none());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn lru_eviction_keeps_the_cache_under_its_limit() {
        let d = tmpdir("lru");
        let c = WeightCache::open(&d, Some(2500)).unwrap();
        let a = vec![1u8; 1000];
        let b = vec![2u8; 1000];
        let e = vec![3u8; 1000];
        c.store(&a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.store(&b);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(c.load(fnv1a64(&a)).is_some()); // a is now more recent than b
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.store(&e);
        assert!(c.entry_len(fnv1a64(&a)).is_some());
        assert!(
            c.entry_len(fnv1a64(&b)).is_none(),
            "least recently used entry evicted"
        );
        assert!(c.entry_len(fnv1a64(&e)).is_some());
        let _ = fs::remove_dir_all(&d);
    }
}
