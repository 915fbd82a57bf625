//! One byte range of a file into tensor memory, for the two places SET_TENSOR_HASH is answered
//! from disk: the weight cache (`-c`) and local GGUF files (`--gguf`).
//!
//! The bytes go straight into host memory with positioned reads, or through one staging buffer
//! of at most [`CHUNK`] bytes for device memory. They are hashed on the way only when they must
//! be verified: bytes already hashed once are trusted while the file's [`Stamp`] (size,
//! modification time, inode) is unchanged, because FNV-1a runs one byte at a time (1.6 ns per
//! byte here, 1.8 s for a 1.1 GB model) and would otherwise cost more than the read itself.
//! `--verify-loads` hashes every read again.

use std::fs::{self, File};
use std::io;
use std::time::SystemTime;

use rpc_proto::Fnv1a;

use crate::ggml::Buffer;

/// Read granularity: the staging buffer for device memory, and the hashing steps.
pub const CHUNK: usize = 8 << 20;

/// Where the bytes go: tensor memory (a [`Buffer`]), or a test's vector.
pub trait Destination {
    /// Host memory `[offset, offset+len)` to read into directly, when the destination is host
    /// memory and the region is inside it.
    #[allow(clippy::mut_from_ref)]
    fn host_slice_mut(&self, offset: u64, len: usize) -> Option<&mut [u8]>;
    /// Copies `data` to `[offset, offset+data.len())`; false when out of bounds.
    fn write(&self, offset: u64, data: &[u8]) -> bool;
}

impl Destination for Buffer {
    fn host_slice_mut(&self, offset: u64, len: usize) -> Option<&mut [u8]> {
        Buffer::host_slice_mut(self, offset, len)
    }
    fn write(&self, offset: u64, data: &[u8]) -> bool {
        Buffer::write(self, offset, data)
    }
}

/// What identifies a file's content without reading it: when all three are unchanged, bytes
/// hashed earlier are trusted. (A writer that restores the modification time by hand defeats
/// it; `--verify-loads` does not trust it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub len: u64,
    pub mtime_ns: u128,
    pub ino: u64,
}

impl Stamp {
    pub fn of(m: &fs::Metadata) -> Stamp {
        #[cfg(unix)]
        let ino = std::os::unix::fs::MetadataExt::ino(m);
        #[cfg(not(unix))]
        let ino = 0;
        Stamp {
            len: m.len(),
            mtime_ns: mtime_ns(m),
            ino,
        }
    }
}

/// Modification time in nanoseconds since the epoch (0 when the platform has none).
pub fn mtime_ns(m: &fs::Metadata) -> u128 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Status-change time in nanoseconds (0 where the platform has none): set by the kernel on
/// every write or metadata change, including a `utime` that puts the modification time back.
pub fn ctime_ns(m: &fs::Metadata) -> i128 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        0
    }
}

/// Reads `len` bytes of `file` at `pos` into `dst[offset..offset+len]`, feeding `hasher` every
/// byte when there is one. Host memory is read into directly; otherwise through one staging
/// buffer of at most [`CHUNK`] bytes, which `stage(n)` must grant first (it returns a guard held
/// while the staging buffer lives, e.g. a memory-budget charge). On error the region may hold
/// part of the bytes.
pub fn read_into<G>(
    file: &File,
    pos: u64,
    len: u64,
    dst: &impl Destination,
    offset: u64,
    stage: impl FnOnce(u64) -> Option<G>,
    mut hasher: Option<&mut Fnv1a>,
) -> io::Result<()> {
    let len = usize::try_from(len).map_err(|_| io::Error::other("tensor too large"))?;
    let mut pos = pos;
    if let Some(region) = dst.host_slice_mut(offset, len) {
        for chunk in region.chunks_mut(CHUNK) {
            read_exact_at(file, chunk, pos)?;
            if let Some(h) = hasher.as_deref_mut() {
                h.update(chunk);
            }
            pos += chunk.len() as u64;
        }
        return Ok(());
    }
    let n = len.min(CHUNK);
    let Some(_guard) = stage(n as u64) else {
        return Err(io::Error::other("no memory budget for staging"));
    };
    let mut staged = Vec::new();
    staged
        .try_reserve_exact(n)
        .map_err(|_| io::Error::other("cannot allocate staging memory"))?;
    staged.resize(n, 0);
    let mut done = 0usize;
    while done < len {
        let k = (len - done).min(n);
        read_exact_at(file, &mut staged[..k], pos)?;
        pos += k as u64;
        if let Some(h) = hasher.as_deref_mut() {
            h.update(&staged[..k]);
        }
        if !dst.write(offset + done as u64, &staged[..k]) {
            return Err(io::Error::other("destination out of bounds"));
        }
        done += k;
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `pos` of `f`: a positioned read, since sessions share
/// handles.
pub fn read_exact_at(f: &File, buf: &mut [u8], pos: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(f, buf, pos)
    }
    #[cfg(windows)]
    {
        let (mut done, mut buf) = (0u64, buf);
        while !buf.is_empty() {
            match std::os::windows::fs::FileExt::seek_read(f, buf, pos + done)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    done += n as u64;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::cell::RefCell;

    /// A device-like destination (no host slice): every read goes through staging.
    pub struct VecDest(pub RefCell<Vec<u8>>);

    impl VecDest {
        pub fn new(len: usize) -> VecDest {
            VecDest(RefCell::new(vec![0; len]))
        }
        pub fn bytes(&self) -> Vec<u8> {
            self.0.borrow().clone()
        }
    }

    impl super::Destination for VecDest {
        fn host_slice_mut(&self, _: u64, _: usize) -> Option<&mut [u8]> {
            None
        }
        fn write(&self, offset: u64, data: &[u8]) -> bool {
            let mut v = self.0.borrow_mut();
            let off = offset as usize;
            match v.get_mut(off..off + data.len()) {
                Some(d) => {
                    d.copy_from_slice(data);
                    true
                }
                None => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::VecDest;
    use super::*;
    use rpc_proto::fnv1a64;

    #[test]
    fn staged_read_copies_and_hashes_the_range() {
        let p = std::env::temp_dir().join(format!("rpc-disk-read-{}", std::process::id()));
        let data: Vec<u8> = (0..CHUNK + 1000).map(|i| (i * 7) as u8).collect();
        fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let dst = VecDest::new(CHUNK + 600);
        let mut h = Fnv1a::new();
        let len = (CHUNK + 500) as u64;
        read_into(&f, 100, len, &dst, 5, |_| Some(()), Some(&mut h)).unwrap();
        let want = &data[100..100 + len as usize];
        assert_eq!(&dst.bytes()[5..5 + len as usize], want);
        assert_eq!(h.finish(), fnv1a64(want));
        // Refused staging, a read past the end, a destination too small: errors.
        assert!(read_into(&f, 0, 10, &dst, 0, |_| None::<()>, None).is_err());
        assert!(read_into(&f, data.len() as u64 - 5, 10, &dst, 0, |_| Some(()), None).is_err());
        assert!(read_into(&f, 0, 1000, &dst, CHUNK as u64, |_| Some(()), None).is_err());
        let _ = fs::remove_file(&p);
    }
}
