//! The operating system calls that need `unsafe` (Linux: `unshare`, which rustix marks unsafe,
//! and `fork`), wrapped where the condition that makes them sound is checked or fixed by the
//! wrapper itself. With `seatbelt.rs` (macOS), the only module of the crate allowed `unsafe`
//! code (rpc-server has none; ggml's FFI is the `rpc-ggml` crate).

use rustix::thread::UnshareFlags;

/// `unshare(2)` for the namespace flags only: new user, PID, mount, network, IPC, UTS and
/// cgroup namespaces. rustix marks `unshare` unsafe because `CLONE_FILES` would leave other
/// threads holding descriptors of a table this thread no longer shares; that flag (and
/// `CLONE_FS`, `CLONE_SYSVSEM`) is masked off here, so no descriptor table is split.
pub fn unshare_namespaces(flags: UnshareFlags) -> std::io::Result<()> {
    let namespaces = UnshareFlags::NEWUSER
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWNET
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    let flags = flags & namespaces;
    // SAFETY: `flags` holds namespace flags only (masked above): no CLONE_FILES, so no thread
    // can observe a descriptor from a table it does not share.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(std::io::Error::from)
}

/// Which side of [`fork_single_threaded`] this is.
pub enum Forked {
    /// The original process; the child's pid.
    Parent(rustix::process::Pid),
    /// The copy.
    Child,
}

/// `fork(2)` of a process that has exactly one thread, which is checked here (`/proc/self/task`).
/// Forking is unsound in general because the child gets only the calling thread while locks
/// other threads held stay locked in its copy of memory; with one thread there are no others,
/// so the child may do anything the parent could.
pub fn fork_single_threaded() -> std::io::Result<Forked> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(std::io::Error::other(format!(
            "fork with {threads} threads: only a single-threaded process may fork"
        )));
    }
    // SAFETY: the process has one thread (checked above; nothing between the check and the
    // call starts another), so no lock is held by a thread the child would not have.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        p => rustix::process::Pid::from_raw(p)
            .map(Forked::Parent)
            .ok_or_else(|| std::io::Error::other("fork returned an invalid pid")),
    }
}
