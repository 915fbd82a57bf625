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
//!
//! Who writes: only the process that opened the cache with [`WeightCache::open`] (the front, or
//! the one process of `--no-isolate`). A session process opens it with
//! [`WeightCache::open_read_only`] and hands every write to a [`CacheKeeper`] (the server's `FrontKeeper`: the
//! bytes of an upload go to the front in a sealed memfd, which the front hashes and stores under
//! the hash it computed; a verified or corrupt entry is only reported, and the front hashes the
//! file again before recording or deleting it). Every file is opened relative to the directory
//! handle opened once at start, never following a symbolic link, temp files created exclusively
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`), entries renamed into place without replacing one.
//!
//! Who reads (Linux): a session process reads no cache directory, whatever its mode. It runs
//! as a uid of its own, which a private (0700) directory does not let search, so it asks its
//! keeper (the front) for each entry it looks up ([`CacheKeeper::open`], `O <hash>` on the
//! control line): the front opens the entry, named by the hash (16 hex digits), read-only
//! relative to its directory handle (a regular file, never through a link) and passes the
//! descriptor down, saying whether it has that file recorded as verified
//! ([`WeightCache::open_for_session`]); the session reads no `verified-entries` of its own. On
//! macOS (one uid, a Seatbelt profile that allows reading the directory) a session still
//! opens the directory itself.
//!
//! `--trusted-weights-only` ([`WeightCache::trusted_only`]): nothing is stored, and only entries
//! whose status-change time is before the server's start (seeded by the operator) are served.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use rpc_proto::Fnv1a;
use rustix::fs::{AtFlags, Mode, OFlags};

use crate::disk_read::{ctime_ns, read_exact_at, read_into, Destination, Stamp};

/// The record of verified entries, in the cache directory (not 16 hex digits: never an entry).
pub const VERIFIED_FILE: &str = "verified-entries";
const VERIFIED_MAGIC: &str = "rpc-server verified-entries 1";
/// Largest record read back (a line per entry).
const MAX_VERIFIED_BYTES: u64 = 16 << 20;
/// The copy step of a store from a file (the front's buffer per store in flight).
const COPY_CHUNK: usize = 1 << 20;

/// Whoever writes the cache for a process that may not (a session process, whose front writes: the server's `FrontKeeper`).
pub trait CacheKeeper: Send + Sync {
    /// A client uploaded `data` with the cache flag: store it under the hash of its bytes.
    fn store(&self, data: &[u8]);
    /// This process hashed the entry for `hash` (and found it right or not): check it again
    /// and record it as verified, or delete it.
    fn check(&self, hash: u64);
    /// Opens the entry for `hash` for reading (a session process, which cannot read the
    /// directory: the front opens it). `None`: no such entry, or no answer.
    fn open(&self, hash: u64) -> Option<OpenedEntry>;
}

/// A cache entry opened read-only by the process that may read the directory (the front), for
/// one that may not (a session process: [`CacheKeeper::open`]).
#[derive(Debug)]
pub struct OpenedEntry {
    pub file: File,
    /// The opener has this file recorded as verified (hashing right with its current stamp).
    pub verified: bool,
}

/// Whether a read-only cache (a session process's) reads its entries through its keeper
/// rather than from the directory: on Linux, where a session runs as a uid of its own.
const ENTRIES_FROM_KEEPER: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// What [`WeightCache::check_entry`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// No such entry (or not a regular file).
    Missing,
    /// Already recorded with its current stamp: not hashed again.
    AlreadyVerified,
    /// Hashed right: recorded.
    Verified,
    /// Hashed wrong: deleted.
    Deleted,
}

/// A directory of cached tensor payloads.
pub struct WeightCache {
    dir: PathBuf,
    /// The directory, opened once: every file is opened relative to it.
    dirfd: OwnedFd,
    max_size: Option<u64>,
    /// Serializes eviction scans; reads and writes are atomic file operations.
    evict_lock: Mutex<()>,
    counters: CacheCounters,
    /// Entries known to hash right while their stamp is unchanged (see the module comment).
    verified: Mutex<HashMap<u64, Stamp>>,
    /// `--verify-loads`: hash every hit.
    verify_always: bool,
    /// `None`: this process writes the directory. `Some`: a session process, whose writes go to
    /// the keeper set by [`WeightCache::delegate`] (dropped until then).
    keeper: Option<OnceLock<Box<dyn CacheKeeper>>>,
    /// `--trusted-weights-only`: serve only entries whose status-change time (ns since the
    /// epoch) is before this, store nothing.
    seeded_before: Option<i128>,
    /// A session process on Linux: entries come from the keeper ([`CacheKeeper::open`]), and
    /// `dirfd` is a path handle that reads nothing.
    entries_from_keeper: bool,
    /// The entry [`WeightCache::entry_len`] last had opened by the keeper, for the
    /// [`WeightCache::load_into`] that follows it (one round trip per lookup).
    opened: Mutex<Option<(u64, OpenedEntry)>>,
}

impl std::fmt::Debug for WeightCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightCache")
            .field("dir", &self.dir)
            .field("writes", &self.keeper.is_none())
            .field("seeded_before", &self.seeded_before)
            .finish()
    }
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
    /// Every counter, in a fixed order (reported by a session process, see rpc-server's `child/front_line.rs`).
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

/// A directory, opened once for every file operation in it.
pub fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A handle on a directory that grants nothing (Linux: `O_PATH`, which needs no permission on
/// the directory itself); elsewhere, [`open_dir`].
fn path_handle(dir: &Path) -> io::Result<OwnedFd> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return Ok(rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    open_dir(dir)
}

/// Opens `name` in `dirfd` for reading, never through a symbolic link.
pub fn open_in(dirfd: &OwnedFd, name: &str) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dirfd,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// Creates a fresh temp file in `dirfd` (`O_CREAT|O_EXCL|O_NOFOLLOW`: never an existing file,
/// never through a link), named `.<stem>.tmp.<pid>.<random>`; returns it and its name.
pub fn create_temp_in(dirfd: &OwnedFd, stem: &str) -> io::Result<(File, String)> {
    let mut last = io::Error::other("no temp name");
    for _ in 0..8 {
        let name = format!(
            ".{stem}.tmp.{}.{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        match create_exclusive(dirfd, &name) {
            Ok(f) => return Ok((f, name)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Creates `name` in `dirfd` for writing, failing if anything (a file, a link) is there.
pub fn create_exclusive(dirfd: &OwnedFd, name: &str) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dirfd,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    Ok(File::from(fd))
}

/// Renames `from` to `to` in `dirfd`; with `replace` false, never over an existing `to`
/// (`EEXIST`).
pub fn rename_in(dirfd: &OwnedFd, from: &str, to: &str, replace: bool) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if !replace {
        return Ok(rustix::fs::renameat_with(
            dirfd,
            from,
            dirfd,
            to,
            rustix::fs::RenameFlags::NOREPLACE,
        )?);
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    if !replace && rustix::fs::statat(dirfd, to, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Err(io::ErrorKind::AlreadyExists.into());
    }
    Ok(rustix::fs::renameat(dirfd, from, dirfd, to)?)
}

/// Removes `name` from `dirfd` (a link itself, never its target).
pub fn unlink_in(dirfd: &OwnedFd, name: &str) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dirfd, name, AtFlags::empty())?)
}

/// Writes `bytes` as `name` in `dirfd`, atomically (an exclusive temp file, then a rename
/// that replaces the old file).
pub fn replace_in(dirfd: &OwnedFd, name: &str, bytes: &[u8]) -> io::Result<()> {
    let (mut f, tmp) = create_temp_in(dirfd, name)?;
    let res = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| rename_in(dirfd, &tmp, name, true));
    if res.is_err() {
        let _ = unlink_in(dirfd, &tmp);
    }
    res
}

/// The verified-entries record of `dir`: the last line per entry whose file still has the
/// recorded stamp. Rewritten (atomically) when it holds many stale lines and `compact`.
fn read_verified(dir: &Path, dirfd: &OwnedFd, compact: bool) -> HashMap<u64, Stamp> {
    let mut text = String::new();
    let read = open_in(dirfd, VERIFIED_FILE)
        .and_then(|f| f.take(MAX_VERIFIED_BYTES).read_to_string(&mut text));
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
        fs::symlink_metadata(dir.join(entry_name(*h)))
            .is_ok_and(|m| m.is_file() && Stamp::of(&m) == *s)
    });
    if compact && count > 2 * map.len() + 64 {
        let mut out = format!("{VERIFIED_MAGIC}\n");
        for (h, s) in &map {
            out.push_str(&verified_line(*h, s));
        }
        if let Err(e) = replace_in(dirfd, VERIFIED_FILE, out.as_bytes()) {
            tracing::debug!(error = %e, "cannot rewrite the verified-entries record");
        }
    }
    map
}

/// Where the bytes of a store come from.
enum Source<'a> {
    Bytes(&'a [u8]),
    /// `len` bytes of a file from offset 0 (the front: a session's sealed memfd).
    File(&'a File, u64),
}

impl WeightCache {
    /// Opens (creating it with its parents) the cache directory, for a process that writes it.
    pub fn open(dir: &Path, max_size: Option<u64>) -> io::Result<WeightCache> {
        fs::create_dir_all(dir)?;
        WeightCache::open_with(dir, max_size, true, None)
    }

    /// Opens the cache directory of a session process: read only; stores and verification
    /// records go to the [`CacheKeeper`] given to [`WeightCache::delegate`], and on Linux every
    /// entry is opened by it too: the directory is not read here (it may be private to the
    /// front's uid), and nothing is looked up before the keeper is set.
    pub fn open_read_only(dir: &Path, max_size: Option<u64>) -> io::Result<WeightCache> {
        WeightCache::open_with(dir, max_size, false, Some(OnceLock::new()))
    }

    /// The one constructor: the directory handle, its verified-entries record (`compact`: this
    /// process may rewrite it), and where stores go (`keeper`: `None` writes here).
    fn open_with(
        dir: &Path,
        max_size: Option<u64>,
        compact: bool,
        keeper: Option<OnceLock<Box<dyn CacheKeeper>>>,
    ) -> io::Result<WeightCache> {
        let entries_from_keeper = ENTRIES_FROM_KEEPER && keeper.is_some();
        let (dirfd, verified) = match entries_from_keeper {
            // A handle on the directory that grants nothing (no read, no lookup): it needs no
            // permission on the directory itself.
            true => (path_handle(dir)?, HashMap::new()),
            false => {
                let dirfd = open_dir(dir)?;
                let verified = read_verified(dir, &dirfd, compact);
                (dirfd, verified)
            }
        };
        Ok(WeightCache {
            dir: dir.to_path_buf(),
            dirfd,
            max_size,
            evict_lock: Mutex::new(()),
            counters: CacheCounters::default(),
            verified: Mutex::new(verified),
            verify_always: false,
            keeper,
            seeded_before: None,
            entries_from_keeper,
            opened: Mutex::new(None),
        })
    }

    /// A read-only cache's writer (a session process: the front). False if this cache writes
    /// itself or already has one.
    pub fn delegate(&self, keeper: Box<dyn CacheKeeper>) -> bool {
        self.keeper.as_ref().is_some_and(|k| k.set(keeper).is_ok())
    }

    /// Whether this process writes the directory itself.
    pub fn writes(&self) -> bool {
        self.keeper.is_none()
    }

    /// Hash every hit, not only an entry's first (`--verify-loads`).
    pub fn verify_every_load(mut self, on: bool) -> WeightCache {
        self.verify_always = on;
        self
    }

    /// `--trusted-weights-only`: store nothing; serve only entries whose status-change time is
    /// before `seeded_before_ns` (ns since the epoch: the server's start).
    pub fn trusted_only(mut self, seeded_before_ns: i128) -> WeightCache {
        self.seeded_before = Some(seeded_before_ns);
        self
    }

    /// The `--trusted-weights-only` bound, if set.
    pub fn seeded_before(&self) -> Option<i128> {
        self.seeded_before
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn max_size(&self) -> Option<u64> {
        self.max_size
    }

    /// Whether an entry with this metadata may be served (`--trusted-weights-only`: seeded).
    fn servable(&self, m: &fs::Metadata) -> bool {
        m.is_file() && self.seeded_before.is_none_or(|t| ctime_ns(m) < t)
    }

    /// Size of the entry for `hash`, if there is one (a regular file, not a link). A session
    /// on Linux has the keeper open it, and keeps it for the [`WeightCache::load_into`] after.
    pub fn entry_len(&self, hash: u64) -> Option<u64> {
        if self.entries_from_keeper {
            let e = self.keeper_open(hash)?;
            let m = e.file.metadata().ok()?;
            if !self.servable(&m) {
                return None;
            }
            *self.lock_opened() = Some((hash, e));
            return Some(m.len());
        }
        let m = fs::symlink_metadata(self.dir.join(entry_name(hash))).ok()?;
        self.servable(&m).then_some(m.len())
    }

    /// The entry for `hash` opened by the keeper (a session process on Linux).
    fn keeper_open(&self, hash: u64) -> Option<OpenedEntry> {
        self.keeper.as_ref()?.get()?.open(hash)
    }

    fn lock_opened(&self) -> std::sync::MutexGuard<'_, Option<(u64, OpenedEntry)>> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The front: opens the entry for `hash` for a session process, which cannot read the
    /// directory (`O` on the control line). Only a name of the entries' form (the hash's 16
    /// hex digits), relative to the directory handle, read-only, never through a link, never
    /// blocking, and only a regular file that may be served; `verified` when it is recorded
    /// with this file's stamp. Marked as used for eviction, as a hit here marks it.
    pub fn open_for_session(&self, hash: u64) -> Option<OpenedEntry> {
        if self.keeper.is_some() {
            return None;
        }
        let name = entry_name(hash);
        // Not even opened unless it is a regular file (a device node's open may act).
        let st = rustix::fs::statat(&self.dirfd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return None;
        }
        let fd = rustix::fs::openat(
            &self.dirfd,
            name.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let file = File::from(fd);
        let meta = file.metadata().ok()?;
        if !self.servable(&meta) {
            return None;
        }
        let verified = self.lock_verified().get(&hash) == Some(&Stamp::of(&meta));
        if self.seeded_before.is_none() {
            let now = fs::FileTimes::new().set_accessed(SystemTime::now());
            let _ = file.set_times(now);
        }
        Some(OpenedEntry { file, verified })
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
    /// the way, and one that does not hash to its name (truncated, corrupted) is not served and
    /// deleted (by the writer, which hashes it again); on false the region may hold part of the
    /// bytes and the client must upload.
    pub fn load_into<G>(
        &self,
        hash: u64,
        len: u64,
        dst: &mut impl Destination,
        offset: u64,
        stage: impl FnOnce(u64) -> Option<G>,
    ) -> bool {
        let name = entry_name(hash);
        // A session on Linux: the entry its keeper opened (for `entry_len`, or now).
        let (file, opener_verified) = match self.entries_from_keeper {
            true => {
                let kept = self.lock_opened().take().filter(|(h, _)| *h == hash);
                match kept.map(|(_, e)| e).or_else(|| self.keeper_open(hash)) {
                    Some(e) => (e.file, e.verified),
                    None => return false,
                }
            }
            false => match open_in(&self.dirfd, &name) {
                Ok(f) => (f, false),
                Err(_) => return false,
            },
        };
        let Ok(meta) = file.metadata() else {
            return false;
        };
        if meta.len() != len || !self.servable(&meta) {
            return false;
        }
        let stamp = Stamp::of(&meta);
        let trusted = !self.verify_always
            && (opener_verified || self.lock_verified().get(&hash) == Some(&stamp));
        let mut h = Fnv1a::new();
        let hasher = (!trusted).then_some(&mut h);
        if let Err(e) = read_into(&file, 0, len, dst, offset, stage, hasher) {
            tracing::warn!(path = %self.dir.join(&name).display(), error = %e, "cannot read cache entry");
            return false;
        }
        if !trusted {
            let right = h.finish() == hash;
            match &self.keeper {
                None if right => self.remember(hash, stamp),
                None => {
                    tracing::warn!(path = %self.dir.join(&name).display(), "cache entry does not match its hash; deleting it");
                    self.lock_verified().remove(&hash);
                    self.delete_if_unchanged(&name, &stamp);
                }
                Some(k) => {
                    if right {
                        self.lock_verified().insert(hash, stamp);
                    } else {
                        tracing::warn!(path = %self.dir.join(&name).display(), "cache entry does not match its hash; not served");
                        self.lock_verified().remove(&hash);
                    }
                    if let Some(k) = k.get() {
                        k.check(hash);
                    }
                }
            }
            if !right {
                return false;
            }
        }
        // Mark as recently used for LRU eviction: the access time, so the stamp stays. (Not
        // with --trusted-weights-only: it would move the status-change time past the start.
        // Not by a session that had the entry opened for it: the opener marked it.)
        if self.seeded_before.is_none() && !self.entries_from_keeper {
            let now = fs::FileTimes::new().set_accessed(SystemTime::now());
            let _ = file.set_times(now);
        }
        true
    }

    fn lock_verified(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stamp>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes entry `name` if it is still the file with `stamp` (not one stored since).
    fn delete_if_unchanged(&self, name: &str, stamp: &Stamp) {
        let same = fs::symlink_metadata(self.dir.join(name))
            .is_ok_and(|m| m.is_file() && Stamp::of(&m) == *stamp);
        if same {
            let _ = unlink_in(&self.dirfd, name);
        }
    }

    /// Records that the entry for `hash` with `stamp` hashes right, here and in the record file
    /// (one appended line).
    fn remember(&self, hash: u64, stamp: Stamp) {
        self.lock_verified().insert(hash, stamp);
        let res = (|| {
            let fd = rustix::fs::openat(
                &self.dirfd,
                VERIFIED_FILE,
                OFlags::WRONLY
                    | OFlags::APPEND
                    | OFlags::CREATE
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )?;
            let mut f = File::from(fd);
            if !f.metadata()?.is_file() {
                return Err(io::Error::other("not a regular file"));
            }
            let mut line = String::new();
            if f.metadata()?.len() == 0 {
                line.push_str(VERIFIED_MAGIC);
                line.push('\n');
            }
            line.push_str(&verified_line(hash, &stamp));
            f.write_all(line.as_bytes())
        })();
        if let Err(e) = res {
            tracing::debug!(dir = %self.dir.display(), error = %e, "cannot record a verified cache entry");
        }
    }

    /// Stores `data` under its hash, atomically: here, or through the keeper of a session
    /// process. Errors (e.g. a full disk) are logged and leave no partial entry behind. Nothing
    /// is stored with `--trusted-weights-only`.
    pub fn store(&self, data: &[u8]) {
        if self.seeded_before.is_some() {
            return;
        }
        match &self.keeper {
            None => {
                let _ = self.write_entry(Source::Bytes(data));
            }
            Some(k) => match k.get() {
                Some(k) => k.store(data),
                None => tracing::debug!("no cache writer yet; upload not stored"),
            },
        }
    }

    /// The front: stores the first `len` bytes of `file` (a session's sealed memfd) under the
    /// hash of the bytes read, which is returned (`None`: not stored).
    pub fn store_file(&self, file: &File, len: u64) -> Option<u64> {
        if self.seeded_before.is_some() || self.keeper.is_some() {
            return None;
        }
        self.write_entry(Source::File(file, len))
    }

    /// Copies the bytes to an exclusive temp file, hashing them on the way, and renames it to
    /// the hash's entry unless that exists. The entry's name is the hash of the bytes written.
    fn write_entry(&self, src: Source<'_>) -> Option<u64> {
        let (mut f, tmp) = match create_temp_in(&self.dirfd, "store") {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not write cache entry");
                return None;
            }
        };
        let mut h = Fnv1a::new();
        let res = (|| -> io::Result<u64> {
            match src {
                Source::Bytes(data) => {
                    for c in data.chunks(crate::disk_read::CHUNK) {
                        h.update(c);
                        f.write_all(c)?;
                    }
                    Ok(data.len() as u64)
                }
                Source::File(src, len) => {
                    let mut buf = vec![0u8; COPY_CHUNK.min(usize::try_from(len).unwrap_or(0))];
                    let mut pos = 0u64;
                    while pos < len {
                        let k = usize::try_from(len - pos).map_or(buf.len(), |r| r.min(buf.len()));
                        let b = &mut buf[..k];
                        read_exact_at(src, b, pos)?;
                        h.update(b);
                        f.write_all(b)?;
                        pos += k as u64;
                    }
                    Ok(len)
                }
            }
        })()
        .and_then(|n| f.sync_all().map(|()| n));
        let hash = h.finish();
        let name = entry_name(hash);
        let res = res.and_then(|n| match rename_in(&self.dirfd, &tmp, &name, false) {
            Ok(()) => f.metadata().map(|m| Some((n, m))),
            // Already there (the same bytes, or bytes with the same FNV-1a): kept as it is.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        });
        match res {
            Ok(Some((n, meta))) => {
                self.remember(hash, Stamp::of(&meta));
                tracing::info!(path = %self.dir.join(&name).display(), bytes = n, "saved to cache");
                self.counters.stores.fetch_add(1, Relaxed);
                self.counters.bytes_stored.fetch_add(n, Relaxed);
                self.evict();
                Some(hash)
            }
            Ok(None) => {
                let _ = unlink_in(&self.dirfd, &tmp);
                Some(hash)
            }
            Err(e) => {
                let _ = unlink_in(&self.dirfd, &tmp);
                tracing::warn!(path = %self.dir.join(&name).display(), error = %e, "could not write cache entry");
                None
            }
        }
    }

    /// The writer's answer to a session's report on the entry for `hash`: hashes the file
    /// itself, then records it as verified or deletes it. An entry already recorded with its
    /// current stamp is not hashed again.
    pub fn check_entry(&self, hash: u64) -> Checked {
        if self.keeper.is_some() {
            return Checked::Missing;
        }
        let name = entry_name(hash);
        let Ok(file) = open_in(&self.dirfd, &name) else {
            return Checked::Missing;
        };
        let Ok(meta) = file.metadata() else {
            return Checked::Missing;
        };
        if !meta.is_file() {
            return Checked::Missing;
        }
        let stamp = Stamp::of(&meta);
        if self.lock_verified().get(&hash) == Some(&stamp) {
            return Checked::AlreadyVerified;
        }
        let mut h = Fnv1a::new();
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut pos = 0u64;
        while pos < stamp.len {
            let k = usize::try_from(stamp.len - pos).map_or(buf.len(), |r| r.min(buf.len()));
            if read_exact_at(&file, &mut buf[..k], pos).is_err() {
                return Checked::Missing;
            }
            h.update(&buf[..k]);
            pos += k as u64;
        }
        if h.finish() == hash {
            self.remember(hash, stamp);
            Checked::Verified
        } else {
            tracing::warn!(path = %self.dir.join(&name).display(), "cache entry does not match its hash; deleting it");
            self.lock_verified().remove(&hash);
            self.delete_if_unchanged(&name, &stamp);
            Checked::Deleted
        }
    }

    /// The front: a fresh anonymous file of `len` bytes that a session process writes a store
    /// into (a memfd on Linux, sealed against growing; elsewhere an unlinked exclusive temp file
    /// in the cache directory). Not sealed against shrinking: the front empties it when the
    /// store is done ([`WeightCache::revoke_staging`]), so that a session that keeps its
    /// descriptor keeps no memory.
    pub fn staging_file(&self, len: u64) -> io::Result<File> {
        #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
        {
            use rustix::fs::{MemfdFlags, SealFlags};
            let fd = rustix::fs::memfd_create(
                "rpc-cache-store",
                MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
            )?;
            rustix::fs::ftruncate(&fd, len)?;
            rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW)?;
            Ok(File::from(fd))
        }
        #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
        {
            let mut last = io::Error::other("no temp name");
            for _ in 0..8 {
                let name = format!(
                    ".staging.tmp.{}.{:016x}",
                    std::process::id(),
                    rand::random::<u64>()
                );
                match rustix::fs::openat(
                    &self.dirfd,
                    name.as_str(),
                    OFlags::RDWR
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                ) {
                    Ok(fd) => {
                        let _ = unlink_in(&self.dirfd, &name);
                        rustix::fs::ftruncate(&fd, len)?;
                        return Ok(File::from(fd));
                    }
                    Err(e) => last = e.into(),
                }
            }
            Err(last)
        }
    }

    /// The front, once the session says its store is written: no more writes to `file`
    /// (`F_SEAL_WRITE`, which fails while a writable shared mapping of it exists: the store is
    /// then refused) and no more seals (`F_SEAL_SEAL`), so that nothing can keep the front from
    /// emptying it later. A file someone sealed against shrinking (only a session that means to
    /// keep the memory does) is `PermissionDenied`. Elsewhere than Linux there is no seal; the
    /// copy is hashed as it is read, so the entry still holds the bytes its name is the hash of.
    pub fn seal_staging(file: &File) -> io::Result<()> {
        #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
        {
            use rustix::fs::SealFlags;
            let write = rustix::fs::fcntl_add_seals(file, SealFlags::WRITE);
            let _ = rustix::fs::fcntl_add_seals(file, SealFlags::SEAL);
            // After F_SEAL_SEAL (ours, or the session's) the seals cannot change any more.
            let seals = rustix::fs::fcntl_get_seals(file)?;
            if seals.contains(SealFlags::SHRINK) || !seals.contains(SealFlags::SEAL) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the staging file was sealed against shrinking",
                ));
            }
            Ok(write?)
        }
        #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
        {
            let _ = file;
            Ok(())
        }
    }

    /// The front, when a store is done (stored or refused): empties the staging file, which
    /// frees its memory whatever the session does with its descriptor (a mapping of it loses
    /// its pages; it cannot grow again).
    pub fn revoke_staging(file: &File) -> io::Result<()> {
        rustix::fs::ftruncate(file, 0)?;
        Ok(())
    }

    /// Deletes least recently used entries until the cache fits `max_size`.
    fn evict(&self) {
        let Some(max) = self.max_size else { return };
        let _guard = self.evict_lock.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, String)> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                (n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit())).then_some(n)
            })
            .filter_map(|n| {
                let m = fs::symlink_metadata(self.dir.join(&n)).ok()?;
                let used = m.accessed().or_else(|_| m.modified());
                Some((used.unwrap_or(SystemTime::UNIX_EPOCH), m.len(), n))
            })
            .collect();
        let mut total: u64 = entries.iter().map(|e| e.1).sum();
        entries.sort_by_key(|e| e.0);
        for (_, len, name) in entries {
            if total <= max {
                break;
            }
            if unlink_in(&self.dirfd, &name).is_ok() {
                tracing::info!(path = %self.dir.join(&name).display(), "evicted from cache");
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk_read::test_util::VecDest;
    use rpc_proto::fnv1a64;

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
        let mut dst = VecDest::new(len as usize);
        c.load_into(hash, len, &mut dst, 0, |_| Some(()))
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
    /// A keeper that records what a read-only cache handed it, and opens entries as the front
    /// does (through `front`, a writer of the same directory).
    #[derive(Default)]
    struct Recorder {
        stored: Mutex<Vec<Vec<u8>>>,
        checked: Mutex<Vec<u64>>,
        opened: Mutex<Vec<u64>>,
        front: OnceLock<WeightCache>,
    }

    impl CacheKeeper for std::sync::Arc<Recorder> {
        fn store(&self, data: &[u8]) {
            self.stored.lock().unwrap().push(data.to_vec());
        }
        fn check(&self, hash: u64) {
            self.checked.lock().unwrap().push(hash);
        }
        fn open(&self, hash: u64) -> Option<OpenedEntry> {
            self.opened.lock().unwrap().push(hash);
            self.front.get()?.open_for_session(hash)
        }
    }

    #[test]
    fn a_read_only_cache_hands_every_write_to_its_keeper() {
        let d = tmpdir("readonly");
        fs::create_dir_all(&d).unwrap();
        let good = vec![5u8; 4096];
        let h = fnv1a64(&good);
        fs::write(d.join(entry_name(h)), &good).unwrap();
        let bad_h = fnv1a64(b"something else");
        fs::write(d.join(entry_name(bad_h)), vec![6u8; 100]).unwrap();
        let c = WeightCache::open_read_only(&d, None).unwrap();
        assert!(!c.writes());
        let rec = std::sync::Arc::new(Recorder::default());
        assert!(rec.front.set(WeightCache::open(&d, None).unwrap()).is_ok());
        assert!(c.delegate(Box::new(rec.clone())));
        assert!(!c.delegate(Box::new(rec.clone())), "one keeper");
        c.store(&[1, 2, 3]);
        assert_eq!(*rec.stored.lock().unwrap(), vec![vec![1u8, 2, 3]]);
        assert_eq!(load(&c, h).unwrap(), good);
        assert!(load(&c, bad_h).is_none(), "a corrupt entry is not served");
        assert!(
            d.join(entry_name(bad_h)).exists(),
            "nor deleted by a session"
        );
        assert_eq!(*rec.checked.lock().unwrap(), vec![h, bad_h]);
        assert!(
            !d.join(VERIFIED_FILE).exists(),
            "a session records nothing on disk"
        );
        let names: Vec<_> = fs::read_dir(&d).unwrap().collect();
        assert_eq!(names.len(), 2, "nothing written: {names:?}");
        // On Linux every entry was opened by the keeper (the front): one lookup each.
        if ENTRIES_FROM_KEEPER {
            assert_eq!(*rec.opened.lock().unwrap(), vec![h, bad_h]);
        }
        // The writer checks again before recording or deleting.
        let w = rec.front.get().unwrap();
        assert_eq!(w.check_entry(h), Checked::Verified);
        assert_eq!(w.check_entry(h), Checked::AlreadyVerified);
        assert_eq!(w.check_entry(bad_h), Checked::Deleted);
        assert!(!d.join(entry_name(bad_h)).exists());
        assert_eq!(w.check_entry(bad_h), Checked::Missing);
        // A new session is told the entry is verified (Linux) or reads the record (macOS): it
        // does not hash it again, so it reports nothing.
        let c2 = WeightCache::open_read_only(&d, None).unwrap();
        assert!(c2.delegate(Box::new(rec.clone())));
        assert_eq!(load(&c2, h).unwrap(), good);
        assert_eq!(
            *rec.checked.lock().unwrap(),
            vec![h, bad_h],
            "not hashed again"
        );
        assert!(load(&c2, bad_h).is_none(), "deleted: not found");
        let _ = fs::remove_dir_all(&d);
    }

    /// The front opens an entry for a session only as a regular file of the entries' form,
    /// never through a link, and says whether its stamp is recorded as verified.
    #[test]
    fn the_front_opens_only_regular_entries_for_a_session() {
        let d = tmpdir("open-for-session");
        let outside = tmpdir("open-for-session-outside");
        fs::create_dir_all(&d).unwrap();
        fs::create_dir_all(&outside).unwrap();
        let w = WeightCache::open(&d, None).unwrap();
        let data = vec![2u8; 2048];
        w.store(&data);
        let h = fnv1a64(&data);
        let e = w.open_for_session(h).expect("a stored entry");
        assert!(e.verified, "stored here: recorded");
        assert_eq!(e.file.metadata().unwrap().len(), 2048);
        assert!(
            std::io::Write::write_all(&mut &e.file, b"x").is_err(),
            "read-only"
        );
        // Another tool's entry: opened, to be hashed.
        let other = vec![3u8; 100];
        let ho = fnv1a64(&other);
        fs::write(d.join(entry_name(ho)), &other).unwrap();
        assert!(!w.open_for_session(ho).unwrap().verified);
        // A link, a directory, a FIFO at an entry's name: nothing opened (and nothing blocks).
        fs::write(outside.join("victim"), b"secret").unwrap();
        let (hl, hd, hf) = (1u64, 2u64, 3u64);
        std::os::unix::fs::symlink(outside.join("victim"), d.join(entry_name(hl))).unwrap();
        fs::create_dir(d.join(entry_name(hd))).unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(d.join(entry_name(hf)))
            .status();
        assert!(fifo.is_ok_and(|s| s.success()), "mkfifo");
        for x in [hl, hd, hf, 4] {
            assert!(w.open_for_session(x).is_none(), "{x:016x}");
        }
        // A session's cache never opens for itself.
        let r = WeightCache::open_read_only(&d, None).unwrap();
        assert!(r.open_for_session(h).is_none());
        let _ = fs::remove_dir_all(&d);
        let _ = fs::remove_dir_all(&outside);
    }

    #[test]
    fn a_store_from_a_sealed_staging_file_is_named_by_the_bytes() {
        let d = tmpdir("staging");
        let c = WeightCache::open(&d, None).unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let f = c.staging_file(data.len() as u64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &data, 0).unwrap();
        WeightCache::seal_staging(&f).unwrap();
        #[cfg(target_os = "linux")]
        {
            assert!(
                std::os::unix::fs::FileExt::write_all_at(&f, b"x", 0).is_err(),
                "sealed against writes"
            );
            assert!(
                f.set_len(data.len() as u64 + 1).is_err(),
                "sealed against growing"
            );
        }
        let h = c.store_file(&f, data.len() as u64).unwrap();
        assert_eq!(h, fnv1a64(&data));
        assert_eq!(load(&c, h).unwrap(), data);
        assert_eq!(c.counters().stores.load(Relaxed), 1);
        // The same bytes again: kept as they are, no temp file left behind.
        assert_eq!(c.store_file(&f, data.len() as u64), Some(h));
        let left: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        let _ = fs::remove_dir_all(&d);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_staging_file_that_cannot_be_sealed_is_refused() {
        // A session that sealed the seals (or kept a writable shared mapping: EBUSY) leaves the
        // front unable to add F_SEAL_WRITE, and the front then refuses the store.
        let d = tmpdir("seal");
        let c = WeightCache::open(&d, None).unwrap();
        let f = c.staging_file(16).unwrap();
        rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SEAL).unwrap();
        assert!(WeightCache::seal_staging(&f).is_err(), "sealing refused");
        // Emptied all the same: its memory goes back.
        WeightCache::revoke_staging(&f).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        // One sealed against shrinking cannot be emptied: refused as a session that keeps it.
        let f = c.staging_file(16).unwrap();
        rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK).unwrap();
        let e = WeightCache::seal_staging(&f).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn links_planted_in_the_cache_are_never_followed() {
        let d = tmpdir("links");
        let outside = tmpdir("links-outside");
        fs::create_dir_all(&d).unwrap();
        fs::create_dir_all(&outside).unwrap();
        let target = outside.join("victim");
        fs::write(&target, b"precious").unwrap();
        let data = vec![4u8; 256];
        let h = fnv1a64(&data);
        // At an entry's name, at the record's name, at a temp file's name.
        std::os::unix::fs::symlink(&target, d.join(entry_name(h))).unwrap();
        std::os::unix::fs::symlink(&target, d.join(VERIFIED_FILE)).unwrap();
        std::os::unix::fs::symlink(&target, d.join(".planted.tmp")).unwrap();
        let c = WeightCache::open(&d, None).unwrap();
        assert_eq!(c.entry_len(h), None, "a link is no entry");
        let mut dst = VecDest::new(8);
        assert!(!c.load_into(h, 8, &mut dst, 0, |_| Some(())));
        c.store(&data);
        assert_eq!(c.check_entry(h), Checked::Missing);
        let dirfd = open_dir(&d).unwrap();
        assert!(create_exclusive(&dirfd, ".planted.tmp").is_err());
        assert!(replace_in(&dirfd, "other", b"x").is_ok());
        assert_eq!(
            fs::read(&target).unwrap(),
            b"precious",
            "the target is untouched"
        );
        assert!(fs::symlink_metadata(d.join(entry_name(h)))
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = fs::remove_dir_all(&d);
        let _ = fs::remove_dir_all(&outside);
    }

    #[test]
    fn trusted_only_stores_nothing_and_serves_only_seeded_entries() {
        let d = tmpdir("trusted");
        fs::create_dir_all(&d).unwrap();
        let seeded = vec![1u8; 512];
        let hs = fnv1a64(&seeded);
        fs::write(d.join(entry_name(hs)), &seeded).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let start = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        std::thread::sleep(std::time::Duration::from_millis(20));
        let later = vec![2u8; 512];
        let hl = fnv1a64(&later);
        fs::write(d.join(entry_name(hl)), &later).unwrap();
        let c = WeightCache::open(&d, None).unwrap().trusted_only(start);
        assert_eq!(load(&c, hs).unwrap(), seeded, "seeded before the start");
        assert_eq!(load(&c, hs).unwrap(), seeded, "still seeded after a hit");
        assert_eq!(c.entry_len(hl), None, "written after the start");
        let up = vec![3u8; 512];
        c.store(&up);
        assert!(
            !d.join(entry_name(fnv1a64(&up))).exists(),
            "no upload stored"
        );
        let _ = fs::remove_dir_all(&d);
    }
}
