//! The client's error type.

use rpc_proto::DecodeError;

/// Why a client call failed.
///
/// The protocol has no error replies: a server that rejects a request simply closes the
/// connection, which shows up here as [`ClientError::Closed`]. After any error the
/// connection should be considered unusable (framing may be lost).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An I/O error other than the peer closing the connection.
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    /// The peer closed (or reset) the connection. This is how a ggml RPC server reports
    /// that it refused a request.
    #[error("connection closed by the server")]
    Closed,
    /// The server sent a response that does not fit the request (wrong size prefix,
    /// malformed payload, data where none was expected).
    #[error("bad response: {0}")]
    BadResponse(String),
    /// The server's HELLO reply announces a protocol version this client does not speak
    /// (it accepts `8.0.x` and `7.0.x`).
    #[error("server speaks protocol {major}.{minor}.{patch}, this client speaks 8.0.x and 7.0.x")]
    VersionMismatch {
        /// Server protocol major version.
        major: u8,
        /// Server protocol minor version.
        minor: u8,
        /// Server protocol patch version.
        patch: u8,
    },
    /// The caller passed something that cannot be encoded (e.g. more than 10 sources).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl ClientError {
    /// Whether this error means the server closed the connection.
    pub fn is_closed(&self) -> bool {
        matches!(self, ClientError::Closed)
    }
}

impl From<DecodeError> for ClientError {
    fn from(e: DecodeError) -> Self {
        ClientError::BadResponse(e.to_string())
    }
}

impl From<std::io::Error> for ClientError {
    /// End-of-stream, reset, aborted and broken-pipe errors become [`ClientError::Closed`];
    /// everything else stays [`ClientError::Io`].
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
                ClientError::Closed
            }
            _ => ClientError::Io(e),
        }
    }
}
