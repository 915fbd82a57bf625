//! The session pool (`--session-pool N`): session processes started ahead by one thread of the
//! front, each contained as a TCP session's is and with its devices open, waiting on its
//! control line for a connection; a take hands out the oldest and starts a replacement.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use crate::control::SessionStart;
use crate::options::ServerOptions;

use super::spawn::spawn_session;

/// Session processes started ahead (`--session-pool`), each contained as a TCP session's is
/// and with its devices open, waiting on its control line for a connection
/// (`child::await_connection`). One thread of the front starts them all and lives as long as
/// the pool: a session process is killed when the thread that started it ends (its parent-death
/// signal, rpc-contain's `namespaces.rs`), so none may be started by a connection's thread,
/// which ends first. A pooled process whose front goes away ends: its control line closes, and
/// its parent-death signal fires.
pub(super) struct Pool {
    shared: Arc<PoolShared>,
    /// Asks the pool's thread to start replacements; dropped, the thread ends the waiting ones
    /// and exits.
    refill: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How long after a take the pool starts its replacement.
const REFILL_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

struct PoolShared {
    size: usize,
    exe: PathBuf,
    /// The message they are started with: the front's options, TCP only (the containment of a
    /// session whose HELLO the front answered); the connection's own comes at the hand-off.
    template: SessionStart,
    waiting: Mutex<std::collections::VecDeque<Waiting>>,
}

/// A pooled session process and the front's end of its control line.
pub(super) struct Waiting {
    pub(super) child: std::process::Child,
    pub(super) ctl: UnixStream,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Pool {
    /// Starts the pool's thread, which fills it.
    pub(super) fn start(
        size: usize,
        exe: PathBuf,
        options: &ServerOptions,
    ) -> std::io::Result<Pool> {
        let shared = Arc::new(PoolShared {
            size,
            exe,
            template: SessionStart {
                options: options.clone(),
                caps: [0; rpc_proto::CONN_CAPS_SIZE],
                pending: None,
                peer: String::new(),
                major: rpc_proto::Major::V8.number(),
                tcp_only: true,
            },
            waiting: Mutex::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let filler = shared.clone();
        let thread = std::thread::Builder::new()
            .name("session-pool".into())
            .spawn(move || {
                filler.refill();
                while rx.recv().is_ok() {
                    // Not while the taken process serves its first command: a process start
                    // competes with it for the cores. Requests meanwhile are one refill.
                    std::thread::sleep(REFILL_DELAY);
                    while rx.try_recv().is_ok() {}
                    filler.refill();
                }
                filler.close();
            })?;
        Ok(Pool {
            shared,
            refill: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The oldest waiting process still alive (one that ended while waiting is let go); a
    /// replacement is started in the background either way.
    pub(super) fn take(&self) -> Option<Waiting> {
        let taken = self.shared.take();
        if let Some(tx) = &*self.refill.lock().unwrap_or_else(PoisonError::into_inner) {
            let _ = tx.send(());
        }
        taken
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        drop(
            self.refill
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(t) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = t.join();
        }
    }
}

impl PoolShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts processes until `size` are waiting (on the pool's thread only).
    fn refill(&self) {
        while self.lock().len() < self.size {
            match spawn_session(&self.exe, &self.template, None, None) {
                Ok((child, ctl)) => {
                    tracing::debug!(pid = child.id(), "pooled session process started");
                    self.lock().push_back(Waiting { child, ctl });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a pooled session process");
                    return;
                }
            }
        }
    }

    fn take(&self) -> Option<Waiting> {
        let mut waiting = self.lock();
        while let Some(mut w) = waiting.pop_front() {
            match w.child.try_wait() {
                Ok(None) => return Some(w),
                Ok(Some(status)) => tracing::warn!(
                    pid = w.child.id(),
                    %status,
                    "a pooled session process ended while waiting (see its log)"
                ),
                Err(e) => {
                    tracing::warn!(pid = w.child.id(), error = %e, "a pooled session process cannot be checked; not used")
                }
            }
        }
        None
    }

    /// Ends the waiting processes: their lines close, and the kill covers one still starting.
    fn close(&self) {
        let waiting = std::mem::take(&mut *self.lock());
        for mut w in waiting {
            drop(w.ctl);
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}
