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

use rpc_proto::{Command, FrameHeader, Limits, Major, Request, Response, FRAME_HEADER_SIZE};

/// Entries kept at most; when full the cache starts over (it refills from the worker).
const MAX_ENTRIES: usize = 16 * 1024;

/// The request frame of DEVICE_COUNT (its key in the cache).
pub const DEVICE_COUNT_FRAME: [u8; FRAME_HEADER_SIZE] =
    FrameHeader::new(Command::DeviceCount, 0).encode();

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
            m.retain(|k, _| k.first() != Some(&Command::GetAllocSize.as_u8()));
        }
        m.insert(frame.into(), response.into());
    }

    /// The worker's device count, once DEVICE_COUNT has been answered.
    pub fn device_count(&self) -> Option<u32> {
        let v = self.get(&DEVICE_COUNT_FRAME)?;
        match Response::decode(Command::DeviceCount, &v) {
            Ok(Response::DeviceCount { count }) => Some(count),
            _ => None,
        }
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

/// The query `payload` of `cmd` decoded: the queries are the same in both majors.
fn decode_query(cmd: Command, payload: &[u8]) -> Option<Request<'_>> {
    if !cmd.is_device_query() {
        return None;
    }
    Request::decode(Major::V7, cmd, payload, &Limits::default()).ok()
}

/// Whether the answer to this request can be served from the cache (see the module docs).
pub fn is_cacheable(cmd: Command, payload: &[u8]) -> bool {
    match cmd {
        Command::DeviceCount | Command::GetAlignment | Command::GetMaxSize => true,
        Command::GetAllocSize => match decode_query(cmd, payload) {
            Some(Request::GetAllocSize { tensor, srcs, .. }) => std::iter::once(&tensor)
                .chain(srcs.iter())
                .all(|t| t.buffer.get() == 0),
            _ => false,
        },
        _ => false,
    }
}

/// The device a query names (GET_ALIGNMENT, GET_MAX_SIZE, GET_DEVICE_MEMORY, GET_ALLOC_SIZE);
/// `None` for DEVICE_COUNT, other commands and malformed payloads.
pub fn device_of(cmd: Command, payload: &[u8]) -> Option<u32> {
    match decode_query(cmd, payload)? {
        Request::GetAlignment { device }
        | Request::GetMaxSize { device }
        | Request::GetDeviceMemory { device }
        | Request::GetAllocSize { device, .. } => Some(device),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc_size(buffer_of: Option<usize>) -> Vec<u8> {
        let mut srcs = Box::new([rpc_proto::RpcTensor::default(); rpc_proto::GGML_MAX_SRC]);
        if let Some(i) = buffer_of {
            srcs[i] = rpc_proto::TensorBuilder::f32(2).data(1, 0x1000).build();
        }
        let mut p = Vec::new();
        Request::GetAllocSize {
            device: 0,
            tensor: rpc_proto::TensorBuilder::f32(1).ne(&[8]).build(),
            srcs,
        }
        .encode_payload(&mut p);
        p
    }

    #[test]
    fn alloc_size_with_a_buffer_is_not_cacheable() {
        assert!(is_cacheable(Command::GetAllocSize, &alloc_size(None)));
        let p = alloc_size(Some(3)); // a source names a buffer
        assert!(!is_cacheable(Command::GetAllocSize, &p));
        assert!(!is_cacheable(Command::GetAllocSize, &p[..100]));
        assert!(!is_cacheable(Command::GetDeviceMemory, &[0; 4]));
        assert!(is_cacheable(Command::DeviceCount, &[]));
    }

    #[test]
    fn device_count_and_overflow() {
        let c = QueryCache::default();
        assert_eq!(c.device_count(), None);
        let mut three = Vec::new();
        Response::DeviceCount { count: 3 }.encode_payload(&mut three);
        c.insert(&DEVICE_COUNT_FRAME, &three);
        assert_eq!(c.device_count(), Some(3));
        for i in 0..(MAX_ENTRIES as u32 + 10) {
            let mut k = vec![Command::GetAllocSize.as_u8()];
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
        let mut p = Vec::new();
        Request::GetAlignment { device: 7 }.encode_payload(&mut p);
        assert_eq!(device_of(Command::GetAlignment, &p), Some(7));
        assert_eq!(device_of(Command::GetAllocSize, &alloc_size(None)), Some(0));
        assert_eq!(device_of(Command::AllocBuffer, &p), None);
        assert_eq!(device_of(Command::DeviceCount, &[]), None);
        assert_eq!(device_of(Command::GetMaxSize, &[1]), None);
    }
}
