//! The weight cache behind SET_TENSOR_HASH (`-c`): one file per FNV-1a 64 hash, named
//! `%016x`, in the stock server's directory layout, so a cache directory can be shared with it.
//!
//! Better than the stock cache: entries are written atomically (temp file + rename), verified
//! against their hash before first use (a corrupt entry is deleted, not served), read straight
//! into tensor memory, and the total size can be bounded (`--cache-max-size`), evicting the
//! least recently used entries (by access time, which a hit sets).
//!
//! Verified once: an entry this server wrote, or hashed on a hit, is recorded with its
//! [`Stamp`] (size, modification time, inode) in `verified-entries` beside the entries; a later
//! hit on an entry with the same stamp is read without hashing (FNV-1a costs more than the read).
//! `--verify-loads` hashes every hit.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

use rpc_proto::{fnv1a64, Fnv1a};

use crate::disk_read::{read_into, Destination, Stamp};

/// The record of verified entries, in the cache directory (not 16 hex digits: never an entry).
pub const VERIFIED_FILE: &str = "verified-entries";
const VERIFIED_MAGIC: &str = "rpc-server verified-entries 1";
/// Largest record read back (a line per entry).
const MAX_VERIFIED_BYTES: u64 = 16 << 20;

/// A directory of cached tensor payloads.
pub struct WeightCache {
    dir: PathBuf,
    max_size: Option<u64>,
    /// Serializes eviction scans; reads and writes are atomic file operations.
    evict_lock: Mutex<()>,
    counters: CacheCounters,
    /// Entries known to hash right while their stamp is unchanged (see the module comment).
    verified: Mutex<HashMap<u64, Stamp>>,
    /// `--verify-loads`: hash every hit.
    verify_always: bool,
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

fn verified_line(hash: u64, s: &Stamp) -> String {
    format!("{hash:016x}\t{}\t{}\t{}\n", s.len, s.mtime_ns, s.ino)
}

/// The verified-entries record of `dir`: the last line per entry whose file still has the
/// recorded stamp. Rewritten (atomically) when it holds many stale lines.
fn read_verified(dir: &Path) -> HashMap<u64, Stamp> {
    let path = dir.join(VERIFIED_FILE);
    let mut text = String::new();
    let read = File::open(&path).and_then(|f| f.take(MAX_VERIFIED_BYTES).read_to_string(&mut text));
    let mut map = HashMap::new();
    if read.is_err() {
        return map;
    }
    let mut lines = text.lines();
    if lines.next() != Some(VERIFIED_MAGIC) {
        return map;
    }
    let mut count = 0usize;
    for line in lines {
        count += 1;
        let f: Vec<&str> = line.split('\t').collect();
        let [h, len, mtime, ino] = f[..] else {
            continue;
        };
        let (Ok(h), Ok(len), Ok(mtime_ns), Ok(ino)) = (
            u64::from_str_radix(h, 16),
            len.parse(),
            mtime.parse(),
            ino.parse(),
        ) else {
            continue;
        };
        map.insert(h, Stamp { len, mtime_ns, ino });
    }
    map.retain(|h, s| {
        fs::metadata(dir.join(entry_name(*h))).is_ok_and(|m| m.is_file() && Stamp::of(&m) == *s)
    });
    if count > 2 * map.len() + 64 {
        let mut out = format!("{VERIFIED_MAGIC}\n");
        for (h, s) in &map {
            out.push_str(&verified_line(*h, s));
        }
        let tmp = dir.join(format!(".{VERIFIED_FILE}.tmp.{}", std::process::id()));
        if fs::write(&tmp, out)
            .and_then(|()| fs::rename(&tmp, &path))
            .is_err()
        {
            let _ = fs::remove_file(&tmp);
        }
    }
    map
}

impl WeightCache {
    /// Opens (creating it with its parents) the cache directory.
    pub fn open(dir: &Path, max_size: Option<u64>) -> std::io::Result<WeightCache> {
        fs::create_dir_all(dir)?;
        let verified = read_verified(dir);
        Ok(WeightCache {
            dir: dir.to_path_buf(),
            max_size,
            evict_lock: Mutex::new(()),
            counters: CacheCounters::default(),
            verified: Mutex::new(verified),
            verify_always: false,
        })
    }

    /// Hash every hit, not only an entry's first (`--verify-loads`).
    pub fn verify_every_load(mut self, on: bool) -> WeightCache {
        self.verify_always = on;
        self
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

    /// Reads the `len`-byte entry for `hash` into `dst[offset..offset+len]` (through staging
    /// chunks granted by `stage` when `dst` is not host memory). True when the region now holds
    /// the entry's bytes. An entry not verified before (or with `--verify-loads`) is hashed on
    /// the way, and one that does not hash to its name (truncated, corrupted) is deleted; on
    /// false the region may hold part of the bytes and the client must upload.
    pub fn load_into<G>(
        &self,
        hash: u64,
        len: u64,
        dst: &impl Destination,
        offset: u64,
        stage: impl FnOnce(u64) -> Option<G>,
    ) -> bool {
        let path = self.dir.join(entry_name(hash));
        let Ok(file) = File::open(&path) else {
            return false;
        };
        let Ok(meta) = file.metadata() else {
            return false;
        };
        if meta.len() != len {
            return false;
        }
        let stamp = Stamp::of(&meta);
        let trusted = !self.verify_always && self.lock_verified().get(&hash) == Some(&stamp);
        let mut h = Fnv1a::new();
        let hasher = (!trusted).then_some(&mut h);
        if let Err(e) = read_into(&file, 0, len, dst, offset, stage, hasher) {
            tracing::warn!(path = %path.display(), error = %e, "cannot read cache entry");
            return false;
        }
        if !trusted {
            if h.finish() != hash {
                tracing::warn!(path = %path.display(), "cache entry does not match its hash; deleting it");
                self.lock_verified().remove(&hash);
                let _ = fs::remove_file(&path);
                return false;
            }
            self.remember(hash, stamp);
        }
        // Mark as recently used for LRU eviction: the access time, so the stamp stays.
        let now = fs::FileTimes::new().set_accessed(SystemTime::now());
        let _ = file.set_times(now);
        true
    }

    fn lock_verified(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stamp>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that the entry for `hash` with `stamp` hashes right, here and in the record file
    /// (one appended line; concurrent session processes may each append).
    fn remember(&self, hash: u64, stamp: Stamp) {
        self.lock_verified().insert(hash, stamp);
        let path = self.dir.join(VERIFIED_FILE);
        let res = (|| {
            let mut f = File::options().create(true).append(true).open(&path)?;
            let mut line = String::new();
            if f.metadata()?.len() == 0 {
                line.push_str(VERIFIED_MAGIC);
                line.push('\n');
            }
            line.push_str(&verified_line(hash, &stamp));
            f.write_all(line.as_bytes())
        })();
        if let Err(e) = res {
            tracing::debug!(path = %path.display(), error = %e, "cannot record a verified cache entry");
        }
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
            let mut f = File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            f.metadata()
        })();
        match res {
            Ok(meta) => {
                self.remember(hash, Stamp::of(&meta));
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
                let used = m.accessed().or_else(|_| m.modified());
                Some((used.unwrap_or(SystemTime::UNIX_EPOCH), m.len(), e.path()))
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
    use crate::disk_read::test_util::VecDest;

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

    /// Loads the entry for `hash` (if any) through the staging path, as for device memory.
    fn load(c: &WeightCache, hash: u64) -> Option<Vec<u8>> {
        let len = c.entry_len(hash)?;
        let dst = VecDest::new(len as usize);
        c.load_into(hash, len, &dst, 0, |_| Some(()))
            .then(|| dst.bytes())
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
        assert_eq!(load(&c, h).unwrap(), data);
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
        assert!(load(&c, h).is_none());
        assert!(c.entry_len(h).is_none());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn verified_once_then_trusted_while_the_stamp_holds() {
        let d = tmpdir("verified");
        fs::create_dir_all(&d).unwrap();
        let data = vec![9u8; 4096];
        let h = fnv1a64(&data);
        let path = d.join(entry_name(h));
        // An entry another tool wrote (e.g. the stock server): not verified yet.
        fs::write(&path, &data).unwrap();
        let c = WeightCache::open(&d, None).unwrap();
        assert!(!c.lock_verified().contains_key(&h));
        assert_eq!(load(&c, h).unwrap(), data, "hashed on its first hit");
        assert!(c.lock_verified().contains_key(&h));
        // A restart reads the record back.
        let c2 = WeightCache::open(&d, None).unwrap();
        assert!(c2.lock_verified().contains_key(&h));
        // Same size, other bytes, another modification time: the stamp no longer holds, the
        // entry is hashed again, found corrupt and deleted.
        let t = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, vec![8u8; 4096]).unwrap();
        let later = t + std::time::Duration::from_secs(1);
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(load(&c2, h).is_none());
        assert!(!path.exists());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_forged_stamp_is_trusted_unless_every_load_is_verified() {
        let d = tmpdir("forged");
        let c = WeightCache::open(&d, None).unwrap();
        let data = vec![3u8; 4096];
        c.store(&data);
        let h = fnv1a64(&data);
        let path = d.join(entry_name(h));
        // Rewritten in place with the same size, its modification time put back by hand.
        let t = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, vec![4u8; 4096]).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(t)
            .unwrap();
        assert_eq!(
            load(&c, h).unwrap(),
            vec![4u8; 4096],
            "trusted by its stamp (the documented limit)"
        );
        let strict = WeightCache::open(&d, None).unwrap().verify_every_load(true);
        assert!(load(&strict, h).is_none(), "--verify-loads hashes the hit");
        assert!(!path.exists());
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
        assert!(load(&c, fnv1a64(&a)).is_some()); // a is now more recent than b
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
