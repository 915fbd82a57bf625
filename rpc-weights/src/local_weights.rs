//! Weights from the worker's own disk (`--gguf PATH`): an index of the tensors of local GGUF
//! files by the FNV-1a 64 hash a stock client sends in SET_TENSOR_HASH, and the reading of a hit
//! straight from the file into tensor memory, so the client skips the upload.
//!
//! What a client hashes: `ggml_backend_rpc_buffer_set_tensor` sends SET_TENSOR_HASH for every
//! `ggml_backend_tensor_set` of more than 10 MiB into a weights buffer, hashing exactly the bytes
//! it passes; llama.cpp's model loader passes whole tensors (offset 0, `ggml_nbytes`), straight
//! from the file (mmap or read, never repacked for an RPC buffer). So the index holds one hash
//! per tensor of more than [`HASH_THRESHOLD`] bytes, over its data range in the file.
//!
//! The files are opened at start and kept open (positioned reads, shared by the sessions): a
//! sandboxed session process may not open files, and a file replaced under its name keeps
//! serving the inode that was indexed. Hashing runs at start on parallel threads; the result is persisted (`gguf-index` in the
//! cache directory) keyed by path, size and modification time, so a restart rehashes only files
//! that changed. Serving is safe against files changing underneath: the size, modification
//! time and (within one run) change time are checked before each use, and a changed file is
//! dropped from the index, so the client uploads. An unchanged file's bytes are not hashed again
//! (they were at indexing; FNV-1a costs more than the read, see `disk_read`); with
//! `--verify-loads` every read must hash to the requested value.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use rpc_proto::Fnv1a;

use crate::disk_read::{ctime_ns, mtime_ns, read_into, Destination, CHUNK};
use crate::gguf;

/// The client asks SET_TENSOR_HASH only for writes of more than this (upstream `HASH_THRESHOLD`).
pub const HASH_THRESHOLD: u64 = 10 << 20;
/// File name of the persisted index, in the cache directory.
pub const INDEX_FILE: &str = "gguf-index";
const INDEX_MAGIC: &str = "rpc-server gguf-index 1";
/// Largest persisted index read back (it holds a line per tensor over 10 MiB).
const MAX_INDEX_BYTES: u64 = 64 << 20;
/// How deep directories given to `--gguf` are searched for `*.gguf`.
const MAX_DEPTH: u32 = 8;

/// Why the local weights could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LocalWeightsError {
    #[error("--gguf {path}: {source}")]
    Path { path: PathBuf, source: io::Error },
    #[error("--gguf {0}: no *.gguf file there")]
    Empty(PathBuf),
}

/// One indexed tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    offset: u64,
    len: u64,
    hash: u64,
    name: String,
}

/// One local GGUF file as it was when indexed.
#[derive(Debug)]
struct LocalFile {
    path: PathBuf,
    /// Opened at start and kept: reads need no `open` later (a sandboxed session process may
    /// not open files), and a file replaced under its name keeps serving the indexed inode,
    /// checked like any (its size and modification time, then the hash of the bytes).
    file: File,
    size: u64,
    mtime_ns: u128,
    entries: Vec<Entry>,
    /// Change time when opened: any later write or `utime` changes it (unlike the
    /// modification time, it cannot be set back by hand).
    ctime_ns: i128,
    /// Set when the file changed since it was indexed: its entries are no longer served.
    dropped: AtomicBool,
}

/// What [`LocalWeights`] did since start (for `--metrics` and logs).
#[derive(Debug, Default)]
pub struct LocalCounters {
    /// SET_TENSOR_HASH answered from a local file, and the bytes read for them.
    pub hits: AtomicU64,
    pub bytes_served: AtomicU64,
    /// Hash known but not served (file changed, read error, bytes no longer hash right).
    pub failed: AtomicU64,
}

impl LocalCounters {
    /// Every counter, in one fixed order (a session process reports them to the front).
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        [&self.hits, &self.bytes_served, &self.failed].into_iter()
    }
}

/// How the index was built.
#[derive(Debug, Clone, Default)]
pub struct IndexSummary {
    pub files: usize,
    /// Tensors over the threshold, and their bytes.
    pub tensors: usize,
    pub bytes: u64,
    /// Files hashed at this start (the others came from the persisted index), and the bytes.
    pub files_hashed: usize,
    pub bytes_hashed: u64,
    pub threads: usize,
    pub seconds: f64,
    pub index_path: Option<PathBuf>,
}

/// The index of local GGUF tensors by content hash.
#[derive(Debug)]
pub struct LocalWeights {
    files: Vec<LocalFile>,
    /// hash → (file, entry) for every indexed tensor with that hash.
    by_hash: HashMap<u64, Vec<(usize, usize)>>,
    index_path: Option<PathBuf>,
    /// The index's directory, opened once (the index is read and written relative to it, never
    /// through a link), and whether this process writes it (the front; a session process only
    /// reads it).
    index_dir: Option<std::os::fd::OwnedFd>,
    writes_index: bool,
    /// What the persisted index had for files not given this time (kept when it is rewritten).
    others: Vec<SavedFile>,
    save_lock: Mutex<()>,
    counters: LocalCounters,
    summary: IndexSummary,
    /// `--verify-loads`: hash every read.
    verify_always: bool,
}

impl LocalWeights {
    /// Indexes the GGUF files at `paths` (files or directories), reusing what the persisted
    /// index at `index_path` has for unchanged files and saving the result there. `threads`
    /// hash in parallel. Unreadable or malformed files are skipped with a warning; a path that
    /// does not exist, or a directory without any GGUF file, is an error.
    pub fn build(
        paths: &[PathBuf],
        index_path: Option<PathBuf>,
        threads: usize,
    ) -> Result<LocalWeights, LocalWeightsError> {
        Self::build_with(paths, index_path, Some(threads))
    }

    /// [`LocalWeights::build`] without hashing: only files the persisted index has, unchanged,
    /// are served. For a session process (`--isolate`): the front process hashed and saved the
    /// index at start; a session must not rehash a model per connection.
    pub fn from_index(
        paths: &[PathBuf],
        index_path: Option<PathBuf>,
    ) -> Result<LocalWeights, LocalWeightsError> {
        Self::build_with(paths, index_path, None)
    }

    fn build_with(
        paths: &[PathBuf],
        index_path: Option<PathBuf>,
        threads: Option<usize>,
    ) -> Result<LocalWeights, LocalWeightsError> {
        let t0 = Instant::now();
        let found = collect_files(paths)?;
        let index_dir = index_path.as_deref().and_then(|p| {
            let d = p.parent()?;
            if threads.is_some() {
                if let Err(e) = fs::create_dir_all(d) {
                    tracing::warn!(path = %d.display(), error = %e, "cannot create the GGUF index's directory");
                }
            }
            crate::cache::open_dir(d).ok()
        });
        let saved = match (&index_dir, index_path.as_deref()) {
            (Some(d), Some(p)) => load_index(d, p),
            _ => Vec::new(),
        };
        let mut files = Vec::new();
        // (file, entry) still to hash
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        for path in found {
            let opened = File::open(&path).and_then(|f| Ok((f.metadata()?, f)));
            let (meta, file) = match opened {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "skipping GGUF file");
                    continue;
                }
            };
            let (size, mtime) = (meta.len(), mtime_ns(&meta));
            let reused = saved
                .iter()
                .find(|f| f.path == path && f.size == size && f.mtime_ns == mtime && mtime != 0);
            if let Some(f) = reused {
                files.push(LocalFile {
                    path,
                    file,
                    size,
                    mtime_ns: mtime,
                    ctime_ns: ctime_ns(&meta),
                    entries: f.entries.clone(),
                    dropped: AtomicBool::new(false),
                });
                continue;
            }
            if threads.is_none() {
                tracing::info!(path = %path.display(), "GGUF file not in the index (changed?); not served");
                continue;
            }
            let header = match gguf::read_header(&path) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "skipping GGUF file");
                    continue;
                }
            };
            let entries: Vec<Entry> = header
                .tensors
                .into_iter()
                .filter(|t| t.len > HASH_THRESHOLD)
                .map(|t| Entry {
                    offset: t.offset,
                    len: t.len,
                    hash: 0,
                    name: t.name,
                })
                .collect();
            jobs.extend((0..entries.len()).map(|e| (files.len(), e)));
            files.push(LocalFile {
                path,
                file,
                size,
                mtime_ns: mtime,
                ctime_ns: ctime_ns(&meta),
                entries,
                dropped: AtomicBool::new(false),
            });
        }
        let files_hashed = {
            let set: BTreeSet<usize> = jobs.iter().map(|j| j.0).collect();
            set.len()
        };
        let bytes_hashed: u64 = jobs.iter().map(|&(f, e)| files[f].entries[e].len).sum();
        let writes_index = threads.is_some();
        let threads = threads.unwrap_or(1).clamp(1, jobs.len().max(1));
        let failed = hash_all(&mut files, &mut jobs, threads, bytes_hashed);
        // A file with a tensor that could not be read is not indexed at all.
        for f in failed {
            files[f].entries.clear();
            files[f].dropped.store(true, Relaxed);
        }
        let mut by_hash: HashMap<u64, Vec<(usize, usize)>> = HashMap::new();
        for (fi, f) in files.iter().enumerate() {
            for (ei, e) in f.entries.iter().enumerate() {
                by_hash.entry(e.hash).or_default().push((fi, ei));
            }
        }
        let live = || files.iter().filter(|f| !f.dropped.load(Relaxed));
        let summary = IndexSummary {
            files: live().count(),
            tensors: live().map(|f| f.entries.len()).sum(),
            bytes: live().flat_map(|f| &f.entries).map(|e| e.len).sum(),
            files_hashed,
            bytes_hashed,
            threads,
            seconds: t0.elapsed().as_secs_f64(),
            index_path: index_path.clone(),
        };
        let others: Vec<SavedFile> = saved
            .into_iter()
            .filter(|o| !files.iter().any(|f| f.path == o.path))
            .collect();
        let lw = LocalWeights {
            files,
            by_hash,
            index_path,
            index_dir,
            writes_index,
            others,
            save_lock: Mutex::new(()),
            counters: LocalCounters::default(),
            summary,
            verify_always: false,
        };
        if files_hashed > 0 {
            lw.save();
        }
        Ok(lw)
    }

    /// Hash every read, not only at indexing (`--verify-loads`).
    pub fn verify_every_load(mut self, on: bool) -> LocalWeights {
        self.verify_always = on;
        self
    }

    /// How the index was built.
    pub fn summary(&self) -> &IndexSummary {
        &self.summary
    }

    /// Counters since start.
    pub fn counters(&self) -> &LocalCounters {
        &self.counters
    }

    /// Size of the tensor with content `hash`, if a live file has one.
    pub fn entry_len(&self, hash: u64) -> Option<u64> {
        self.by_hash.get(&hash)?.iter().find_map(|&(f, e)| {
            let f = &self.files[f];
            (!f.dropped.load(Relaxed)).then(|| f.entries[e].len)
        })
    }

    /// Reads the `len`-byte tensor with content `hash` from its local file into
    /// `buf[offset..offset+len]`: directly into host memory, through staging chunks of at most
    /// 8 MiB for device memory (`stage(n)` must grant them: it returns a guard held while the
    /// staging buffer lives, e.g. a memory-budget charge). True when the file is unchanged
    /// since indexing (and, with `--verify-loads`, the bytes read hash to `hash`); otherwise the
    /// region may hold partial data and the caller must answer "not found" (the client then
    /// uploads the tensor over it).
    pub fn load_into<G>(
        &self,
        hash: u64,
        len: u64,
        dst: &mut impl Destination,
        offset: u64,
        stage: impl FnOnce(u64) -> Option<G>,
    ) -> bool {
        let Some(locs) = self.by_hash.get(&hash) else {
            return false;
        };
        let Some(&(fi, ei)) = locs.iter().find(|&&(f, e)| {
            !self.files[f].dropped.load(Relaxed) && self.files[f].entries[e].len == len
        }) else {
            return false;
        };
        let f = &self.files[fi];
        let e = &f.entries[ei];
        let ok = match self.read_verified(fi, e, dst, offset, stage) {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(path = %f.path.display(), tensor = %e.name,
                    "local GGUF tensor no longer matches its hash; dropping the file from the index");
                self.drop_file(fi);
                false
            }
            Err(err) => {
                tracing::warn!(path = %f.path.display(), tensor = %e.name, error = %err,
                    "cannot read local GGUF tensor; the client uploads it");
                false
            }
        };
        if ok {
            self.counters.hits.fetch_add(1, Relaxed);
            self.counters.bytes_served.fetch_add(len, Relaxed);
            tracing::debug!(path = %f.path.display(), tensor = %e.name, bytes = len,
                "SET_TENSOR_HASH served from a local GGUF file");
        } else {
            self.counters.failed.fetch_add(1, Relaxed);
        }
        ok
    }

    fn read_verified<G>(
        &self,
        fi: usize,
        e: &Entry,
        dst: &mut impl Destination,
        offset: u64,
        stage: impl FnOnce(u64) -> Option<G>,
    ) -> io::Result<bool> {
        let f = &self.files[fi];
        let meta = f.file.metadata()?;
        if meta.len() != f.size || mtime_ns(&meta) != f.mtime_ns || ctime_ns(&meta) != f.ctime_ns {
            tracing::warn!(path = %f.path.display(),
                "local GGUF file changed since it was indexed; dropping it from the index (restart to re-index)");
            self.drop_file(fi);
            return Err(io::Error::other("file changed since it was indexed"));
        }
        if !self.verify_always {
            // Hashed at indexing, and the file is unchanged since.
            read_into(&f.file, e.offset, e.len, dst, offset, stage, None)?;
            return Ok(true);
        }
        let mut h = Fnv1a::new();
        read_into(&f.file, e.offset, e.len, dst, offset, stage, Some(&mut h))?;
        Ok(h.finish() == e.hash)
    }

    /// Stops serving file `fi` and removes it from the persisted index.
    fn drop_file(&self, fi: usize) {
        let Some(f) = self.files.get(fi) else { return };
        if !f.dropped.swap(true, Relaxed) {
            self.save();
        }
    }

    /// Writes the persisted index (atomically): the live files, and what an earlier run indexed
    /// for files not given this time, where they still exist unchanged.
    fn save(&self) {
        let (Some(path), Some(dir), true) = (&self.index_path, &self.index_dir, self.writes_index)
        else {
            return;
        };
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return;
        };
        let _g = self.save_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        out.push_str(INDEX_MAGIC);
        out.push('\n');
        let mut write = |p: &Path, size: u64, mtime: u128, entries: &[Entry]| {
            let Some(ps) = p.to_str().filter(|s| !s.contains(['\t', '\n', '\r'])) else {
                return;
            };
            out.push_str(&format!("F\t{size}\t{mtime}\t{ps}\n"));
            for e in entries {
                let name: String = e
                    .name
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                out.push_str(&format!(
                    "T\t{}\t{}\t{:016x}\t{name}\n",
                    e.offset, e.len, e.hash
                ));
            }
        };
        for f in self.files.iter().filter(|f| !f.dropped.load(Relaxed)) {
            write(&f.path, f.size, f.mtime_ns, &f.entries);
        }
        for o in &self.others {
            let unchanged = fs::metadata(&o.path)
                .map(|m| m.len() == o.size && mtime_ns(&m) == o.mtime_ns)
                .unwrap_or(false);
            if unchanged {
                write(&o.path, o.size, o.mtime_ns, &o.entries);
            }
        }
        // An exclusive temp file beside it, renamed over it (a link there is replaced, never
        // followed).
        if let Err(e) = crate::cache::replace_in(dir, name, out.as_bytes()) {
            tracing::warn!(path = %path.display(), error = %e, "cannot save the GGUF index");
        }
    }
}

/// Hashes the entries named by `jobs` (largest first) on `threads` threads, logging progress
/// every 2 s. Returns the files of which a tensor could not be read.
fn hash_all(
    files: &mut [LocalFile],
    jobs: &mut [(usize, usize)],
    threads: usize,
    total: u64,
) -> BTreeSet<usize> {
    if jobs.is_empty() {
        return BTreeSet::new();
    }
    jobs.sort_by_key(|&(f, e)| std::cmp::Reverse(files[f].entries[e].len));
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let results: Mutex<Vec<(usize, usize, io::Result<u64>)>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    tracing::info!(
        tensors = jobs.len(),
        mib = total >> 20,
        threads,
        "hashing local GGUF tensors"
    );
    {
        let files = &*files;
        let jobs = &*jobs;
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<()>();
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, done, results) = (&next, &done, &results);
                s.spawn(move || {
                    let _alive = tx;
                    loop {
                        let i = next.fetch_add(1, Relaxed);
                        let Some(&(f, e)) = jobs.get(i) else { break };
                        let ent = &files[f].entries[e];
                        let r = hash_range(&files[f].path, ent.offset, ent.len, done);
                        results
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((f, e, r));
                    }
                });
            }
            drop(tx);
            while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(2))
            {
                let d = done.load(Relaxed);
                tracing::info!(
                    "hashing local GGUF tensors: {}% ({} of {} MiB, {:.0} MiB/s)",
                    d * 100 / total.max(1),
                    d >> 20,
                    total >> 20,
                    (d as f64 / 1048576.0) / t0.elapsed().as_secs_f64()
                );
            }
        });
    }
    let mut failed = BTreeSet::new();
    for (f, e, r) in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        match r {
            Ok(h) => files[f].entries[e].hash = h,
            Err(err) => {
                tracing::warn!(path = %files[f].path.display(), error = %err,
                    "cannot read a tensor; skipping the file");
                failed.insert(f);
            }
        }
    }
    tracing::info!(
        "hashed {} MiB of local GGUF tensors in {:.1} s",
        total >> 20,
        t0.elapsed().as_secs_f64()
    );
    failed
}

/// FNV-1a 64 of `len` bytes at `offset` of the file at `path`.
fn hash_range(path: &Path, offset: u64, len: u64, done: &AtomicU64) -> io::Result<u64> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut h = Fnv1a::new();
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(len).unwrap_or(CHUNK))];
    let mut left = len;
    while left > 0 {
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        f.read_exact(&mut buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
        done.fetch_add(n as u64, Relaxed);
    }
    Ok(h.finish())
}

/// The GGUF files named by `paths`: files as given (with the other parts of a split model),
/// directories searched for `*.gguf`. Canonical paths, each once, sorted.
fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LocalWeightsError> {
    let mut out = BTreeSet::new();
    for p in paths {
        let err = |source| LocalWeightsError::Path {
            path: p.clone(),
            source,
        };
        let meta = fs::metadata(p).map_err(err)?;
        let before = out.len();
        if meta.is_dir() {
            walk(p, 0, &mut out);
        } else {
            out.insert(fs::canonicalize(p).map_err(err)?);
            for s in split_siblings(p) {
                if let Ok(c) = fs::canonicalize(&s) {
                    out.insert(c);
                }
            }
        }
        if out.len() == before && meta.is_dir() {
            return Err(LocalWeightsError::Empty(p.clone()));
        }
    }
    Ok(out.into_iter().collect())
}

fn is_gguf(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

fn walk(dir: &Path, depth: u32, out: &mut BTreeSet<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else {
        tracing::warn!(path = %dir.display(), "cannot read directory");
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        // Symlinked directories are not followed (no loops); symlinked files are.
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            if depth < MAX_DEPTH {
                walk(&p, depth + 1, out);
            }
        } else if is_gguf(&p) && fs::metadata(&p).is_ok_and(|m| m.is_file()) {
            if let Ok(c) = fs::canonicalize(&p) {
                out.insert(c);
            }
        }
    }
}

/// The other parts of a split model named as llama.cpp names them,
/// `<prefix>-<i:05>-of-<n:05>.gguf`; empty for any other name.
fn split_siblings(p: &Path) -> Vec<PathBuf> {
    let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    let Some(stem) = name.strip_suffix(".gguf") else {
        return Vec::new();
    };
    // "<prefix>-00001-of-00003"
    let Some((rest, n)) = stem.rsplit_once("-of-") else {
        return Vec::new();
    };
    let Some((prefix, i)) = rest.rsplit_once('-') else {
        return Vec::new();
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(i) || !digits(n) {
        return Vec::new();
    }
    let Ok(count) = n.parse::<u32>() else {
        return Vec::new();
    };
    (1..=count)
        .map(|k| p.with_file_name(format!("{prefix}-{k:05}-of-{count:05}.gguf")))
        .filter(|s| s != p && s.is_file())
        .collect()
}

/// A file as the persisted index has it.
#[derive(Debug, Clone)]
struct SavedFile {
    path: PathBuf,
    size: u64,
    mtime_ns: u128,
    entries: Vec<Entry>,
}

/// Reads the persisted index; anything unreadable or malformed counts as empty (files are
/// then rehashed).
fn load_index(dir: &std::os::fd::OwnedFd, path: &Path) -> Vec<SavedFile> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    let Ok(f) = crate::cache::open_in(dir, name) else {
        return Vec::new();
    };
    let mut text = String::new();
    if f.take(MAX_INDEX_BYTES).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    match parse_index(&text) {
        Some(v) => v,
        None => {
            tracing::warn!(path = %path.display(), "ignoring a malformed GGUF index (rehashing)");
            Vec::new()
        }
    }
}

fn parse_index(text: &str) -> Option<Vec<SavedFile>> {
    let mut lines = text.lines();
    if lines.next()? != INDEX_MAGIC {
        return None;
    }
    let mut files: Vec<SavedFile> = Vec::new();
    for line in lines {
        let mut it = line.splitn(5, '\t');
        match it.next()? {
            "F" => {
                let size = it.next()?.parse().ok()?;
                let mtime_ns = it.next()?.parse().ok()?;
                let path = PathBuf::from(it.next()?);
                files.push(SavedFile {
                    path,
                    size,
                    mtime_ns,
                    entries: Vec::new(),
                });
            }
            "T" => {
                let f = files.last_mut()?;
                let offset: u64 = it.next()?.parse().ok()?;
                let len: u64 = it.next()?.parse().ok()?;
                let hash = u64::from_str_radix(it.next()?, 16).ok()?;
                let name = it.next().unwrap_or("").to_string();
                // Entries must lie inside the file they describe.
                if offset.checked_add(len)? > f.size {
                    return None;
                }
                f.entries.push(Entry {
                    offset,
                    len,
                    hash,
                    name,
                });
            }
            _ => return None,
        }
    }
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::write_test_file;
    use rpc_proto::{fnv1a64, ggml_type};
    use std::time::SystemTime;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rpc-gguf-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// A tensor of `n` f32 values just over the hash threshold, filled from `seed`.
    fn big(seed: u8) -> Vec<u8> {
        let n = (HASH_THRESHOLD as usize + 4096) / 4 * 4;
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    fn model(path: &Path, tensors: &[(&str, &[u8])]) {
        let t: Vec<(&str, u32, [u64; 4], &[u8])> = tensors
            .iter()
            .map(|(n, d)| (*n, ggml_type::F32, [(d.len() / 4) as u64, 1, 1, 1], *d))
            .collect();
        write_test_file(path, &[("general.architecture", "llama")], &t);
    }

    #[test]
    fn indexes_tensors_over_the_threshold_by_fnv_and_persists() {
        let d = tmpdir("index");
        let (a, b) = (big(1), big(2));
        let small = vec![5u8; 4096];
        model(
            &d.join("m.gguf"),
            &[("a", &a), ("small", &small), ("b", &b)],
        );
        fs::write(d.join("notes.txt"), b"not a model").unwrap();
        let idx = d.join("cache").join(INDEX_FILE);
        let lw = LocalWeights::build(std::slice::from_ref(&d), Some(idx.clone()), 2).unwrap();
        let s = lw.summary();
        assert_eq!((s.files, s.tensors, s.files_hashed), (1, 2, 1));
        assert_eq!(lw.entry_len(fnv1a64(&a)), Some(a.len() as u64));
        assert_eq!(lw.entry_len(fnv1a64(&b)), Some(b.len() as u64));
        assert_eq!(lw.entry_len(fnv1a64(&small)), None, "under the threshold");
        assert!(idx.is_file());
        // A restart reuses the persisted index (nothing hashed).
        let lw2 = LocalWeights::build(&[d.join("m.gguf")], Some(idx.clone()), 2).unwrap();
        assert_eq!(lw2.summary().files_hashed, 0);
        assert_eq!(lw2.entry_len(fnv1a64(&a)), Some(a.len() as u64));
        // A session process only reads the index.
        let lw2 = LocalWeights::from_index(&[d.join("m.gguf")], Some(idx.clone())).unwrap();
        assert_eq!(lw2.entry_len(fnv1a64(&b)), Some(b.len() as u64));
        // A changed file (size or mtime) is rehashed.
        let c = big(3);
        model(&d.join("m.gguf"), &[("a", &c), ("b", &b)]);
        // Same size: only the modification time tells (set apart, whatever the fs granularity).
        let f = File::options().write(true).open(d.join("m.gguf")).unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        drop(f);
        let lw3 = LocalWeights::build(&[d.join("m.gguf")], Some(idx), 2).unwrap();
        assert_eq!(lw3.summary().files_hashed, 1);
        assert_eq!(lw3.entry_len(fnv1a64(&a)), None);
        assert_eq!(lw3.entry_len(fnv1a64(&c)), Some(c.len() as u64));
        // Without an index entry a session process serves nothing from it (never rehashes).
        let lw4 = LocalWeights::from_index(&[d.join("m.gguf")], None).unwrap();
        assert_eq!((lw4.summary().files, lw4.summary().files_hashed), (0, 0));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_link_planted_at_the_index_is_never_followed() {
        let d = tmpdir("link");
        let outside = tmpdir("link-outside");
        fs::create_dir_all(&outside).unwrap();
        let target = outside.join("victim");
        fs::write(&target, b"precious").unwrap();
        let a = big(9);
        model(&d.join("m.gguf"), &[("a", &a)]);
        let cache = d.join("cache");
        fs::create_dir_all(&cache).unwrap();
        let idx = cache.join(INDEX_FILE);
        std::os::unix::fs::symlink(&target, &idx).unwrap();
        let lw = LocalWeights::build(std::slice::from_ref(&d), Some(idx.clone()), 1).unwrap();
        assert_eq!(lw.entry_len(fnv1a64(&a)), Some(a.len() as u64));
        assert_eq!(
            fs::read(&target).unwrap(),
            b"precious",
            "the target is untouched"
        );
        assert!(
            fs::symlink_metadata(&idx).unwrap().is_file(),
            "the link was replaced"
        );
        // A session process reads the index and writes nothing, even for a dropped file.
        let before = fs::read(&idx).unwrap();
        let lw2 = LocalWeights::from_index(&[d.join("m.gguf")], Some(idx.clone())).unwrap();
        assert_eq!(lw2.entry_len(fnv1a64(&a)), Some(a.len() as u64));
        lw2.drop_file(0);
        assert_eq!(fs::read(&idx).unwrap(), before);
        let _ = fs::remove_dir_all(&d);
        let _ = fs::remove_dir_all(&outside);
    }

    #[test]
    fn rewriting_the_index_keeps_other_files() {
        let d = tmpdir("others");
        let (a, b) = (big(6), big(7));
        model(&d.join("one.gguf"), &[("a", &a)]);
        model(&d.join("two.gguf"), &[("b", &b)]);
        let idx = d.join(INDEX_FILE);
        LocalWeights::build(std::slice::from_ref(&d), Some(idx.clone()), 2).unwrap();
        // A run with only the first file, changed: rehashed and saved; the second stays indexed.
        let f = File::options()
            .write(true)
            .open(d.join("one.gguf"))
            .unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        drop(f);
        let lw = LocalWeights::build(&[d.join("one.gguf")], Some(idx.clone()), 1).unwrap();
        assert_eq!(lw.summary().files_hashed, 1);
        let two = LocalWeights::from_index(&[d.join("two.gguf")], Some(idx)).unwrap();
        assert_eq!(two.entry_len(fnv1a64(&b)), Some(b.len() as u64));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn split_models_and_bad_files() {
        let d = tmpdir("split");
        let (a, b) = (big(4), big(5));
        model(&d.join("x-00001-of-00002.gguf"), &[("a", &a)]);
        model(&d.join("x-00002-of-00002.gguf"), &[("b", &b)]);
        fs::write(d.join("broken.gguf"), b"GGUF\x03\0\0\0garbage").unwrap();
        // Naming the first part brings in the second.
        let lw = LocalWeights::build(&[d.join("x-00001-of-00002.gguf")], None, 1).unwrap();
        assert_eq!(lw.summary().files, 2);
        assert!(lw.entry_len(fnv1a64(&b)).is_some());
        // A directory with a malformed file: that file is skipped, the others indexed.
        let lw = LocalWeights::build(std::slice::from_ref(&d), None, 2).unwrap();
        assert_eq!(lw.summary().files, 2);
        assert!(matches!(
            LocalWeights::build(&[d.join("nope.gguf")], None, 1),
            Err(LocalWeightsError::Path { .. })
        ));
        let empty = tmpdir("empty");
        assert!(matches!(
            LocalWeights::build(std::slice::from_ref(&empty), None, 1),
            Err(LocalWeightsError::Empty(_))
        ));
        let _ = fs::remove_dir_all(&d);
        let _ = fs::remove_dir_all(&empty);
    }

    #[test]
    fn malformed_persisted_index_is_ignored() {
        assert!(parse_index("junk").is_none());
        assert!(parse_index(&format!("{INDEX_MAGIC}\nT\t0\t1\tff\tx\n")).is_none());
        assert!(parse_index(&format!("{INDEX_MAGIC}\nF\t10\t5\t/x\nT\t8\t4\tff\tx\n")).is_none());
        let ok = parse_index(&format!("{INDEX_MAGIC}\nF\t10\t5\t/x y\nT\t2\t4\tff\tx\n")).unwrap();
        assert_eq!(ok[0].path, PathBuf::from("/x y"));
        assert_eq!(ok[0].entries[0].hash, 0xff);
    }

    #[test]
    fn split_names() {
        let d = tmpdir("names");
        for k in 1..=3 {
            fs::write(d.join(format!("m-{k:05}-of-00003.gguf")), b"").unwrap();
        }
        assert_eq!(split_siblings(&d.join("m-00002-of-00003.gguf")).len(), 2);
        assert!(split_siblings(&d.join("m.gguf")).is_empty());
        assert!(split_siblings(&d.join("m-2-of-3.gguf")).is_empty());
        let _ = fs::remove_dir_all(&d);
    }
}
