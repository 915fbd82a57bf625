//! 64-bit FNV-1a, the content hash of SET_TENSOR_HASH and of the server's cache files (spec §10).

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Incremental 64-bit FNV-1a hasher; feed it with [`Fnv1a::update`], read it with [`Fnv1a::finish`].
///
/// Hashing in pieces gives the same result as hashing the concatenation, so a
/// server can hash a streamed SET_TENSOR body chunk by chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a {
    state: u64,
}

impl Fnv1a {
    /// A hasher in its initial state (the FNV-1a offset basis).
    pub const fn new() -> Self {
        Fnv1a {
            state: OFFSET_BASIS,
        }
    }

    /// Feed more bytes.
    pub fn update(&mut self, data: &[u8]) {
        let mut h = self.state;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        self.state = h;
    }

    /// The hash of everything fed so far (the hasher stays usable).
    pub const fn finish(&self) -> u64 {
        self.state
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

/// 64-bit FNV-1a of `data` (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`).
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h = Fnv1a::new();
    h.update(data);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for split in [0, 1, 7, 500, 999, 1000] {
            let (a, b) = data.split_at(split);
            let mut h = Fnv1a::default();
            h.update(a);
            h.update(b);
            assert_eq!(h.finish(), fnv1a64(&data));
        }
    }
}
