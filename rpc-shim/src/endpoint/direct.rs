//! COPY_TENSOR between two of our workers over their own link, never through the shim.
//!
//! Our servers know a small extension (`rpc_proto::Command::EXTENSIONS`): LINK_PROBE ("one of
//! ours? which port?"), LINK_OPEN (a worker-to-worker link in one of the connection's slots, set
//! up under the server's comm-link policy, RDMA where the link has it), LINK_SEND and LINK_RECV
//! (a tensor's bytes over the link; no replies) and LINK_CLOSE.
//!
//! - **Probe.** The first upstream connection to an 8.0 worker carries LINK_PROBE. A stock server
//!   closes a connection on a command it does not know: the shim then reopens it (nothing was
//!   allocated on it yet) and remembers the worker as stock; copies from and to it keep passing
//!   through the shim.
//! - **Open.** The first copy between workers `i < j`, both ours, opens their link for this client
//!   connection: worker `i` is rank 0 (it listens on its own RPC port + 1000, the port LINK_PROBE
//!   reported), worker `j` rank 1 (it dials `i`'s host as the shim reaches it). Worker `i` keeps
//!   the link in slot `j`, worker `j` in slot `i` (so at most [`LINK_SLOTS`] workers use links).
//!   A link that does not open (a policy refusal, a port taken) leaves the pair on the shim path
//!   for the connection's life. A refused rank 1 costs rank 0 its set-up wait (10 s) once.
//! - **Copy.** The client is answered 1 at once; LINK_SEND goes to the source's worker and
//!   LINK_RECV to the destination's, each flushed at once, in the client's order: the bytes leave
//!   after the commands before the copy on the source (the compute that made them) and land before
//!   the commands after it on the destination, and the shim waits for nothing.

use rpc_proto::{CommInit, Command, Major, Request, Response, COMM_PORT_OFFSET, LINK_SLOTS};
use rpc_transport::Transport;

use super::{CrossCopy, Endpoint};
use crate::error::ShimError;
use crate::session::read_response_size;
use crate::upstream::{timeout, Connector};

/// Whether a pair of workers has its own link for this client connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pair {
    /// LINK_OPEN succeeded on both.
    Linked,
    /// Copies between the two pass through the shim.
    ThroughShim,
}

impl<C: Connector> Endpoint<C> {
    /// LINK_PROBE on worker `w`'s fresh upstream connection (an 8.0 worker not probed yet): what
    /// it found is kept on the worker; `false` when the worker closed the connection on it (a
    /// stock server), which must then be reopened.
    pub(super) async fn probe(&mut self, w: usize) -> Result<bool, ShimError> {
        let addr = self.addr(w);
        let wait = self.workers[w].core.opts.handshake_timeout;
        let up = self.ups[w].as_mut().expect("opened by the caller");
        if up.major != Major::V8 {
            self.workers[w].core.set_links(None);
            return Ok(true);
        }
        let mut frame = Vec::new();
        Request::LinkProbe.encode(&mut frame);
        up.batch.push_frame(&frame);
        let answer = tokio::time::timeout(wait, async {
            up.batch
                .flush(&mut up.conn)
                .await
                .map_err(ShimError::upstream(&addr))?;
            let size = read_response_size(&mut up.conn, &addr, Command::LinkProbe, 0).await?;
            let mut rsp = vec![0u8; size as usize];
            up.conn
                .read_exact(&mut rsp)
                .await
                .map_err(ShimError::upstream(&addr))?;
            Ok::<_, ShimError>(rsp)
        })
        .await;
        let port = match answer {
            Ok(Ok(rsp)) => match Response::decode(Command::LinkProbe, &rsp) {
                Ok(Response::LinkProbe { port, .. }) => {
                    u16::try_from(port).ok().filter(|&p| p != 0)
                }
                _ => None,
            },
            Ok(Err(e)) => {
                tracing::debug!(worker = %addr, "LINK_PROBE: {e}");
                self.workers[w].core.set_links(None);
                return Ok(false);
            }
            Err(_) => return Err(timeout(&addr, "LINK_PROBE", wait)),
        };
        self.workers[w].core.set_links(port);
        Ok(true)
    }

    /// Whether copies between workers `a` and `b` go over their own link, opening it on the
    /// pair's first copy.
    async fn pair(&mut self, a: usize, b: usize) -> Result<Pair, ShimError> {
        let (i, j) = (a.min(b), a.max(b));
        if let Some(&p) = self.pairs.get(&(i, j)) {
            return Ok(p);
        }
        self.up(i).await?;
        self.up(j).await?;
        let p = self.open_pair(i, j).await?;
        self.pairs.insert((i, j), p);
        Ok(p)
    }

    /// LINK_OPEN on workers `i < j` (see the module docs).
    async fn open_pair(&mut self, i: usize, j: usize) -> Result<Pair, ShimError> {
        let (Some(Some(port_i)), Some(Some(_))) =
            (self.workers[i].core.links(), self.workers[j].core.links())
        else {
            return Ok(Pair::ThroughShim);
        };
        let (Ok(slot_i), Ok(slot_j)) = (u32::try_from(j), u32::try_from(i)) else {
            return Ok(Pair::ThroughShim);
        };
        if slot_i >= LINK_SLOTS || slot_j >= LINK_SLOTS {
            return Ok(Pair::ThroughShim);
        }
        let addr_i = self.addr(i);
        let Some(host) = host_of(&addr_i).and_then(CommInit::host_field) else {
            return Ok(Pair::ThroughShim);
        };
        let port = u32::from(port_i) + u32::from(COMM_PORT_OFFSET);
        let init = |rank, host| CommInit {
            device: 0,
            rank,
            world: 2,
            port,
            host,
        };
        let opens = [
            (i, slot_i, init(0, [0; rpc_proto::COMM_HOST_SIZE])),
            (j, slot_j, init(1, host)),
        ];
        for (w, slot, init) in opens {
            self.send_now(w, &Request::LinkOpen { slot, init }).await?;
        }
        let mut ok = [false; 2];
        for (k, (w, _, _)) in opens.iter().enumerate() {
            let addr = self.addr(*w);
            let up = self.ups[*w].as_mut().expect("opened above");
            read_response_size(&mut up.conn, &addr, Command::LinkOpen, 0).await?;
            let mut b = [0u8; 1];
            up.conn
                .read_exact(&mut b)
                .await
                .map_err(ShimError::upstream(&addr))?;
            ok[k] = b[0] == 1;
        }
        if ok == [true, true] {
            tracing::info!(from = %addr_i, to = %self.addr(j),
                "copies between these workers go over their own link");
            return Ok(Pair::Linked);
        }
        tracing::warn!(rank0 = %addr_i, rank0_opened = ok[0], rank1 = %self.addr(j), rank1_opened = ok[1],
            "no worker-to-worker link (see the workers' logs); copies between them pass through the shim");
        for (k, (w, slot, _)) in opens.iter().enumerate() {
            if ok[k] {
                let mut frame = Vec::new();
                Request::LinkClose { slot: *slot }.encode(&mut frame);
                if let Some(up) = self.ups[*w].as_mut() {
                    up.batch.push_frame(&frame);
                }
            }
        }
        Ok(Pair::ThroughShim)
    }

    /// `req` after what is collected for worker `w` (whose upstream connection is open), all
    /// written now.
    async fn send_now(&mut self, w: usize, req: &Request<'_>) -> Result<(), ShimError> {
        let mut frame = Vec::new();
        req.encode(&mut frame);
        let addr = self.addr(w);
        let up = self.ups[w].as_mut().expect("opened by the caller");
        up.batch.push_frame(&frame);
        up.batch
            .flush(&mut up.conn)
            .await
            .map_err(ShimError::upstream(&addr))
    }

    /// COPY_TENSOR between two workers over their link, if the pair has one: answered at once,
    /// LINK_SEND and LINK_RECV on their way. `false`: the pair has none (the caller copies
    /// through the shim).
    pub(super) async fn copy_direct(&mut self, c: &CrossCopy) -> Result<bool, ShimError> {
        if self.pair(c.from, c.to).await? != Pair::Linked {
            return Ok(false);
        }
        self.respond(&[1]).await?;
        let sends = [
            (
                c.from,
                Request::LinkSend {
                    slot: c.to as u32,
                    tensor: c.src,
                    size: c.bytes,
                },
            ),
            (
                c.to,
                Request::LinkRecv {
                    slot: c.from as u32,
                    tensor: c.dst,
                    size: c.bytes,
                },
            ),
        ];
        for (w, req) in sends {
            // At once: a worker waiting in LINK_RECV must not wait on a LINK_SEND still here.
            self.send_now(w, &req).await?;
        }
        self.copies.0 += 1;
        self.copies.2 += c.bytes;
        self.copies.3 += 1;
        Ok(true)
    }
}

/// The host part of `host:port` (an IPv6 address without its brackets).
fn host_of(addr: &str) -> Option<&str> {
    let (host, _) = addr.rsplit_once(':')?;
    Some(host.trim_start_matches('[').trim_end_matches(']'))
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn host_of_addresses() {
        assert_eq!(host_of("127.0.0.1:50052"), Some("127.0.0.1"));
        assert_eq!(host_of("[::1]:50052"), Some("::1"));
        assert_eq!(host_of("worker-3.local:50052"), Some("worker-3.local"));
        assert_eq!(host_of("nocolon"), None);
    }
}
