//! A bounded reader of GGUF file headers: where each tensor's data lies in a local model file
//! (name, ggml type, byte range), for `--gguf` (`local_weights.rs`).
//!
//! A GGUF file is untrusted input like a request: every count, length and offset is checked
//! with checked arithmetic against the bytes the file really has before it is used, nothing is
//! allocated on a length field before a limit check (metadata values are skipped, not read), and
//! no content makes it panic. Versions 2 and 3 (64-bit counts), little-endian, as llama.cpp
//! writes them; split models (`-00001-of-00003.gguf`) are one GGUF file per part.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

use rpc_ggml::type_info;

/// `GGUF` in file order.
const MAGIC: [u8; 4] = *b"GGUF";
/// The data section's alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Longest key or tensor name read (ggml's own limit for names is 64 bytes).
const MAX_NAME: u64 = 64 << 10;
/// Deepest nesting of metadata arrays.
const MAX_ARRAY_DEPTH: u32 = 4;
/// ggml tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;

/// One tensor of a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufTensor {
    pub name: String,
    /// ggml type id.
    pub type_: u32,
    /// Absolute offset of its data in the file.
    pub offset: u64,
    /// Its data's size in bytes (`ggml_nbytes` of the contiguous tensor).
    pub len: u64,
}

/// What a GGUF header says about the file's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufHeader {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    pub tensors: Vec<GgufTensor>,
}

/// Why a file is not a usable GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("not a GGUF file (magic {0:02x?})")]
    NotGguf([u8; 4]),
    #[error("unsupported GGUF version {0} (2 and 3 are)")]
    Version(u32),
    #[error("truncated: {what} needs {need} bytes at offset {at}, the file has {len}")]
    Truncated {
        what: &'static str,
        at: u64,
        need: u64,
        len: u64,
    },
    #[error("malformed: {0}")]
    Malformed(String),
}

/// Reads the header of the GGUF file at `path`.
pub fn read_header(path: &Path) -> Result<GgufHeader, GgufError> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    parse(BufReader::with_capacity(1 << 16, f), len)
}

/// Parses a GGUF header from `r`, a reader at the start of a file of `len` bytes.
pub fn parse<R: Read + Seek>(r: R, len: u64) -> Result<GgufHeader, GgufError> {
    let mut c = Cursor { r, pos: 0, len };
    let magic = c.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(GgufError::NotGguf(magic));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Every key/value takes at least 13 bytes (key length, type, a 1-byte value) and every
    // tensor info at least 24 (name length, dims count, type, offset): counts beyond what the
    // file can hold are rejected before any loop or allocation.
    c.plausible_count(n_kv, 13, "metadata count")?;
    let mut alignment = DEFAULT_ALIGNMENT;
    let mut key = Vec::new();
    for _ in 0..n_kv {
        c.string_into("metadata key", &mut key)?;
        let ty = c.u32("metadata type")?;
        if key == b"general.alignment" && ty == TYPE_U32 {
            let a = u64::from(c.u32("general.alignment")?);
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::Malformed(format!(
                    "general.alignment {a} is not a power of two"
                )));
            }
            alignment = a;
        } else {
            c.skip_value(ty, 0)?;
        }
    }
    c.plausible_count(n_tensors, 24, "tensor count")?;
    let mut infos = Vec::new();
    let mut name = Vec::new();
    for i in 0..n_tensors {
        c.string_into("tensor name", &mut name)?;
        let n_dims = c.u32("tensor dims")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::Malformed(format!(
                "tensor {i}: {n_dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let mut ne = [1u64; 4];
        for d in ne.iter_mut().take(n_dims as usize) {
            *d = c.u64("tensor shape")?;
        }
        let type_ = c.u32("tensor type")?;
        let offset = c.u64("tensor offset")?;
        let name = String::from_utf8_lossy(&name).into_owned();
        let len = tensor_bytes(type_, &ne)
            .map_err(|e| GgufError::Malformed(format!("tensor {i} ({name}): {e}")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Malformed(format!(
                "tensor {i} ({name}): offset {offset} not aligned to {alignment}"
            )));
        }
        infos.push(GgufTensor {
            name,
            type_,
            offset,
            len,
        });
    }
    let data_start = c
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Malformed("data section offset overflows".into()))?;
    for t in &mut infos {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.len));
        match (start, end) {
            (Some(s), Some(e)) if e <= len => t.offset = s,
            _ => {
                return Err(GgufError::Truncated {
                    what: "tensor data",
                    at: start.unwrap_or(u64::MAX),
                    need: t.len,
                    len,
                })
            }
        }
    }
    Ok(GgufHeader {
        version,
        alignment,
        data_start,
        tensors: infos,
    })
}

/// Bytes of a contiguous tensor of `type_` and shape `ne` (ggml_nbytes), checked.
fn tensor_bytes(type_: u32, ne: &[u64; 4]) -> Result<u64, String> {
    let info = type_info(type_).ok_or_else(|| format!("unknown ggml type {type_}"))?;
    if !ne[0].is_multiple_of(info.blck_size) {
        return Err(format!(
            "ne[0]={} is not a multiple of the block size {}",
            ne[0], info.blck_size
        ));
    }
    let row = (ne[0] / info.blck_size)
        .checked_mul(info.type_size)
        .ok_or("row size overflows")?;
    ne[1..]
        .iter()
        .try_fold(row, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| "size overflows".to_string())
}

const TYPE_U8: u32 = 0;
const TYPE_I8: u32 = 1;
const TYPE_U16: u32 = 2;
const TYPE_I16: u32 = 3;
const TYPE_U32: u32 = 4;
const TYPE_I32: u32 = 5;
const TYPE_F32: u32 = 6;
const TYPE_BOOL: u32 = 7;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_U64: u32 = 10;
const TYPE_I64: u32 = 11;
const TYPE_F64: u32 = 12;

/// Size of one value of a fixed-size metadata type.
fn fixed_size(ty: u32) -> Option<u64> {
    Some(match ty {
        TYPE_U8 | TYPE_I8 | TYPE_BOOL => 1,
        TYPE_U16 | TYPE_I16 => 2,
        TYPE_U32 | TYPE_I32 | TYPE_F32 => 4,
        TYPE_U64 | TYPE_I64 | TYPE_F64 => 8,
        _ => return None,
    })
}

/// A reader that knows its position and the file's length.
struct Cursor<R> {
    r: R,
    pos: u64,
    len: u64,
}

impl<R: Read + Seek> Cursor<R> {
    fn need(&self, what: &'static str, n: u64) -> Result<(), GgufError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(GgufError::Truncated {
                what,
                at: self.pos,
                need: n,
                len: self.len,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        self.need(what, N as u64)?;
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Rejects a count of items of at least `min_size` bytes each that the rest of the file
    /// cannot hold.
    fn plausible_count(
        &self,
        count: u64,
        min_size: u64,
        what: &'static str,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(n) => self.need(what, n),
            None => Err(GgufError::Malformed(format!("{what} {count} is absurd"))),
        }
    }

    fn skip(&mut self, what: &'static str, n: u64) -> Result<(), GgufError> {
        self.need(what, n)?;
        // n <= len - pos, and a file length always fits an i64 on the platforms we run on;
        // a larger one is reported, not wrapped.
        let step = i64::try_from(n)
            .map_err(|_| GgufError::Malformed(format!("{what}: skip of {n} bytes")))?;
        self.r.seek_relative(step)?;
        self.pos += n;
        Ok(())
    }

    /// Reads a `u64 len | bytes` string of at most [`MAX_NAME`] bytes into `out`.
    fn string_into(&mut self, what: &'static str, out: &mut Vec<u8>) -> Result<(), GgufError> {
        let n = self.u64(what)?;
        if n > MAX_NAME {
            return Err(GgufError::Malformed(format!(
                "{what} of {n} bytes (at most {MAX_NAME})"
            )));
        }
        self.need(what, n)?;
        out.clear();
        out.resize(n as usize, 0);
        self.r.read_exact(out)?;
        self.pos += n;
        Ok(())
    }

    /// Skips one metadata value of type `ty`.
    fn skip_value(&mut self, ty: u32, depth: u32) -> Result<(), GgufError> {
        if let Some(n) = fixed_size(ty) {
            return self.skip("metadata value", n);
        }
        match ty {
            TYPE_STRING => {
                let n = self.u64("string length")?;
                self.skip("string", n)
            }
            TYPE_ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Malformed(
                        "metadata arrays nested too deep".into(),
                    ));
                }
                let ety = self.u32("array type")?;
                let count = self.u64("array length")?;
                if let Some(n) = fixed_size(ety) {
                    let total = count.checked_mul(n).ok_or_else(|| {
                        GgufError::Malformed(format!("array of {count} values overflows"))
                    })?;
                    return self.skip("array", total);
                }
                // Strings take at least 8 bytes, arrays at least 12: a count the rest of the
                // file cannot hold ends here, before the loop.
                self.plausible_count(count, 8, "array length")?;
                for _ in 0..count {
                    self.skip_value(ety, depth + 1)?;
                }
                Ok(())
            }
            _ => Err(GgufError::Malformed(format!("unknown metadata type {ty}"))),
        }
    }
}

/// Writes a GGUF file (for tests): `tensors` are `(name, ggml type, shape, data)`.
#[cfg(test)]
pub(crate) fn write_test_file(
    path: &Path,
    kv_strings: &[(&str, &str)],
    tensors: &[(&str, u32, [u64; 4], &[u8])],
) {
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(kv_strings.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, v: &str| {
        b.extend_from_slice(&(v.len() as u64).to_le_bytes());
        b.extend_from_slice(v.as_bytes());
    };
    for (k, v) in kv_strings {
        s(&mut b, k);
        b.extend_from_slice(&TYPE_STRING.to_le_bytes());
        s(&mut b, v);
    }
    let mut off = 0u64;
    let mut offs = Vec::new();
    for (name, ty, ne, data) in tensors {
        s(&mut b, name);
        b.extend_from_slice(&4u32.to_le_bytes());
        for d in ne {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&off.to_le_bytes());
        offs.push(off);
        off = (off + data.len() as u64).next_multiple_of(DEFAULT_ALIGNMENT);
    }
    b.resize(b.len().next_multiple_of(DEFAULT_ALIGNMENT as usize), 0);
    let base = b.len();
    for ((_, _, _, data), o) in tensors.iter().zip(offs) {
        b.resize(base + o as usize, 0);
        b.extend_from_slice(data);
    }
    std::fs::write(path, b).expect("write test gguf");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_proto::ggml_type;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("gguf-test-{name}-{}.gguf", std::process::id()))
    }

    #[test]
    fn reads_tensor_ranges_as_written() {
        let p = tmp("ranges");
        let a: Vec<u8> = (0..64u32).flat_map(|x| x.to_le_bytes()).collect(); // 16x4 f32... 64 f32
        let q: Vec<u8> = vec![7u8; 34 * 2]; // 2 Q8_0 blocks of 32
        write_test_file(
            &p,
            &[("general.architecture", "llama"), ("tokenizer.x", "abc")],
            &[
                ("a", ggml_type::F32, [16, 4, 1, 1], &a),
                ("q", ggml_type::Q8_0, [64, 1, 1, 1], &q),
            ],
        );
        let h = read_header(&p).unwrap();
        let file = std::fs::read(&p).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.tensors[0].len, 256);
        assert_eq!(h.tensors[1].len, 68);
        for (t, data) in h.tensors.iter().zip([&a, &q]) {
            let s = t.offset as usize;
            assert_eq!(&file[s..s + t.len as usize], &data[..], "{}", t.name);
        }
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let p = tmp("fuzz");
        let data = vec![1u8; 256];
        write_test_file(
            &p,
            &[("general.architecture", "llama")],
            &[("a", ggml_type::F32, [64, 1, 1, 1], &data)],
        );
        let good = std::fs::read(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        let parse_bytes = |b: &[u8]| parse(std::io::Cursor::new(b), b.len() as u64);
        assert!(parse_bytes(&good).is_ok());
        for cut in 0..good.len() - data.len() {
            assert!(parse_bytes(&good[..cut]).is_err(), "cut at {cut}");
        }
        // Every byte of the header set to extreme values: never a panic (errors or, for
        // harmless bytes, success).
        let header_len = good.len() - data.len();
        for i in 0..header_len {
            for v in [0x00, 0x7f, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = parse_bytes(&b);
            }
        }
        // Huge counts are rejected without allocating.
        let mut b = good.clone();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse_bytes(&b), Err(GgufError::Malformed(_))));
        b = good.clone();
        b[16..24].copy_from_slice(&(u64::MAX / 13).to_le_bytes());
        assert!(matches!(parse_bytes(&b), Err(GgufError::Truncated { .. })));
        assert!(matches!(
            parse_bytes(b"GGUF\x01\0\0\0"),
            Err(GgufError::Version(1))
        ));
        assert!(matches!(
            parse_bytes(b"GGML\x03\0\0\0"),
            Err(GgufError::NotGguf(_))
        ));
    }

    #[test]
    fn honours_general_alignment() {
        // Hand-built: alignment 64, one f32 tensor of 16 elements.
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        let key = b"general.alignment";
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key);
        b.extend_from_slice(&TYPE_U32.to_le_bytes());
        b.extend_from_slice(&64u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b't');
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&16u64.to_le_bytes());
        b.extend_from_slice(&ggml_type::F32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        let start = b.len().next_multiple_of(64);
        b.resize(start + 64, 9);
        let h = parse(std::io::Cursor::new(&b), b.len() as u64).unwrap();
        assert_eq!(h.alignment, 64);
        assert_eq!(h.data_start, start as u64);
        assert_eq!(h.tensors[0].offset, start as u64);
        assert_eq!(h.tensors[0].len, 64);
        // One byte short of the data: rejected.
        b.pop();
        assert!(parse(std::io::Cursor::new(&b), b.len() as u64).is_err());
    }
}
