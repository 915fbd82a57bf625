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

use rpc_ggml::Buffer;

/// Read granularity: the staging buffer for device memory, and the hashing steps.
pub const CHUNK: usize = 8 << 20;

/// Where the bytes go: tensor memory (a [`Buffer`]), or a test's vector. Writing takes
/// `&mut self`: a destination hands out one writable view at a time, and only for the length of
/// a call.
pub trait Destination {
    /// Runs `f` on host memory `[offset, offset+len)`, to read into directly, when the
    /// destination is host memory and the region is inside it (`None` otherwise, and `f` is not
    /// called).
    fn with_host_mut<R>(
        &mut self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R>;
    /// Copies `data` to `[offset, offset+data.len())`; false when out of bounds.
    fn write(&mut self, offset: u64, data: &[u8]) -> bool;
}

impl Destination for Buffer {
    fn with_host_mut<R>(
        &mut self,
        offset: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        self.host_mut(offset, len).map(|mut view| f(&mut view))
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        Buffer::write(self, offset, data).is_ok()
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
    dst: &mut impl Destination,
    offset: u64,
    stage: impl FnOnce(u64) -> Option<G>,
    mut hasher: Option<&mut Fnv1a>,
) -> io::Result<()> {
    let len = usize::try_from(len).map_err(|_| io::Error::other("tensor too large"))?;
    let mut pos = pos;
    let direct = dst.with_host_mut(offset, len, |region| {
        for chunk in region.chunks_mut(CHUNK) {
            read_exact_at(file, chunk, pos)?;
            if let Some(h) = hasher.as_deref_mut() {
                h.update(chunk);
            }
            pos += chunk.len() as u64;
        }
        Ok(())
    });
    if let Some(done) = direct {
        return done;
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
    /// A device-like destination (no host slice): every read goes through staging.
    pub struct VecDest(pub Vec<u8>);

    impl VecDest {
        pub fn new(len: usize) -> VecDest {
            VecDest(vec![0; len])
        }
        pub fn bytes(&self) -> Vec<u8> {
            self.0.clone()
        }
    }

    impl super::Destination for VecDest {
        fn with_host_mut<R>(
            &mut self,
            _: u64,
            _: usize,
            _: impl FnOnce(&mut [u8]) -> R,
        ) -> Option<R> {
            None
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> bool {
            let off = offset as usize;
            match self.0.get_mut(off..off + data.len()) {
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
        let mut dst = VecDest::new(CHUNK + 600);
        let mut h = Fnv1a::new();
        let len = (CHUNK + 500) as u64;
        read_into(&f, 100, len, &mut dst, 5, |_| Some(()), Some(&mut h)).unwrap();
        let want = &data[100..100 + len as usize];
        assert_eq!(&dst.bytes()[5..5 + len as usize], want);
        assert_eq!(h.finish(), fnv1a64(want));
        // Refused staging, a read past the end, a destination too small: errors.
        assert!(read_into(&f, 0, 10, &mut dst, 0, |_| None::<()>, None).is_err());
        assert!(read_into(
            &f,
            data.len() as u64 - 5,
            10,
            &mut dst,
            0,
            |_| Some(()),
            None
        )
        .is_err());
        assert!(read_into(&f, 0, 1000, &mut dst, CHUNK as u64, |_| Some(()), None).is_err());
        let _ = fs::remove_file(&p);
    }

    /// Host memory is read into directly (no staging is asked for), through the buffer's
    /// writable view.
    #[test]
    fn host_buffers_are_read_into_directly() {
        let p = std::env::temp_dir().join(format!("rpc-disk-read-host-{}", std::process::id()));
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        fs::write(&p, &data).unwrap();
        let f = File::open(&p).unwrap();
        let cpu = rpc_ggml::Device::all()
            .into_iter()
            .find(|d| d.kind() == rpc_ggml::DeviceKind::Cpu)
            .unwrap();
        let mut buf = cpu.alloc_buffer(8192).unwrap();
        let mut h = Fnv1a::new();
        let no_staging = |_| -> Option<()> { panic!("host memory needs no staging") };
        read_into(&f, 96, 4000, &mut buf, 100, no_staging, Some(&mut h)).unwrap();
        let mut out = vec![0u8; 4000];
        buf.read(100, &mut out).unwrap();
        assert_eq!(out, &data[96..]);
        assert_eq!(h.finish(), fnv1a64(&data[96..]));
        // A region outside the buffer is not host memory to read into; staging then fails too.
        assert!(read_into(&f, 0, 4000, &mut buf, 8000, |_| Some(()), None).is_err());
        let _ = fs::remove_file(&p);
    }
}
