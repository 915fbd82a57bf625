//! Why a session refused a request. Every variant closes the connection (the protocol has no
//! error replies); none of them affects other connections.

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("device {device} does not exist (this server has {count})")]
    BadDevice { device: u32, count: usize },
    #[error("unknown buffer handle {0:#x}")]
    UnknownBuffer(u64),
    #[error("invalid tensor '{name}': {why}")]
    InvalidTensor { name: String, why: String },
    #[error("{what}: region out of bounds ({detail})")]
    OutOfBounds { what: &'static str, detail: String },
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
    #[error("GRAPH_RECOMPUTE on device {0} without a stored graph")]
    NoStoredGraph(u32),
    #[error("device: {device}, graph with uid {uid} not found")]
    GraphNotFound { device: u32, uid: u64 },
    #[error("no communicator for device {0}")]
    NoCommunicator(u32),
    #[error("link to the peer server: {0}")]
    Comm(String),
    #[error("HELLO is only allowed as the first command")]
    UnexpectedHello,
    #[error("cannot create a backend on device {0}")]
    Backend(String),
    #[error("INIT_TENSOR: {0}")]
    InitTensor(&'static str),
    #[error(transparent)]
    Graph(rpc_ggml::GraphError),
    #[error("out of memory building {0}")]
    OutOfMemory(&'static str),
    #[error("{0}: the buffer is in use")]
    BufferBusy(&'static str),
    #[error("malformed request: {0}")]
    Decode(#[from] rpc_proto::DecodeError),
    #[error("staging of {0} bytes is over the memory limits (--max-alloc-per-connection, --max-alloc-total)")]
    OverBudget(u64),
}

impl SessionError {
    pub(crate) fn tensor(t: &rpc_proto::RpcTensor, why: impl Into<String>) -> SessionError {
        SessionError::InvalidTensor {
            name: t.name_str(),
            why: why.into(),
        }
    }

    /// A buffer access of command `what` that failed (after its region was checked, so only
    /// the flag of a buffer in use can make it fail).
    pub(crate) fn access(what: &'static str) -> impl Fn(rpc_ggml::Access) -> SessionError {
        move |a| match a {
            rpc_ggml::Access::OutOfBounds => SessionError::OutOfBounds {
                what,
                detail: "outside the buffer".into(),
            },
            rpc_ggml::Access::Busy => SessionError::BufferBusy(what),
        }
    }
}

/// A graph's error as the session reports it: the index checks' refusals as before they moved to
/// rpc-ggml (an unschedulable check: an invalid graph; a value out of range: out of bounds; an
/// index tensor that cannot be read: out of memory), everything else as it is. Refusals that
/// name a tensor are mapped with the wire tensor's name by `graph.rs`.
impl From<rpc_ggml::GraphError> for SessionError {
    fn from(e: rpc_ggml::GraphError) -> SessionError {
        use rpc_ggml::{GraphError, IndexError};
        match e {
            GraphError::Index(IndexError::Unschedulable(why)) => SessionError::InvalidGraph(why),
            GraphError::Index(IndexError::OutOfRange { what, detail }) => {
                SessionError::OutOfBounds { what, detail }
            }
            GraphError::Index(IndexError::Unreadable) => SessionError::OutOfMemory("index check"),
            e => SessionError::Graph(e),
        }
    }
}
