//! The front's watch on a handed-off client: a handle on its socket, never read, and a thread
//! asleep in `poll` until the client is gone; then the session process gets a grace to end,
//! its socket is shut down, and it is killed.

use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// How long a session process whose client left may take to end by itself before the front
/// shuts the client's socket down, and then again before it kills the process.
pub const HANGUP_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// The front's own handle on a handed-off connection's socket, which it never reads, and a
/// thread of its own asleep in `poll` on it until the client is gone: its FIN (`POLLRDHUP`; a
/// client that half-closes is gone too, as a read of the end of stream tells a session), a
/// reset, or the kernel giving up on a peer that vanished (keepalive, `TCP_USER_TIMEOUT`:
/// `POLLERR`/`POLLHUP`). Neither a request nor a reply wakes it. A session process may not
/// notice its client leave (one that never reads: compromised, stopped), so the front ends it
/// ([`ClientWatch::enforce`]): the slot, the peer share and the process never outlive the
/// client by more than `2 × HANGUP_GRACE` past the moment the kernel knows it is gone.
pub(super) struct ClientWatch {
    socket: Arc<std::net::TcpStream>,
    /// How the client left, once it did.
    hangup: tokio::sync::oneshot::Receiver<&'static str>,
    /// Dropped with the watch: the thread's `poll` wakes and the thread ends.
    _stop: UnixStream,
}

impl ClientWatch {
    pub(super) fn start(
        socket: std::net::TcpStream,
        peer: SocketAddr,
    ) -> std::io::Result<ClientWatch> {
        let socket = Arc::new(socket);
        let (stop, stopped) = UnixStream::pair()?;
        let (tx, hangup) = tokio::sync::oneshot::channel();
        let watched = socket.clone();
        std::thread::Builder::new()
            .name("client-watch".into())
            .stack_size(256 << 10)
            .spawn(move || match wait_for_hangup(&watched, &stopped) {
                Ok(Some(how)) => drop(tx.send(how)),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(%peer, error = %e, "cannot watch a session's client any more")
                }
            })?;
        Ok(ClientWatch {
            socket,
            hangup,
            _stop: stop,
        })
    }

    /// Resolves only once the client is gone and its session process `pid` did not end by
    /// itself: [`HANGUP_GRACE`] after the client left the front shuts the socket down (which
    /// wakes a session blocked reading or writing it), another [`HANGUP_GRACE`] later it kills
    /// the process. Returns how the client left.
    pub(super) async fn enforce(&mut self, peer: SocketAddr, pid: u32) -> &'static str {
        let Ok(how) = (&mut self.hangup).await else {
            return std::future::pending().await;
        };
        tracing::debug!(%peer, pid, "client gone ({how}): its session process has {HANGUP_GRACE:?} to end");
        tokio::time::sleep(HANGUP_GRACE).await;
        tracing::info!(%peer, pid, "client gone ({how}) and its session process still runs: shutting the connection down");
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        tokio::time::sleep(HANGUP_GRACE).await;
        if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
        how
    }
}

/// Sleeps in `poll` until the client of `socket` is gone (how, in words) or `stop` stirs
/// (`None`). Linux wakes it only for those (`POLLRDHUP`, `POLLHUP`, `POLLERR`); elsewhere there
/// is no `POLLRDHUP` and it looks every 200 ms for `POLLHUP` (a FIN or a dead connection).
fn wait_for_hangup(
    socket: &std::net::TcpStream,
    stop: &UnixStream,
) -> std::io::Result<Option<&'static str>> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let (watched, tick): (PollFlags, Option<Timespec>) = (PollFlags::RDHUP, None);
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let (watched, tick) = (
        PollFlags::HUP,
        Some(Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        }),
    );
    loop {
        let mut fds = [
            PollFd::new(socket, watched),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, tick.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let [client, stopped] = fds.map(|f| f.revents());
        if !stopped.is_empty() {
            return Ok(None);
        }
        if client.contains(PollFlags::ERR) {
            return Ok(Some(
                "its connection failed: reset, or found dead by keepalive",
            ));
        }
        if client.intersects(PollFlags::HUP | watched) {
            return Ok(Some("it closed the connection"));
        }
        if tick.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}
