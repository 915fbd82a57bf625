//! The shim's error type. Every error ends one downstream connection (the protocol has no error
//! replies: a peer refuses by closing), never the shim.

use std::io;

use rpc_client::ClientError;
use rpc_proto::{Command, DecodeError};

/// Why a downstream connection (or an upstream connection attempt) ended.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// I/O on the downstream (llama.cpp) side.
    #[error("client i/o: {0}")]
    Client(io::Error),
    /// The client sent a frame the protocol does not allow (unknown command, wrong size).
    #[error("malformed request from the client: {0}")]
    Decode(#[from] DecodeError),
    /// The client's first command was not HELLO.
    #[error("expected HELLO as the client's first command, got command {0}")]
    ExpectedHello(u8),
    /// The client sent HELLO again after the handshake (a server closes on that too).
    #[error("client sent a second HELLO")]
    SecondHello,
    /// A device index beyond the worker's device count (a server closes on that too).
    #[error("{cmd}: device {device} does not exist (the worker has {count})")]
    NoSuchDevice {
        /// The command.
        cmd: Command,
        /// The requested device.
        device: u32,
        /// The worker's device count.
        count: u32,
    },
    /// The TCP connection to the worker could not be established.
    #[error("worker {worker}: cannot connect: {err}")]
    Connect {
        /// `host:port` of the worker.
        worker: String,
        /// The cause.
        err: io::Error,
    },
    /// The worker did not answer in time.
    #[error("worker {worker}: no answer within {secs:.1} s ({what})")]
    Timeout {
        /// `host:port` of the worker.
        worker: String,
        /// What was awaited.
        what: &'static str,
        /// The limit.
        secs: f64,
    },
    /// The worker announced a protocol version this shim does not relay.
    #[error(
        "worker {worker} speaks protocol {major}.{minor}.{patch}; the shim relays 8.0.x and 7.0.x"
    )]
    Version {
        /// `host:port` of the worker.
        worker: String,
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
        /// Patch version.
        patch: u8,
    },
    /// I/O with the worker failed or the worker closed the connection.
    #[error("worker {worker}: {err}")]
    Upstream {
        /// `host:port` of the worker.
        worker: String,
        /// The cause (`UnexpectedEof` when the worker closed the connection).
        err: io::Error,
    },
    /// The worker answered with a size that does not fit the request.
    #[error("worker {worker}: bad response to {cmd}: {err}")]
    BadResponse {
        /// `host:port` of the worker.
        worker: String,
        /// The command answered.
        cmd: Command,
        /// The mismatch.
        err: String,
    },
    /// The worker sent bytes while no response was pending.
    #[error("worker {0} sent data while no response was pending")]
    Unsolicited(String),
    /// The worker was found dead (its idle connection closed or it cannot be reached).
    #[error("worker {0} is gone")]
    WorkerDown(String),
    /// The client's listener speaks a newer protocol than the worker (8.0.0 client, 7.0.0
    /// worker): 8.0's graph uids, strided copies and collectives have no 7.0 equivalent.
    #[error("worker {worker} speaks protocol {worker_major} but this client connection speaks {client_major}, which a {worker_major} worker cannot serve: upgrade the worker (our rpc-server serves both), or use a {worker_major} llama.cpp on the shim's port of that protocol")]
    WorkerTooOld {
        /// `host:port` of the worker.
        worker: String,
        /// What the worker announced.
        worker_major: rpc_proto::Major,
        /// What the client's listener speaks.
        client_major: rpc_proto::Major,
    },
    /// A one-endpoint request that no worker may serve (see `endpoint::route`).
    #[error("{0}")]
    Route(#[from] RouteError),
    /// `--transport rdma` and RDMA could not engage for this connection.
    #[error("worker {worker}: RDMA required (--transport rdma) but {reason}")]
    RdmaRequired {
        /// `host:port` of the worker.
        worker: String,
        /// Why RDMA did not engage.
        reason: String,
    },
}

impl ShimError {
    /// An upstream I/O error for `worker`.
    pub fn upstream(worker: &str) -> impl FnOnce(io::Error) -> ShimError + '_ {
        move |err| ShimError::Upstream {
            worker: worker.to_string(),
            err,
        }
    }

    /// A failed client call to `worker` (asking `cmd`): a refusal or a broken connection is an
    /// upstream error, a reply that does not fit is a bad response.
    pub fn from_client(worker: &str, cmd: Command, err: ClientError) -> ShimError {
        let worker = worker.to_string();
        match err {
            ClientError::Io(err) => ShimError::Upstream { worker, err },
            ClientError::Closed => ShimError::Upstream {
                worker,
                err: io::ErrorKind::UnexpectedEof.into(),
            },
            ClientError::BadResponse(err) => ShimError::BadResponse { worker, cmd, err },
            ClientError::VersionMismatch {
                major,
                minor,
                patch,
            } => ShimError::Version {
                worker,
                major,
                minor,
                patch,
            },
            ClientError::InvalidArgument(what) => ShimError::Upstream {
                worker,
                err: io::Error::other(what),
            },
        }
    }

    /// Whether the error is the worker's side (as opposed to the client's request or socket).
    pub fn is_upstream(&self) -> bool {
        matches!(
            self,
            ShimError::Connect { .. }
                | ShimError::Timeout { .. }
                | ShimError::Version { .. }
                | ShimError::WorkerTooOld { .. }
                | ShimError::Upstream { .. }
                | ShimError::BadResponse { .. }
                | ShimError::Unsolicited(_)
                | ShimError::WorkerDown(_)
                | ShimError::RdmaRequired { .. }
        )
    }
}

/// A request the one endpoint refuses (the client connection is closed, as a server would close
/// it for the same request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A device index past the endpoint's devices.
    #[error("{cmd}: device {device} does not exist (the endpoint has {count})")]
    NoSuchDevice {
        /// The command.
        cmd: rpc_proto::Command,
        /// The index asked for.
        device: u32,
        /// The endpoint's device count.
        count: u32,
    },
    /// A buffer handle this connection was never given (or has freed).
    #[error("{cmd}: buffer {handle:#x} was not allocated on this connection")]
    UnknownBuffer {
        /// The command.
        cmd: rpc_proto::Command,
        /// The handle.
        handle: u64,
    },
    /// Tensors of one command on two workers (other than COPY_TENSOR's source and destination).
    #[error("{cmd}: its tensors lie on workers {a} and {b}; one command runs on one worker")]
    Split {
        /// The command.
        cmd: rpc_proto::Command,
        /// One worker.
        a: usize,
        /// Another.
        b: usize,
    },
    /// COMM_ALLREDUCE: the endpoint's devices have no communicator.
    #[error("COMM_ALLREDUCE: device {0} has no communicator (the endpoint answered COMM_INIT 0)")]
    NoCommunicator(u32),
    /// A payload too short for its command or a malformed graph.
    #[error("{cmd}: malformed request: {why}")]
    Malformed {
        /// The command.
        cmd: rpc_proto::Command,
        /// What is wrong.
        why: String,
    },
}
