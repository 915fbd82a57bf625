//! The front of one client connection, in the process that listens: the HELLO within its
//! deadline, a connection slot (`admission.rs`), then either the session right here
//! (`--no-isolate`) or, contained, the device queries a front answers itself and the hand-off to
//! a session process of its own at the first other command (`handoff/`).

use rpc_session::Session;
use rpc_transport::BlockingTcpTransport;

use crate::admission::{Admission, Admitted};
use crate::connection::{
    read_hello, run_in, send_hello, serve_hello_in, ConnectionContext, ConnectionError, Scope,
};
use crate::handoff::Isolation;

/// Serves one TCP connection on the calling thread (which it has to itself: TCP reads and
/// writes block it): HELLO (transport negotiation), then the command loop over TCP or RDMA.
/// The connection takes one of the server's slots (`admission`) only once its HELLO is in; while
/// it holds nothing a new client may take that slot (`admission::Slots`), which ends it cleanly.
pub async fn serve(
    stream: std::net::TcpStream,
    admission: Admission,
    ctx: ConnectionContext,
    isolate: Option<&Isolation>,
) -> Result<(), ConnectionError> {
    let peer = stream.peer_addr()?;
    let local_ip = stream.local_addr()?.ip();
    // Shut down by a new client that evicts this connection.
    let evict = stream.try_clone()?;
    let opts = ctx.options.clone();
    let mut tcp = BlockingTcpTransport::new(stream, Some(ctx.shutdown.clone()), opts.poll_window)?;
    // A contained connection's socket may change hands after any request: read no further
    // ahead than each request.
    tcp.set_read_ahead(isolate.is_none());
    // A client sends HELLO right after connecting; one that does not is closed, and holds no
    // connection slot meanwhile.
    let hello = opts.hello_deadline();
    let Some(caps) = read_hello(&mut tcp, hello, ctx.major, &opts.limits()).await? else {
        return Ok(());
    };
    let mut stop = ctx.shutdown.clone();
    let Some(admitted) = admission.enter(&mut stop, peer, evict).await else {
        return Ok(());
    };
    match serve_admitted(tcp, peer, local_ip, caps, ctx, &admitted, isolate).await {
        Err(e) if admitted.evicted() => {
            tracing::debug!(%peer, "evicted connection ended: {e}");
            Ok(())
        }
        r => r,
    }
}

/// [`serve`] once the connection holds a slot.
async fn serve_admitted(
    mut tcp: BlockingTcpTransport,
    peer: std::net::SocketAddr,
    local_ip: std::net::IpAddr,
    caps: [u8; rpc_proto::CONN_CAPS_SIZE],
    ctx: ConnectionContext,
    admitted: &Admitted,
    isolate: Option<&Isolation>,
) -> Result<(), ConnectionError> {
    if let Some(iso) = isolate {
        // A TCP client: the front answers its HELLO and the immutable queries after it, and the
        // first other command starts its session process; a connection that only asks questions
        // costs no process. A client offering RDMA gets its process at once (the queue pair is
        // that process's to set up, in the HELLO reply).
        let mut pending = None;
        if !ctx.rdma.engages(&caps) {
            let front = Session::new(ctx.config.clone(), ctx.major, ctx.budget.clone());
            let hello = front.hello([0; rpc_proto::CONN_CAPS_SIZE]);
            send_hello(&mut tcp, hello, &ctx.stats).await?;
            let (limits, deadlines) = (ctx.options.limits(), ctx.options.deadlines());
            let (stats, stop) = (ctx.stats.clone(), ctx.shutdown.clone());
            let queries = run_in(
                &mut tcp,
                front,
                limits,
                stats,
                deadlines,
                stop,
                Scope::FrontQueries,
            );
            match queries.await? {
                Some(h) => pending = Some(h.encode()),
                None => return Ok(()),
            }
        }
        // From here the connection is its session process's, which may hold anything: it is
        // never evicted. One evicted while its first command's header arrived ends unserved.
        if !admitted.keep() {
            return Ok(());
        }
        let pending = pending.as_ref();
        return crate::handoff::hand_off(iso, tcp.into_stream()?, peer, &caps, pending, &ctx).await;
    }
    serve_hello_in(tcp, local_ip, caps, ctx, || {}, Some(admitted)).await
}
