//! Starting a session process and passing descriptors to it: its configuration in the
//! environment, the client's socket as its stdin (or, for a pooled process, in the assignment
//! line), its control line as its stdout, its stderr relayed to the front's log; and the
//! front's replies that carry a descriptor (`SCM_RIGHTS`).

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::control::{SessionStart, SESSION_START_ENV};

use super::relay::relay_stderr;

/// Starts a session process: `client` given, for that connection (its socket as stdin, `start`
/// in the environment); else a pooled one that waits for its connection. Returns it and the
/// front's end of its control line (its stdout); its stderr is relayed to the front's log.
pub(super) fn spawn_session(
    exe: &std::path::Path,
    start: &SessionStart,
    client: Option<std::net::TcpStream>,
    peer: Option<SocketAddr>,
) -> std::io::Result<(std::process::Child, UnixStream)> {
    let (front_end, child_end) = UnixStream::pair()?;
    let mut cmd = Command::new(exe);
    cmd.arg("--session-child");
    // The peer in the command line is a label for `ps`; the message configures the process.
    if let Some(p) = peer {
        cmd.arg("--session-peer").arg(p.to_string());
    }
    let stdin = match client {
        Some(s) => Stdio::from(OwnedFd::from(s)),
        None => {
            cmd.arg("--session-wait");
            Stdio::null()
        }
    };
    cmd.env(SESSION_START_ENV, start.encode())
        .stdin(stdin)
        .stdout(Stdio::from(OwnedFd::from(child_end)))
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal reaches the front, which shuts the
        // sessions down in order (`Q`), not every session process at once.
        .process_group(0);
    let mut child = cmd.spawn()?;
    drop(cmd); // the parent's copies of the socket and of the session's end of the control line
    let label = match peer {
        Some(p) => p.to_string(),
        None => "pooled".to_string(),
    };
    if let Some(err) = child.stderr.take() {
        relay_stderr(err, label, child.id());
    }
    Ok((child, front_end))
}

/// Hands a connection to a waiting process: the assignment line with the client's socket.
pub(super) fn assign(
    ctl: &UnixStream,
    start: &SessionStart,
    client: &impl AsFd,
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let msg = start.assignment();
    let fds = [client.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let mut sent = loop {
        match sendmsg(
            ctl,
            &[std::io::IoSlice::new(&msg)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    while sent < msg.len() {
        match rustix::net::send(ctl, msg.get(sent..).unwrap_or(&[]), SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::Error::other("control line closed")),
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends `msg` with `fd` attached (`SCM_RIGHTS`).
pub(super) async fn send_fd(
    wr: &tokio::net::unix::OwnedWriteHalf,
    msg: &[u8],
    fd: &impl AsFd,
) -> std::io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let sock: &tokio::net::UnixStream = wr.as_ref();
    loop {
        sock.writable().await?;
        let fds = [fd.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let r = sock.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg(
                sock,
                &[std::io::IoSlice::new(msg)],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(std::io::Error::from)
        });
        match r {
            Ok(n) if n == msg.len() => return Ok(()),
            Ok(_) => return Err(std::io::Error::other("short control write")),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
