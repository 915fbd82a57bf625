//! The command byte of a request frame (`enum rpc_cmd`, spec §5.1).

use core::fmt;

use crate::consts::{CONN_CAPS_SIZE, GRAPH_HEADER_SIZE, RPC_TENSOR_SIZE, SET_TENSOR_HEADER_SIZE};

/// A protocol 7.0.0 command, as carried in the first byte of a request frame.
///
/// `18` (`RPC_CMD_NONE`, a client-internal queue marker) and everything `>= 19`
/// are not commands: [`Command::from_u8`] returns `None` for them.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Allocate a buffer on a device.
    AllocBuffer = 0,
    /// Query a device's buffer alignment.
    GetAlignment = 1,
    /// Query a device's maximum buffer size.
    GetMaxSize = 2,
    /// Query a buffer's base address.
    BufferGetBase = 3,
    /// Free a buffer (no response in 7.x).
    FreeBuffer = 4,
    /// Fill a buffer with one byte value (no response in 7.x).
    BufferClear = 5,
    /// Write bytes into a tensor (no response).
    SetTensor = 6,
    /// Write a tensor from the server's hash cache.
    SetTensorHash = 7,
    /// Read bytes from a tensor.
    GetTensor = 8,
    /// Copy one tensor into another on the same server.
    CopyTensor = 9,
    /// Build and run a graph (no response).
    GraphCompute = 10,
    /// Query a device's free and total memory.
    GetDeviceMemory = 11,
    /// Let the backend initialise a tensor (no response in 7.x).
    InitTensor = 12,
    /// Query the allocation size of a tensor.
    GetAllocSize = 13,
    /// Handshake; must be the first command of a connection.
    Hello = 14,
    /// Query the number of devices.
    DeviceCount = 15,
    /// Re-run the graph stored by the last GRAPH_COMPUTE on a device (no response).
    GraphRecompute = 16,
    /// Fill a tensor region with one byte value (no response in 7.x).
    MemsetTensor = 17,
}

/// The payload size a request of some command must have (spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadSize {
    /// The payload must be exactly this many bytes.
    Exact(u64),
    /// The payload must be at least this many bytes (and at most the configured limit).
    AtLeast(u64),
}

// Widening `usize` constants to `u64` in const context; all values are small.
const fn w(n: usize) -> u64 {
    n as u64
}

impl Command {
    /// Every command, in wire order (`ALL[i] as u8 == i`).
    pub const ALL: [Command; 18] = [
        Command::AllocBuffer,
        Command::GetAlignment,
        Command::GetMaxSize,
        Command::BufferGetBase,
        Command::FreeBuffer,
        Command::BufferClear,
        Command::SetTensor,
        Command::SetTensorHash,
        Command::GetTensor,
        Command::CopyTensor,
        Command::GraphCompute,
        Command::GetDeviceMemory,
        Command::InitTensor,
        Command::GetAllocSize,
        Command::Hello,
        Command::DeviceCount,
        Command::GraphRecompute,
        Command::MemsetTensor,
    ];

    /// Parse a command byte. `18` (`RPC_CMD_NONE`) and `>= 19` give `None`.
    pub fn from_u8(b: u8) -> Option<Command> {
        Self::ALL.get(usize::from(b)).copied()
    }

    /// The command byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether the server answers this command, per the 7.x response matrix (spec §5.1).
    ///
    /// An extra response desynchronises a 7.x client, a missing one hangs it.
    pub fn has_response(self) -> bool {
        match self {
            Command::AllocBuffer
            | Command::GetAlignment
            | Command::GetMaxSize
            | Command::BufferGetBase
            | Command::SetTensorHash
            | Command::GetTensor
            | Command::CopyTensor
            | Command::GetDeviceMemory
            | Command::GetAllocSize
            | Command::Hello
            | Command::DeviceCount => true,
            Command::FreeBuffer
            | Command::BufferClear
            | Command::SetTensor
            | Command::GraphCompute
            | Command::InitTensor
            | Command::GraphRecompute
            | Command::MemsetTensor => false,
        }
    }

    /// The upstream name without the `RPC_CMD_` prefix, e.g. `"ALLOC_BUFFER"`.
    pub fn name(self) -> &'static str {
        match self {
            Command::AllocBuffer => "ALLOC_BUFFER",
            Command::GetAlignment => "GET_ALIGNMENT",
            Command::GetMaxSize => "GET_MAX_SIZE",
            Command::BufferGetBase => "BUFFER_GET_BASE",
            Command::FreeBuffer => "FREE_BUFFER",
            Command::BufferClear => "BUFFER_CLEAR",
            Command::SetTensor => "SET_TENSOR",
            Command::SetTensorHash => "SET_TENSOR_HASH",
            Command::GetTensor => "GET_TENSOR",
            Command::CopyTensor => "COPY_TENSOR",
            Command::GraphCompute => "GRAPH_COMPUTE",
            Command::GetDeviceMemory => "GET_DEVICE_MEMORY",
            Command::InitTensor => "INIT_TENSOR",
            Command::GetAllocSize => "GET_ALLOC_SIZE",
            Command::Hello => "HELLO",
            Command::DeviceCount => "DEVICE_COUNT",
            Command::GraphRecompute => "GRAPH_RECOMPUTE",
            Command::MemsetTensor => "MEMSET_TENSOR",
        }
    }

    /// The request payload size this command requires (spec §5.1).
    ///
    /// Only SET_TENSOR (`>= 305`) and GRAPH_COMPUTE (`>= 12`) are variable-sized.
    pub fn request_size(self) -> PayloadSize {
        const RT: u64 = w(RPC_TENSOR_SIZE);
        match self {
            Command::AllocBuffer => PayloadSize::Exact(4 + 8),
            Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetDeviceMemory
            | Command::GraphRecompute => PayloadSize::Exact(4),
            Command::BufferGetBase | Command::FreeBuffer => PayloadSize::Exact(8),
            Command::BufferClear => PayloadSize::Exact(8 + 1),
            Command::SetTensor => PayloadSize::AtLeast(w(SET_TENSOR_HEADER_SIZE)),
            Command::SetTensorHash | Command::GetTensor => PayloadSize::Exact(RT + 8 + 8),
            Command::CopyTensor => PayloadSize::Exact(2 * RT),
            Command::GraphCompute => PayloadSize::AtLeast(w(GRAPH_HEADER_SIZE)),
            Command::InitTensor => PayloadSize::Exact(RT),
            Command::GetAllocSize => PayloadSize::Exact(4 + 11 * RT),
            Command::Hello => PayloadSize::Exact(w(CONN_CAPS_SIZE)),
            Command::DeviceCount => PayloadSize::Exact(0),
            Command::MemsetTensor => PayloadSize::Exact(RT + 8 + 8 + 1),
        }
    }
}

impl TryFrom<u8> for Command {
    type Error = crate::DecodeError;

    fn try_from(b: u8) -> Result<Self, Self::Error> {
        Command::from_u8(b).ok_or(crate::DecodeError::UnknownCommand(b))
    }
}

impl From<Command> for u8 {
    fn from(c: Command) -> u8 {
        c as u8
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_u8_matches_discriminants() {
        for (i, c) in Command::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.as_u8()), i);
            assert_eq!(Command::from_u8(c.as_u8()), Some(*c));
        }
        for b in 18..=u8::MAX {
            assert_eq!(Command::from_u8(b), None);
        }
    }

    #[test]
    fn fixed_sizes_match_spec_table() {
        use PayloadSize::*;
        let expected = [
            Exact(12),
            Exact(4),
            Exact(4),
            Exact(8),
            Exact(8),
            Exact(9),
            AtLeast(305),
            Exact(312),
            Exact(312),
            Exact(592),
            AtLeast(12),
            Exact(4),
            Exact(296),
            Exact(3260),
            Exact(24),
            Exact(0),
            Exact(4),
            Exact(313),
        ];
        for (c, e) in Command::ALL.iter().zip(expected) {
            assert_eq!(c.request_size(), e, "{c}");
        }
    }

    #[test]
    fn response_matrix() {
        let with: Vec<u8> = Command::ALL
            .iter()
            .filter(|c| c.has_response())
            .map(|c| c.as_u8())
            .collect();
        assert_eq!(with, [0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15]);
    }
}
