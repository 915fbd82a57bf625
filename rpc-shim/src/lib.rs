//! `rpc-shim`: RDMA (or TCP) for an unmodified, TCP-only llama.cpp.
//!
//! The shim runs next to llama.cpp. `llama-cli --rpc 127.0.0.1:50152` talks to it over loopback
//! TCP; it carries the ggml RPC traffic (8.0.0; 7.0.0 on `--proto7-port`, translated for an 8.0.0
//! worker, see `session`) to a remote worker (`rpc-server` of this workspace,
//! or a stock `ggml-rpc-server`), over RDMA when it can engage (upstream's Linux RC or Apple UC
//! flavor, negotiated inside HELLO exactly as a stock client does), else over TCP. One local port
//! per worker.
//!
//! ```text
//!  llama.cpp ──TCP──▶ 127.0.0.1:50152 ┐            ┌─ control connection (TCP): queries, cache fill
//!  (short conns:                      │ rpc-shim   │
//!   HELLO + 1-2 queries) ─────────────┤ cache ─────┤
//!  (long conn: buffers,               │            └─ one upstream connection per client connection
//!   SET_TENSOR, GRAPH_*) ─────────────┘               that needs one (TCP or RDMA) ──▶ worker
//! ```
//!
//! - [`session`](crate::session) (private): one client connection. HELLO is answered locally
//!   (the listener's major, zero caps); DEVICE_COUNT / GET_ALIGNMENT / GET_MAX_SIZE / GET_ALLOC_SIZE come from the
//!   [`cache`]; everything else goes over the connection's own upstream connection, opened on
//!   first need, with correct framing and no waiting on commands that have no response.
//! - [`worker`]: the cache, the control connection (released while a client connection has
//!   its own upstream, since a stock server serves one connection at a time) and liveness.
//! - [`upstream`]: TCP setup with timeouts and keepalive, HELLO as a client, RDMA negotiation.
//! - [`shim`](crate::shim): listeners.
//! - [`comm`]: COMM_INIT rewritten so that two workers behind the shim reach each other.
//! - [`endpoint`]: `--one-endpoint`, one listener whose devices are every worker's: commands
//!   routed by device and buffer ([`endpoint::route`], sans-IO), COPY_TENSOR between workers
//!   carried from worker to worker without the client.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cache;
pub mod cli;
pub mod comm;
pub mod endpoint;
pub mod error;
mod session;
pub mod shim;
pub mod stats;
pub mod upstream;
pub mod worker;

pub use error::ShimError;
pub use shim::{serve, serve_endpoint, start, start_endpoint, Running, RunningEndpoint};
pub use stats::{ShimStats, StatsSnapshot};
pub use upstream::{
    Connector, FlavorChoice, Options, RdmaSettings, RealConnector, TransportMode, Upstream,
};
pub use worker::Worker;
