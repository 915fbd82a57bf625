//! The operating system calls that rustix offers only as `unsafe` (Linux), wrapped where the
//! condition that makes them sound is checked or fixed by the wrapper itself. With `ggml/`, the
//! only module allowed `unsafe` code.

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
