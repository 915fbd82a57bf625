//! Transports that carry ggml RPC bytes: TCP today, RDMA flavors behind the same trait.
//!
//! The protocol layer talks to a [`Transport`]: it reads exact byte counts and sends *messages*
//! made of *parts*. A part is what upstream calls one `send_data()`; on TCP parts are just
//! concatenated, but upstream's Linux RDMA flavor maps every part to its own SEND(s) and its
//! receiver depends on those boundaries, so the distinction must survive up to here.

#![forbid(unsafe_code)]

use std::future::Future;
use std::io;
use std::time::Instant;

pub mod cli;
pub mod tcp;

pub use tcp::{BlockingTcpTransport, TcpTransport};

/// A bidirectional, ordered byte transport for one RPC connection.
pub trait Transport: Send {
    /// Reads up to `buf.len()` bytes; `Ok(0)` means the peer closed the connection.
    fn read(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<usize>> + Send;

    /// Reads up to `buf.len()` bytes, waiting no later than `deadline` (`None`: no limit):
    /// `Ok(None)` when nothing arrived by then, `Ok(Some(0))` when the peer closed.
    fn read_by(
        &mut self,
        buf: &mut [u8],
        deadline: Option<Instant>,
    ) -> impl Future<Output = io::Result<Option<usize>>> + Send {
        async move {
            match deadline {
                None => self.read(buf).await.map(Some),
                Some(d) => match tokio::time::timeout_at(d.into(), self.read(buf)).await {
                    Ok(r) => r.map(Some),
                    Err(_) => Ok(None),
                },
            }
        }
    }

    /// Reads exactly `buf.len()` bytes.
    fn read_exact(&mut self, buf: &mut [u8]) -> impl Future<Output = io::Result<()>> + Send;

    /// Sends one message whose parts are upstream `send_data()` calls, then flushes it.
    fn send_message(&mut self, parts: &[&[u8]]) -> impl Future<Output = io::Result<()>> + Send;

    /// Short name for logs and banners ("TCP", "RDMA/RC", ...).
    fn name(&self) -> &'static str;
}

pub mod rdma;
