//! The command byte of a request frame (`enum rpc_cmd`, spec §5.1; 8.0.0 delta §B) and the
//! protocol major a connection speaks.

use core::fmt;

use crate::consts::{
    COMM_INIT_SIZE, CONN_CAPS_SIZE, GRAPH_HEADER_SIZE, GRAPH_HEADER_SIZE_V8, RPC_TENSOR_SIZE,
    SET_TENSOR_2D_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};

/// The protocol major a connection speaks. The HELLO request is byte-identical in both, so a
/// server cannot tell them apart before it answers: it is fixed per listening socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Major {
    /// 7.0.0: llama.cpp up to September 2026 (`llama-cpp-python` 0.3.36, b11434).
    V7,
    /// 8.0.0: llama.cpp since October 2026 (b11549): graph uids, strided copies, collectives.
    V8,
}

impl Major {
    /// What current upstream speaks.
    pub const CURRENT: Major = Major::V8;
    /// Both majors, oldest first.
    pub const ALL: [Major; 2] = [Major::V7, Major::V8];

    /// The major number on the wire (HELLO reply).
    pub fn number(self) -> u8 {
        match self {
            Major::V7 => 7,
            Major::V8 => 8,
        }
    }

    /// The major announced as `major`, if it is one of ours.
    pub fn from_number(major: u8) -> Option<Major> {
        Major::ALL.into_iter().find(|m| m.number() == major)
    }

    /// `(major, minor, patch)` announced in the HELLO reply.
    pub fn version(self) -> (u8, u8, u8) {
        (self.number(), 0, 0)
    }

    /// Whether a client of this major accepts a server announcing `major.minor`: same major,
    /// minor not newer (the patch is ignored), as upstream's client checks.
    pub fn accepts(self, major: u8, minor: u8) -> bool {
        major == self.number() && minor == 0
    }

    /// `RPC_CMD_NONE` of this major (18 in 7.0.0, 23 in 8.0.0): the count of its commands, the
    /// first byte that is none of them.
    pub fn cmd_none(self) -> u8 {
        match self {
            Major::V7 => Command::SetTensor2d.as_u8(),
            Major::V8 => Command::CommFree.as_u8() + 1,
        }
    }

    /// Parse a command byte: 0..=17 in 7.0.0, 0..=22 in 8.0.0 and, on 8.0.0 connections, our
    /// [extensions](Command::EXTENSIONS) (from 0xE0). Every other byte gives `None`.
    pub fn command(self, b: u8) -> Option<Command> {
        if let Some(&c) = Command::ALL.get(usize::from(b)) {
            return (self == Major::V8 || !c.is_v8_only()).then_some(c);
        }
        let c = Command::EXTENSIONS.into_iter().find(|c| c.as_u8() == b)?;
        (self == Major::V8).then_some(c)
    }
}

impl fmt::Display for Major {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b, c) = self.version();
        write!(f, "{a}.{b}.{c}")
    }
}

/// A command, as carried in the first byte of a request frame: the 18 of 7.0.0 and the five
/// 8.0.0 added (18..=22). Which are valid depends on the connection's [`Major`].
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
    /// 8.0: strided write of `n_copies` chunks into a tensor (no response).
    SetTensor2d = 18,
    /// 8.0: strided read of `n_copies` chunks from a tensor.
    GetTensor2d = 19,
    /// 8.0: join a pairwise communicator for a device (answers one byte, 1 = joined).
    CommInit = 20,
    /// 8.0: sum a tensor with the peer's in place over the communicator (no response).
    CommAllreduce = 21,
    /// 8.0: leave the communicator of a device (no response).
    CommFree = 22,
    /// Extension (ours, 8.0 connections only; a stock server closes the connection on it): is
    /// this one of ours, and which RPC port does it serve? Reply: extension version, port.
    LinkProbe = 0xE0,
    /// Extension: open a worker-to-worker link in a slot of this connection (a COMM_INIT's
    /// rank, world and rank 0's host and port, under the same policy); reply one byte, 1 = open.
    LinkOpen = 0xE1,
    /// Extension: send a tensor's bytes over a slot's link, after the commands before it (no
    /// response); the peer's matching LINK_RECV takes them.
    LinkSend = 0xE2,
    /// Extension: receive bytes over a slot's link into a tensor, before the commands after it
    /// (no response).
    LinkRecv = 0xE3,
    /// Extension: close a slot's link (no response; fine without one).
    LinkClose = 0xE4,
}

/// The payload size a request of some command must have (spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadSize {
    /// The payload must be exactly this many bytes.
    Exact(u64),
    /// The payload must be at least this many bytes (and at most the configured limit).
    AtLeast(u64),
}

/// What a request names of the state a server holds for its connection, and where in its
/// payload ([`Command::target`]): the fields a proxy that spreads one client over several servers
/// (`rpc-shim --one-endpoint`) routes the request by and rewrites, and a fuzzer maps to the
/// buffers it allocated. A device index is the payload's first `u32`, a buffer handle its first
/// `u64`, a tensor a [`RPC_TENSOR_SIZE`]-byte `rpc_tensor` whose `buffer` field names a buffer
/// (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Nothing of the connection's, only the server itself: any server of several could answer
    /// (HELLO, DEVICE_COUNT, LINK_PROBE).
    Server,
    /// A device, its index first, then `tensors` tensors from byte 4 (ALLOC_BUFFER, the device
    /// queries, GRAPH_RECOMPUTE, COMM_INIT, COMM_FREE: none; COMM_ALLREDUCE: 1; GET_ALLOC_SIZE:
    /// 11, descriptions whose buffer may be none).
    Device {
        /// Tensors after the device index.
        tensors: usize,
    },
    /// A device, its index first, and a graph whose tensor array ends the payload
    /// (GRAPH_COMPUTE; see [`Graph`](crate::Graph)).
    Graph,
    /// A buffer, its handle first (BUFFER_GET_BASE, FREE_BUFFER, BUFFER_CLEAR).
    Buffer,
    /// This many tensors from the payload's start (SET_TENSOR, SET_TENSOR_HASH, GET_TENSOR,
    /// INIT_TENSOR, MEMSET_TENSOR, SET_TENSOR_2D, GET_TENSOR_2D: 1; COPY_TENSOR: 2).
    Tensors(usize),
    /// One of the connection's worker-to-worker link slots (ours), its `u32` index first, then
    /// `tensors` tensors from byte 4 (LINK_OPEN, LINK_CLOSE: none; LINK_SEND, LINK_RECV: 1).
    LinkSlot {
        /// Tensors after the slot index.
        tensors: usize,
    },
}

impl Target {
    /// The payload bytes that hold what the request names, from its start (a graph's: its
    /// device index): at most the payload's size in either major.
    pub fn head_len(self) -> usize {
        match self {
            Target::Server => 0,
            Target::Graph => 4,
            Target::Buffer => 8,
            Target::Tensors(n) => n * RPC_TENSOR_SIZE,
            Target::Device { tensors } | Target::LinkSlot { tensors } => {
                4 + tensors * RPC_TENSOR_SIZE
            }
        }
    }
}

// Widening `usize` constants to `u64` in const context; all values are small.
const fn w(n: usize) -> u64 {
    n as u64
}

impl Command {
    /// Every command of either major, in wire order (`ALL[i] as u8 == i`).
    pub const ALL: [Command; 23] = [
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
        Command::SetTensor2d,
        Command::GetTensor2d,
        Command::CommInit,
        Command::CommAllreduce,
        Command::CommFree,
    ];

    /// Our extensions to 8.0.0, for worker-to-worker copies (`rpc-shim --one-endpoint` over our
    /// servers): outside llama.cpp's command range, valid on 8.0.0 connections only.
    pub const EXTENSIONS: [Command; 5] = [
        Command::LinkProbe,
        Command::LinkOpen,
        Command::LinkSend,
        Command::LinkRecv,
        Command::LinkClose,
    ];

    /// Every command: [`Command::ALL`], then [`Command::EXTENSIONS`] (`EVERY[c.index()] == c`).
    pub const EVERY: [Command; Command::ALL.len() + Command::EXTENSIONS.len()] = {
        let mut every = [Command::AllocBuffer; Command::ALL.len() + Command::EXTENSIONS.len()];
        let mut i = 0;
        while i < Command::ALL.len() {
            every[i] = Command::ALL[i];
            i += 1;
        }
        let mut j = 0;
        while j < Command::EXTENSIONS.len() {
            every[i + j] = Command::EXTENSIONS[j];
            j += 1;
        }
        every
    };

    /// The command's place in [`Command::EVERY`]: its byte for llama.cpp's commands, then ours
    /// (for tables indexed by command).
    pub fn index(self) -> usize {
        if self.is_extension() {
            Command::ALL.len() + usize::from(self.as_u8() - Command::LinkProbe.as_u8())
        } else {
            usize::from(self.as_u8())
        }
    }

    /// Whether the command exists only in 8.0.0 (our extensions included).
    pub fn is_v8_only(self) -> bool {
        self.as_u8() >= Command::SetTensor2d.as_u8()
    }

    /// Whether the command is one of our [extensions](Command::EXTENSIONS), which no stock
    /// client sends and no stock server knows.
    pub fn is_extension(self) -> bool {
        self.as_u8() >= Command::LinkProbe.as_u8()
    }

    /// The command byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether the server answers this command, per the response matrix (spec §5.1, 8.0 §B; the
    /// same in both majors for the commands they share).
    ///
    /// An extra response desynchronises a client, a missing one hangs it.
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
            | Command::DeviceCount
            | Command::GetTensor2d
            | Command::CommInit
            | Command::LinkProbe
            | Command::LinkOpen => true,
            Command::FreeBuffer
            | Command::BufferClear
            | Command::SetTensor
            | Command::GraphCompute
            | Command::InitTensor
            | Command::GraphRecompute
            | Command::MemsetTensor
            | Command::SetTensor2d
            | Command::CommAllreduce
            | Command::CommFree
            | Command::LinkSend
            | Command::LinkRecv
            | Command::LinkClose => false,
        }
    }

    /// Whether the command is a device query: DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE,
    /// GET_ALLOC_SIZE and GET_DEVICE_MEMORY. A device query asks about the server's devices,
    /// changes nothing, has a small fixed-size request and reply and is the same in both majors;
    /// its answer does not depend on the connection it is asked on (but for a GET_ALLOC_SIZE
    /// whose tensors name a buffer: buffer handles are per connection). The shim answers these
    /// from its cache or over a worker's control connection.
    ///
    /// [`Command::is_device_property`] is the part of this class answered from the devices
    /// alone.
    pub fn is_device_query(self) -> bool {
        match self {
            Command::DeviceCount
            | Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetAllocSize
            | Command::GetDeviceMemory => true,
            Command::AllocBuffer
            | Command::BufferGetBase
            | Command::FreeBuffer
            | Command::BufferClear
            | Command::SetTensor
            | Command::SetTensorHash
            | Command::GetTensor
            | Command::CopyTensor
            | Command::GraphCompute
            | Command::InitTensor
            | Command::Hello
            | Command::GraphRecompute
            | Command::MemsetTensor
            | Command::SetTensor2d
            | Command::GetTensor2d
            | Command::CommInit
            | Command::CommAllreduce
            | Command::CommFree
            | Command::LinkProbe
            | Command::LinkOpen
            | Command::LinkSend
            | Command::LinkRecv
            | Command::LinkClose => false,
        }
    }

    /// Whether the command is a [device query](Command::is_device_query) whose request is at
    /// most a device index: DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE and GET_DEVICE_MEMORY. Its
    /// answer depends on the devices alone, so any session of a server gives the same one (a
    /// contained server's front answers these itself). GET_ALLOC_SIZE is the device query that
    /// is not one of them, on purpose: it carries eleven tensor descriptions (3,260 bytes), and
    /// a tensor of it may name a buffer, which only the connection that allocated it knows.
    pub fn is_device_property(self) -> bool {
        self.is_device_query() && self != Command::GetAllocSize
    }

    /// Whether the command runs a graph on a device: GRAPH_COMPUTE and GRAPH_RECOMPUTE (no
    /// response). Their payloads start with the device, followed in 8.0.0 by the graph's uid
    /// (see [`graph_frame_with_uid`](crate::graph_frame_with_uid)).
    pub fn runs_graph(self) -> bool {
        matches!(self, Command::GraphCompute | Command::GraphRecompute)
    }

    /// The streamed-body class: for the requests whose tensor data follows a fixed head, and
    /// may be large enough to be passed on as it arrives rather than read whole, the head's
    /// size (SET_TENSOR: tensor, cache flag, offset; SET_TENSOR_2D: tensor, offset, size,
    /// copies, stride; at most [`DATA_HEAD_MAX`](crate::DATA_HEAD_MAX)). `None` for every
    /// other request. The server streams exactly these (decoding the head with
    /// [`DataHead::decode`](crate::DataHead::decode)), and so does the shim.
    pub fn data_head(self) -> Option<usize> {
        match self {
            Command::SetTensor => Some(SET_TENSOR_HEADER_SIZE),
            Command::SetTensor2d => Some(SET_TENSOR_2D_HEADER_SIZE),
            _ => None,
        }
    }

    /// What the request names of the connection's state, and where ([`Target`]).
    pub fn target(self) -> Target {
        match self {
            Command::Hello | Command::DeviceCount | Command::LinkProbe => Target::Server,
            Command::AllocBuffer
            | Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetDeviceMemory
            | Command::GraphRecompute
            | Command::CommInit
            | Command::CommFree => Target::Device { tensors: 0 },
            Command::CommAllreduce => Target::Device { tensors: 1 },
            Command::GetAllocSize => Target::Device {
                tensors: 1 + crate::consts::GGML_MAX_SRC,
            },
            Command::GraphCompute => Target::Graph,
            Command::BufferGetBase | Command::FreeBuffer | Command::BufferClear => Target::Buffer,
            Command::SetTensor
            | Command::SetTensorHash
            | Command::GetTensor
            | Command::InitTensor
            | Command::MemsetTensor
            | Command::SetTensor2d
            | Command::GetTensor2d => Target::Tensors(1),
            Command::CopyTensor => Target::Tensors(2),
            Command::LinkOpen | Command::LinkClose => Target::LinkSlot { tensors: 0 },
            Command::LinkSend | Command::LinkRecv => Target::LinkSlot { tensors: 1 },
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
            Command::SetTensor2d => "SET_TENSOR_2D",
            Command::GetTensor2d => "GET_TENSOR_2D",
            Command::CommInit => "COMM_INIT",
            Command::CommAllreduce => "COMM_ALLREDUCE",
            Command::CommFree => "COMM_FREE",
            Command::LinkProbe => "LINK_PROBE",
            Command::LinkOpen => "LINK_OPEN",
            Command::LinkSend => "LINK_SEND",
            Command::LinkRecv => "LINK_RECV",
            Command::LinkClose => "LINK_CLOSE",
        }
    }

    /// The request payload size this command requires in `major` (spec §5.1, 8.0 §B).
    ///
    /// Only SET_TENSOR (`>= 305`), GRAPH_COMPUTE (`>= 12`; 8.0: `>= 20`) and SET_TENSOR_2D
    /// (`>= 328`) are variable-sized; GRAPH_RECOMPUTE is 4 bytes in 7.0, 12 in 8.0.
    pub fn request_size(self, major: Major) -> PayloadSize {
        const RT: u64 = w(RPC_TENSOR_SIZE);
        match self {
            Command::AllocBuffer => PayloadSize::Exact(4 + 8),
            Command::GraphRecompute if major == Major::V8 => PayloadSize::Exact(4 + 8),
            Command::GraphCompute if major == Major::V8 => {
                PayloadSize::AtLeast(w(GRAPH_HEADER_SIZE_V8))
            }
            Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetDeviceMemory
            | Command::GraphRecompute
            | Command::CommFree
            | Command::LinkClose => PayloadSize::Exact(4),
            Command::LinkProbe => PayloadSize::Exact(0),
            Command::LinkOpen => PayloadSize::Exact(4 + w(COMM_INIT_SIZE)),
            Command::LinkSend => PayloadSize::Exact(4 + RT + 8),
            Command::LinkRecv => PayloadSize::Exact(4 + RT + 8),
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
            Command::SetTensor2d => PayloadSize::AtLeast(w(SET_TENSOR_2D_HEADER_SIZE)),
            Command::GetTensor2d => PayloadSize::Exact(w(SET_TENSOR_2D_HEADER_SIZE)),
            Command::CommInit => PayloadSize::Exact(w(COMM_INIT_SIZE)),
            Command::CommAllreduce => PayloadSize::Exact(4 + RT),
        }
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
    fn command_bytes_per_major() {
        for (i, c) in Command::ALL.iter().enumerate() {
            assert_eq!(usize::from(c.as_u8()), i);
            assert_eq!(Major::V8.command(c.as_u8()), Some(*c));
            assert_eq!(Major::V7.command(c.as_u8()).is_some(), i < 18, "{c}");
        }
        // RPC_CMD_NONE (18 in 7.0, 23 in 8.0) and everything above are not commands.
        for b in 18..=u8::MAX {
            assert_eq!(Major::V7.command(b), None);
        }
        // 8.0: RPC_CMD_NONE and above are not commands, but for our five extensions.
        for b in 23..=u8::MAX {
            let ext = Command::EXTENSIONS.into_iter().find(|c| c.as_u8() == b);
            assert_eq!(Major::V8.command(b), ext);
        }
        for c in Command::EXTENSIONS {
            assert!(
                c.is_extension() && c.is_v8_only() && !c.is_device_query(),
                "{c}"
            );
            assert_eq!(Major::V7.command(c.as_u8()), None);
        }
        assert!(Command::ALL.iter().all(|c| !c.is_extension()));
        for (i, c) in Command::EVERY.iter().enumerate() {
            assert_eq!(c.index(), i, "{c}");
        }
        for m in Major::ALL {
            let none = m.cmd_none();
            assert_eq!(m.command(none), None, "{m}");
            assert!(m.command(none - 1).is_some(), "{m}");
            let ext = if m == Major::V8 {
                Command::EXTENSIONS.len()
            } else {
                0
            };
            assert_eq!(
                usize::from(none) + ext,
                (0..=u8::MAX).filter(|&b| m.command(b).is_some()).count()
            );
        }
        assert_eq!((Major::V7.cmd_none(), Major::V8.cmd_none()), (18, 23));
    }

    #[test]
    fn versions() {
        assert_eq!(Major::V7.version(), (7, 0, 0));
        assert_eq!(Major::V8.version(), (8, 0, 0));
        assert!(Major::V8.accepts(8, 0) && !Major::V8.accepts(8, 1) && !Major::V8.accepts(7, 0));
        assert!(Major::V7.accepts(7, 0) && !Major::V7.accepts(8, 0));
        assert_eq!(Major::from_number(8), Some(Major::V8));
        assert_eq!(Major::from_number(9), None);
        assert_eq!(Major::CURRENT.to_string(), "8.0.0");
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
            assert_eq!(c.request_size(Major::V7), e, "{c}");
        }
        // 8.0 (delta §B): GRAPH_COMPUTE +8 (uid), GRAPH_RECOMPUTE 12, and the five new ones.
        let v8 = [
            (Command::GraphCompute, AtLeast(20)),
            (Command::GraphRecompute, Exact(12)),
            (Command::SetTensor2d, AtLeast(328)),
            (Command::GetTensor2d, Exact(328)),
            (Command::CommInit, Exact(80)),
            (Command::CommAllreduce, Exact(300)),
            (Command::CommFree, Exact(4)),
        ];
        for (c, e) in v8 {
            assert_eq!(c.request_size(Major::V8), e, "{c}");
        }
        for c in Command::ALL.iter().filter(|c| !c.is_v8_only()) {
            if !v8.iter().any(|(v, _)| v == c) {
                assert_eq!(c.request_size(Major::V8), c.request_size(Major::V7), "{c}");
            }
        }
    }

    /// Every command in exactly the classes it belongs to, and the classes consistent with the
    /// response matrix and the request sizes.
    #[test]
    fn command_classes() {
        use Command::*;
        // (command, device query, device property, runs a graph)
        let table = [
            (AllocBuffer, false, false, false),
            (GetAlignment, true, true, false),
            (GetMaxSize, true, true, false),
            (BufferGetBase, false, false, false),
            (FreeBuffer, false, false, false),
            (BufferClear, false, false, false),
            (SetTensor, false, false, false),
            (SetTensorHash, false, false, false),
            (GetTensor, false, false, false),
            (CopyTensor, false, false, false),
            (GraphCompute, false, false, true),
            (GetDeviceMemory, true, true, false),
            (InitTensor, false, false, false),
            (GetAllocSize, true, false, false),
            (Hello, false, false, false),
            (DeviceCount, true, true, false),
            (GraphRecompute, false, false, true),
            (MemsetTensor, false, false, false),
            (SetTensor2d, false, false, false),
            (GetTensor2d, false, false, false),
            (CommInit, false, false, false),
            (CommAllreduce, false, false, false),
            (CommFree, false, false, false),
        ];
        assert_eq!(table.map(|t| t.0), Command::ALL);
        for (c, query, property, graph) in table {
            assert_eq!(c.is_device_query(), query, "{c}");
            assert_eq!(c.is_device_property(), property, "{c}");
            assert_eq!(c.runs_graph(), graph, "{c}");
        }
        for c in Command::ALL {
            if c.is_device_query() {
                // Answered, fixed-size both ways, the same in both majors.
                assert!(c.has_response(), "{c}");
                assert!(!c.is_v8_only() && !c.runs_graph(), "{c}");
                assert!(crate::Response::fixed_size(c).is_some(), "{c}");
                let size = c.request_size(Major::V7);
                assert!(matches!(size, PayloadSize::Exact(_)), "{c}");
                assert_eq!(size, c.request_size(Major::V8), "{c}");
                // A property's request is at most a device index.
                let small = matches!(size, PayloadSize::Exact(n) if n <= 4);
                assert_eq!(small, c.is_device_property(), "{c}");
            }
            assert!(!c.is_device_property() || c.is_device_query(), "{c}");
            if c.runs_graph() {
                assert!(!c.has_response() && !c.is_v8_only(), "{c}");
            }
        }
    }

    /// What a request names lies within its payload, in every major that has the command; a
    /// device query names a device or only the server; our link slots are our extensions'.
    #[test]
    fn targets_lie_within_the_payload() {
        for c in Command::EVERY {
            let head = c.target().head_len() as u64;
            for m in Major::ALL
                .into_iter()
                .filter(|m| m.command(c.as_u8()).is_some())
            {
                let (PayloadSize::Exact(n) | PayloadSize::AtLeast(n)) = c.request_size(m);
                assert!(head <= n, "{c} ({m}): {head} > {n}");
            }
            if c.is_device_query() {
                assert!(
                    matches!(c.target(), Target::Server | Target::Device { .. }),
                    "{c}"
                );
            }
            if matches!(c.target(), Target::LinkSlot { .. }) {
                assert!(c.is_extension(), "{c}");
            }
            // A data head is exactly the fixed part of a request whose size is open-ended.
            if let Some(h) = c.data_head() {
                assert!(h <= crate::DATA_HEAD_MAX, "{c}");
                for m in Major::ALL
                    .into_iter()
                    .filter(|m| m.command(c.as_u8()).is_some())
                {
                    assert_eq!(
                        c.request_size(m),
                        PayloadSize::AtLeast(h as u64),
                        "{c} ({m})"
                    );
                }
            }
        }
        assert_eq!(Command::CopyTensor.target(), Target::Tensors(2));
        assert_eq!(Command::GetAllocSize.target().head_len(), 3260);
        assert_eq!(Command::GraphCompute.target(), Target::Graph);
    }

    #[test]
    fn response_matrix() {
        let with: Vec<u8> = Command::ALL
            .iter()
            .filter(|c| c.has_response())
            .map(|c| c.as_u8())
            .collect();
        assert_eq!(with, [0, 1, 2, 3, 7, 8, 9, 11, 13, 14, 15, 19, 20]);
    }
}
