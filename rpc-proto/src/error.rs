//! The single error type of every decoder in this crate.

use crate::command::Command;

/// Why some bytes are not a valid protocol message (7.0.0 or 8.0.0).
///
/// The protocol has no error frames: a server that gets any of these closes the
/// connection (spec §3.2), a client treats it as a broken server.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The command byte is not a command of the connection's major (`RPC_CMD_NONE` or above).
    #[error("unknown command {0}")]
    UnknownCommand(u8),
    /// A fixed-size request or response has the wrong payload size.
    #[error("{cmd} payload is {got} bytes, expected exactly {expected}")]
    BadSize {
        /// The command whose payload is wrong.
        cmd: Command,
        /// The payload size that was received or announced.
        got: u64,
        /// The only size this command accepts.
        expected: u64,
    },
    /// A payload (or a part of it) is shorter than its own fields require.
    #[error("{what} too short: need {need} bytes, got {got}")]
    TooShort {
        /// What was being decoded.
        what: &'static str,
        /// Bytes required.
        need: u64,
        /// Bytes available.
        got: u64,
    },
    /// A size or count exceeds the configured [`Limits`](crate::Limits).
    #[error("{what} is {got}, over the limit of {limit}")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// The announced value.
        got: u64,
        /// The configured maximum.
        limit: u64,
    },
    /// The command has no response, so there is nothing to decode.
    #[error("{0} has no response")]
    NoResponse(Command),
    /// Structurally invalid payload (e.g. trailing bytes after a graph).
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}
