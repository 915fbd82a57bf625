//! TCP: the protocol's native transport. `TCP_NODELAY`, buffered reads, vectored writes.

use std::io::{self, IoSlice};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::Transport;

/// A TCP connection with a read buffer sized for pipelined small commands.
pub struct TcpTransport {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

impl TcpTransport {
    /// Wraps a connected stream (sets `TCP_NODELAY`).
    pub fn new(stream: TcpStream) -> io::Result<TcpTransport> {
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        Ok(TcpTransport {
            rd: BufReader::with_capacity(256 * 1024, rd),
            wr,
        })
    }

    /// Bytes received but not consumed yet (must be empty before switching transports).
    pub fn buffered(&self) -> usize {
        self.rd.buffer().len()
    }

    /// The underlying halves, e.g. to keep the socket as a liveness anchor under RDMA.
    pub fn into_inner(self) -> (BufReader<OwnedReadHalf>, OwnedWriteHalf) {
        (self.rd, self.wr)
    }
}

impl Transport for TcpTransport {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.rd.read(buf).await
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.rd.read_exact(buf).await.map(|_| ())
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        let mut idx = 0;
        while idx < parts.len() {
            let slices: Vec<IoSlice<'_>> = parts[idx..].iter().map(|p| IoSlice::new(*p)).collect();
            let mut n = self.wr.write_vectored(&slices).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            while idx < parts.len() && n >= parts[idx].len() {
                n -= parts[idx].len();
                idx += 1;
            }
            if n > 0 {
                parts[idx] = &parts[idx][n..];
            }
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "TCP"
    }
}
