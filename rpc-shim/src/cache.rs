//! Answers to immutable queries, keyed by the exact request frame.
//!
//! DEVICE_COUNT, GET_ALIGNMENT and GET_MAX_SIZE depend only on the worker's devices, and
//! GET_ALLOC_SIZE only on the device and the tensor description in the request, as long as no
//! tensor in it names a buffer (buffer handles are per connection on the server, so such a
//! request is forwarded and never cached). GET_DEVICE_MEMORY changes and is never cached.
//!
//! The key is the whole request frame (command byte, size, payload), so two requests share an
//! answer only if they are byte-identical.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rpc_proto::{Command, GGML_MAX_SRC, RPC_TENSOR_SIZE};

/// Entries kept at most; when full the cache starts over (it refills from the worker).
const MAX_ENTRIES: usize = 16 * 1024;

/// Offset of the `buffer` field inside a serialized `rpc_tensor` (spec §6).
const TENSOR_BUFFER_OFFSET: usize = 12;

/// The request frame of DEVICE_COUNT (its key in the cache).
pub const DEVICE_COUNT_FRAME: [u8; 9] = [Command::DeviceCount as u8, 0, 0, 0, 0, 0, 0, 0, 0];

/// Request frame → response payload.
type Map = HashMap<Box<[u8]>, Arc<[u8]>>;

/// The immutable-query cache of one worker.
#[derive(Debug, Default)]
pub struct QueryCache {
    map: RwLock<Map>,
}

impl QueryCache {
    /// The cached response payload for this exact request frame.
    pub fn get(&self, frame: &[u8]) -> Option<Arc<[u8]>> {
        self.map
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(frame)
            .cloned()
    }

    /// Stores the response payload of a request frame.
    pub fn insert(&self, frame: &[u8], response: &[u8]) {
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MAX_ENTRIES && !m.contains_key(frame) {
            // Keep what every new client asks first; drop the rest (GET_ALLOC_SIZE keys hold
            // client tensor addresses, so they pile up across client runs).
            m.retain(|k, _| k.first() != Some(&(Command::GetAllocSize as u8)));
        }
        m.insert(frame.into(), response.into());
    }

    /// The worker's device count, once DEVICE_COUNT has been answered.
    pub fn device_count(&self) -> Option<u32> {
        let v = self.get(&DEVICE_COUNT_FRAME)?;
        Some(u32::from_le_bytes(v.get(..4)?.try_into().ok()?))
    }

    /// Number of cached answers.
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the answer to this request can be served from the cache (see the module docs).
pub fn is_cacheable(cmd: Command, payload: &[u8]) -> bool {
    match cmd {
        Command::DeviceCount | Command::GetAlignment | Command::GetMaxSize => true,
        Command::GetAllocSize => (0..=GGML_MAX_SRC).all(|i| {
            let at = 4 + i * RPC_TENSOR_SIZE + TENSOR_BUFFER_OFFSET;
            payload
                .get(at..at + 8)
                .is_some_and(|b| b.iter().all(|&x| x == 0))
        }),
        _ => false,
    }
}

/// Whether the command is a query a worker answers the same on any connection (the shim may send
/// it over its control connection when the client connection has no upstream connection yet).
pub fn is_query(cmd: Command) -> bool {
    matches!(
        cmd,
        Command::DeviceCount
            | Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetAllocSize
            | Command::GetDeviceMemory
    )
}

/// The device index of a request that has one in its first 4 payload bytes.
pub fn device_of(cmd: Command, payload: &[u8]) -> Option<u32> {
    match cmd {
        Command::GetAlignment
        | Command::GetMaxSize
        | Command::GetDeviceMemory
        | Command::GetAllocSize
        | Command::AllocBuffer
        | Command::GraphCompute
        | Command::GraphRecompute => Some(u32::from_le_bytes(payload.get(..4)?.try_into().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_size_with_a_buffer_is_not_cacheable() {
        let mut p = vec![0u8; 4 + 11 * RPC_TENSOR_SIZE];
        assert!(is_cacheable(Command::GetAllocSize, &p));
        p[4 + 3 * RPC_TENSOR_SIZE + TENSOR_BUFFER_OFFSET] = 1; // a source names a buffer
        assert!(!is_cacheable(Command::GetAllocSize, &p));
        assert!(!is_cacheable(Command::GetAllocSize, &p[..100]));
        assert!(!is_cacheable(Command::GetDeviceMemory, &[0; 4]));
        assert!(is_cacheable(Command::DeviceCount, &[]));
    }

    #[test]
    fn device_count_and_overflow() {
        let c = QueryCache::default();
        assert_eq!(c.device_count(), None);
        c.insert(&DEVICE_COUNT_FRAME, &3u32.to_le_bytes());
        assert_eq!(c.device_count(), Some(3));
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            let mut k = vec![Command::GetAllocSize as u8];
            k.extend_from_slice(&i.to_le_bytes());
            c.insert(&k, &[1]);
        }
        assert!(c.len() <= MAX_ENTRIES);
        assert_eq!(
            c.device_count(),
            Some(3),
            "the device count survives the overflow"
        );
    }

    #[test]
    fn device_field() {
        assert_eq!(
            device_of(Command::GetAlignment, &7u32.to_le_bytes()),
            Some(7)
        );
        assert_eq!(device_of(Command::DeviceCount, &[]), None);
        assert_eq!(device_of(Command::GetMaxSize, &[1]), None);
    }
}
