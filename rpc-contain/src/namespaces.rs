//! A session process's own identity and view of the system (Linux; part of containment, the
//! default). What reaches the session process is attacker-shaped, so it runs where it can reach
//! nothing but its own client, as OpenSSH's unprivileged child and a browser's renderer do:
//!
//! - **its own PID namespace**: it is process 1 of a namespace holding only itself; the front,
//!   the other sessions and every other process have no number it could signal or trace;
//! - **its own network namespace**: only a loopback that is down; the client's socket (and a
//!   server-to-server link the front passes down) keep working, as they were made outside;
//! - **its own mount namespace and root**: a read-only tmpfs holding only what a session reads
//!   (system libraries, `/sys`, a few `/dev` nodes, the weight cache and `--gguf` files read-only,
//!   a `/proc` of its own PID namespace); no home, no `/tmp`, no `/etc` beyond the loader cache;
//! - **an identity that owns nothing**: as root, a dedicated unprivileged uid and gid
//!   ([`session_uid`], no supplementary groups), so file permissions see a stranger; as another
//!   user, a user namespace in which its capabilities are then dropped (bounding set included);
//! - IPC, UTS and cgroup namespaces of its own; no controlling terminal (`setsid`); killed with
//!   its parent (`PR_SET_PDEATHSIG`).
//!
//! It is done in two stages because a PID namespace takes effect only for children: the process
//! the front starts (the outer stage, [`run_outer`]) unshares the namespaces and forks (it has one
//! thread) a copy that is process 1 inside them (the inner stage), waits for it and mirrors how it
//! ended; the inner stage builds its view ([`enter_view`]) and drops its identity
//! ([`drop_identity`]) before `sandbox.rs` adds rlimits, Landlock and the system-call filter —
//! all before any thread is started and any byte from the client is read. Any step that fails
//! refuses the session (`--no-sandbox` turns all of it off).

use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

/// The first uid (and gid) of session processes when the server runs as root: above the ranges
/// that distributions, systemd (dynamic users, 61184–65519; containers, 524288–1879048191) and
/// container runtimes hand out, so no file on the system belongs to it.
pub const SESSION_UID_BASE: u32 = 0x7F00_0000;
/// How many distinct session uids there are ([`session_uid`]).
pub const SESSION_UIDS: u32 = 0x10000;

/// The uid and gid of the session process started by outer-stage process `pid`: distinct among
/// sessions running at the same time (pids are unique among running processes, and fewer than
/// 65536 sessions run at once), so no two sessions share an identity either.
pub fn session_uid(pid: u32) -> u32 {
    SESSION_UID_BASE + pid % SESSION_UIDS
}

/// How the inner stage becomes nobody in particular.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The server runs as root: switch to this uid and gid, no groups.
    Dedicated(u32),
    /// A user namespace in which the process is uid 0 (the server's own uid outside): drop every
    /// capability, bounding set included.
    UserNamespace,
}

impl Identity {
    pub fn describe(self) -> String {
        match self {
            Identity::Dedicated(uid) => format!("uid {uid}, no groups, no capabilities"),
            Identity::UserNamespace => {
                "a user namespace of its own, no capabilities (the server's uid outside)"
                    .to_string()
            }
        }
    }
}

/// A step of the set-up that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub struct SetupError {
    pub step: String,
    #[source]
    pub source: std::io::Error,
}

fn at<T, E: Into<std::io::Error>>(
    step: impl Into<String>,
    r: Result<T, E>,
) -> Result<T, SetupError> {
    r.map_err(|e| SetupError {
        step: step.into(),
        source: e.into(),
    })
}

/// How many threads this process has (from `/proc/self/task`).
pub fn thread_count() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// The namespaces of a session: everything but time.
const NAMESPACES: UnshareFlags = UnshareFlags::NEWPID
    .union(UnshareFlags::NEWNS)
    .union(UnshareFlags::NEWNET)
    .union(UnshareFlags::NEWIPC)
    .union(UnshareFlags::NEWUTS)
    .union(UnshareFlags::NEWCGROUP);

/// Outer stage, the first thing the process the front started does (one thread): unshares the
/// namespaces, forks the session into them (the client's socket, the control line and stderr
/// are the copy's too; `Outer::Inner` there), waits for it and returns the exit code that mirrors
/// its end (a signal `n` becomes `128 + n`, which the front reports as that signal). Returns an
/// error, and starts nothing, when a namespace cannot be made.
pub fn run_outer() -> Result<Outer, SetupError> {
    use rustix::process::Signal;
    // If the front dies, so does this process, and with it (its own death signal) the session.
    at(
        "PR_SET_PDEATHSIG",
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL)),
    )?;
    let threads = at("count threads", thread_count())?;
    if threads != 1 {
        return Err(SetupError {
            step: "unshare".into(),
            source: std::io::Error::other(format!("{threads} threads exist already")),
        });
    }
    let identity = if rustix::process::geteuid().is_root() {
        at(
            "unshare namespaces",
            crate::sys_linux::unshare_namespaces(NAMESPACES),
        )?;
        Identity::Dedicated(session_uid(std::process::id()))
    } else {
        let (uid, gid) = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        at(
            "unshare a user namespace (unprivileged user namespaces may be off: sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)",
            crate::sys_linux::unshare_namespaces(UnshareFlags::NEWUSER | NAMESPACES),
        )?;
        at(
            "write /proc/self/setgroups",
            std::fs::write("/proc/self/setgroups", "deny"),
        )?;
        at(
            "write /proc/self/uid_map",
            std::fs::write("/proc/self/uid_map", format!("0 {uid} 1")),
        )?;
        at(
            "write /proc/self/gid_map",
            std::fs::write("/proc/self/gid_map", format!("0 {gid} 1")),
        )?;
        Identity::UserNamespace
    };
    // One thread still (checked above): the copy continues as the session, process 1 of the
    // new PID namespace, without a second program start.
    match at(
        "fork into the namespaces",
        crate::sys_linux::fork_single_threaded(),
    )? {
        crate::sys_linux::Forked::Child => Ok(Outer::Inner(identity)),
        crate::sys_linux::Forked::Parent(pid) => {
            let status = loop {
                match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
                    Ok(Some((_, st))) => break st,
                    Ok(None) | Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return at("wait for the session", Err(e)),
                }
            };
            Ok(Outer::Exited(
                match (status.exit_status(), status.terminating_signal()) {
                    (Some(code), _) => code,
                    (None, Some(sig)) => 128 + sig,
                    _ => 1,
                },
            ))
        }
    }
}

/// How [`run_outer`] ended in this process.
pub enum Outer {
    /// This is the outer process: the session ended with this exit code.
    Exited(i32),
    /// This is the session, inside its namespaces: it goes on to [`enter_view`].
    Inner(Identity),
}

/// Where the kernel says whether RDMA devices are shared by every network namespace (`Y`, the
/// default) or belong to one (`N`: `rdma system set netns exclusive`).
const RDMA_NETNS_MODE: &str = "/sys/module/ib_core/parameters/netns_mode";

/// Whether RDMA devices are in the kernel's exclusive network-namespace mode, in which a
/// session's own network namespace has none (its client stays on TCP). `text`: the content of
/// `RDMA_NETNS_MODE` (`/sys/module/ib_core/parameters/netns_mode`).
pub fn rdma_netns_exclusive_in(text: &str) -> bool {
    matches!(text.trim(), "N" | "n" | "0")
}

/// [`rdma_netns_exclusive_in`] of this machine; false where there is no RDMA core module.
pub fn rdma_netns_exclusive() -> bool {
    std::fs::read_to_string(RDMA_NETNS_MODE).is_ok_and(|t| rdma_netns_exclusive_in(&t))
}

/// What the session's view holds besides the system: the weight cache and `--gguf` files (all
/// read-only) and whether RDMA devices are wanted.
#[derive(Debug, Default, Clone)]
pub struct View {
    /// Directories to see read-only at their own path (the weight cache).
    pub dirs: Vec<PathBuf>,
    /// Files to see read-only at their own path (`--gguf` files, their index).
    pub files: Vec<PathBuf>,
    /// `/dev/infiniband` (RDMA verbs devices).
    pub rdma: bool,
}

/// System directories a session reads: the program's libraries and those it loads later (RDMA
/// providers, GPU runtimes).
const SYSTEM_DIRS: &[&str] = &["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"];
/// Single system files: the dynamic loader's cache, the RDMA provider list.
const SYSTEM_PATHS: &[&str] = &["/etc/ld.so.cache", "/etc/libibverbs.d"];
/// Device nodes every session may use.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// GPU device nodes, for the builds that drive a GPU.
#[cfg(feature = "cuda")]
const GPU_DEVICE_PREFIXES: &[&str] = &["nvidia"];
#[cfg(all(feature = "vulkan", not(feature = "cuda")))]
const GPU_DEVICE_PREFIXES: &[&str] = &["dri"];
#[cfg(not(any(feature = "cuda", feature = "vulkan")))]
const GPU_DEVICE_PREFIXES: &[&str] = &[];

/// Where the new root is built: a tmpfs mounted over `/tmp` of the new mount namespace (the
/// outside `/tmp` is not touched: the mount is private to the session).
const NEW_ROOT: &str = "/tmp";
const OLD_ROOT: &str = ".old-root";

/// One path of the view: where it is outside, and a handle to it taken before anything is
/// mounted over it.
struct Source {
    path: PathBuf,
    handle: rustix::fd::OwnedFd,
    kind: Kind,
}

#[derive(PartialEq)]
enum Kind {
    Dir,
    File,
    /// A symbolic link, recreated as it is (e.g. `/lib -> usr/lib`).
    Link(PathBuf),
}

fn source(path: &Path) -> Option<Source> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let kind = if meta.file_type().is_symlink() {
        Kind::Link(std::fs::read_link(path).ok()?)
    } else if meta.is_dir() {
        Kind::Dir
    } else {
        Kind::File
    };
    let handle = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .ok()?;
    Some(Source {
        path: path.to_path_buf(),
        handle,
        kind,
    })
}

/// A path the operator named (`-c`, `--gguf`): seen at the path as named (made absolute against
/// the working directory, which the session keeps), holding what it leads to (symbolic links
/// followed), so that the session opens it by the same name as the front.
fn named_source(path: &Path) -> Option<Source> {
    let path = std::path::absolute(path).ok()?;
    let kind = if std::fs::metadata(&path).ok()?.is_dir() {
        Kind::Dir
    } else {
        Kind::File
    };
    let handle = rustix::fs::open(&path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).ok()?;
    Some(Source { path, handle, kind })
}

/// The view's sources, in mount order (a directory before anything inside it).
fn sources(view: &View) -> Vec<Source> {
    let mut paths: Vec<PathBuf> = SYSTEM_DIRS
        .iter()
        .chain(SYSTEM_PATHS)
        .chain(DEVICES)
        .map(PathBuf::from)
        .collect();
    paths.push("/sys".into());
    if view.rdma {
        paths.push("/dev/infiniband".into());
    }
    if let Ok(dev) = std::fs::read_dir("/dev") {
        for e in dev.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if GPU_DEVICE_PREFIXES.iter().any(|p| name.starts_with(p)) {
                paths.push(e.path());
            }
        }
    }
    let mut all: Vec<Source> = paths.iter().filter_map(|p| source(p)).collect();
    all.extend(
        view.dirs
            .iter()
            .chain(&view.files)
            .filter_map(|p| named_source(p)),
    );
    all.sort_by_key(|s| s.path.components().count());
    all.dedup_by(|a, b| a.path == b.path);
    all
}

/// The flags of the mount a source lives on that a remount must keep (in a user namespace the
/// kernel refuses to clear them: they are locked).
fn kept_flags(handle: &rustix::fd::OwnedFd) -> MountFlags {
    use rustix::fs::StatVfsMountFlags as V;
    let Ok(st) = rustix::fs::fstatvfs(handle) else {
        return MountFlags::empty();
    };
    [
        (V::NOEXEC, MountFlags::NOEXEC),
        (V::NODEV, MountFlags::NODEV),
        (V::NOSUID, MountFlags::NOSUID),
        (V::NOATIME, MountFlags::NOATIME),
        (V::NODIRATIME, MountFlags::NODIRATIME),
        (V::RELATIME, MountFlags::RELATIME),
    ]
    .into_iter()
    .filter(|(v, _)| st.f_flag.contains(*v))
    .fold(MountFlags::empty(), |acc, (_, m)| acc | m)
}

/// `target` inside the new root.
fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

fn mkdir_all(p: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(p)
}

/// Builds the session's root and enters it: private mounts, a tmpfs holding the sources bound
/// read-only at their own paths, a `/proc` of the new PID namespace, `pivot_root`, the old root
/// detached, the new one read-only. Runs as (namespace) root, before [`drop_identity`].
pub fn enter_view(view: &View) -> Result<(), SetupError> {
    at(
        "PR_SET_PDEATHSIG",
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)),
    )?;
    // Nothing mounted here propagates back to the system.
    at(
        "make every mount private",
        rustix::mount::mount_change(
            "/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        ),
    )?;
    let sources = sources(view);
    let root = Path::new(NEW_ROOT);
    at(
        "mount the new root (tmpfs)",
        rustix::mount::mount(
            "rpc-session",
            root,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            Some(c"mode=0755,size=1m"),
        ),
    )?;
    for s in &sources {
        let target = inside(root, &s.path);
        if std::fs::symlink_metadata(&target).is_ok() {
            // Already seen, read-only, through a directory bound before it (a --gguf file in
            // the cache directory).
            continue;
        }
        if let Some(parent) = target.parent() {
            at(format!("mkdir {}", parent.display()), mkdir_all(parent))?;
        }
        match &s.kind {
            Kind::Link(to) => {
                at(
                    format!("symlink {}", s.path.display()),
                    rustix::fs::symlink(to, &target),
                )?;
                continue;
            }
            Kind::Dir => at(format!("mkdir {}", target.display()), mkdir_all(&target))?,
            Kind::File => {
                at(
                    format!("create {}", target.display()),
                    std::fs::File::create(&target),
                )?;
            }
        }
        let from = format!(
            "/proc/self/fd/{}",
            rustix::fd::AsRawFd::as_raw_fd(&s.handle)
        );
        at(
            format!("bind {}", s.path.display()),
            // Alone where the kernel allows it; in a user namespace a directory with mounts
            // below it (`/sys`) can only be bound with them.
            rustix::mount::mount_bind(from.as_str(), &target).or_else(|e| {
                if e == rustix::io::Errno::INVAL && s.kind == Kind::Dir {
                    rustix::mount::mount_bind_recursive(from.as_str(), &target)
                } else {
                    Err(e)
                }
            }),
        )?;
        // Read-only, no set-uid; device nodes keep working (a read-only mount does not stop
        // writes to a device).
        let mut flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID;
        if !s.path.starts_with("/dev") {
            flags |= MountFlags::NODEV;
        }
        flags |= kept_flags(&s.handle);
        at(
            format!("make {} read-only", s.path.display()),
            rustix::mount::mount_remount(&target, flags, ""),
        )?;
    }
    let proc_dir = root.join("proc");
    at("mkdir /proc", mkdir_all(&proc_dir))?;
    at(
        "mount /proc of the session's PID namespace",
        rustix::mount::mount(
            "proc",
            &proc_dir,
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RDONLY,
            None,
        ),
    )?;
    // The working directory stays (relative `--gguf` paths are named from it), empty unless
    // something in the view is under it.
    let cwd = std::env::current_dir().ok();
    if let Some(c) = &cwd {
        if std::fs::symlink_metadata(inside(root, c)).is_err() {
            at("mkdir the working directory", mkdir_all(&inside(root, c)))?;
        }
    }
    let old = root.join(OLD_ROOT);
    at("mkdir the old root", mkdir_all(&old))?;
    at("pivot_root", rustix::process::pivot_root(root, &old))?;
    at("chdir /", rustix::process::chdir("/"))?;
    let old = Path::new("/").join(OLD_ROOT);
    at(
        "detach the old root",
        rustix::mount::unmount(&old, UnmountFlags::DETACH),
    )?;
    at(
        "remove the old root's mount point",
        std::fs::remove_dir(&old),
    )?;
    at(
        "make the new root read-only",
        rustix::mount::mount_remount(
            "/",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            "",
        ),
    )?;
    if let Some(c) = cwd {
        at("chdir to the working directory", rustix::process::chdir(&c))?;
    }
    Ok(())
}

/// Becomes nobody in particular ([`Identity`]), with no way back: a new session without a
/// controlling terminal, no new privileges on exec.
pub fn drop_identity(identity: Identity) -> Result<(), SetupError> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    // No controlling terminal: /dev/tty and terminal signals are out of reach.
    at("setsid", rustix::process::setsid())?;
    // No capability can come back, whatever the identity (as root this needs CAP_SETPCAP,
    // which root still has here).
    for cap in CapabilitySet::all().iter() {
        // Capabilities this kernel does not know answer EINVAL: nothing to drop.
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return at("drop the capability bounding set", Err(e)),
        }
    }
    match identity {
        Identity::Dedicated(id) => {
            let (uid, gid) = (
                rustix::process::Uid::from_raw(id),
                rustix::process::Gid::from_raw(id),
            );
            at(
                "drop supplementary groups",
                rustix::thread::set_thread_groups(&[]),
            )?;
            at(
                "setresgid",
                rustix::thread::set_thread_res_gid(gid, gid, gid),
            )?;
            // Leaving uid 0 clears every capability (no SECBIT_KEEP_CAPS).
            at(
                "setresuid",
                rustix::thread::set_thread_res_uid(uid, uid, uid),
            )?;
        }
        Identity::UserNamespace => {
            at(
                "drop every capability",
                rustix::thread::set_capabilities(
                    None,
                    CapabilitySets {
                        effective: CapabilitySet::empty(),
                        permitted: CapabilitySet::empty(),
                        inheritable: CapabilitySet::empty(),
                    },
                ),
            )?;
        }
    }
    at(
        "PR_SET_NO_NEW_PRIVS",
        rustix::thread::set_no_new_privs(true),
    )?;
    // A change of uid clears the parent-death signal: set it again.
    at(
        "PR_SET_PDEATHSIG",
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)),
    )?;
    let caps = at("read capabilities", rustix::thread::capabilities(None))?;
    if !caps.permitted.is_empty() || !caps.effective.is_empty() {
        return Err(SetupError {
            step: "drop capabilities".into(),
            source: std::io::Error::other("capabilities remain"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_netns_mode_as_the_kernel_prints_it() {
        assert!(rdma_netns_exclusive_in("N\n"));
        assert!(!rdma_netns_exclusive_in("Y\n"));
        assert!(!rdma_netns_exclusive_in(""));
    }

    #[test]
    fn session_uids_are_distinct_per_pid_and_above_every_allocated_range() {
        assert_ne!(session_uid(100), session_uid(101));
        for pid in [0, 1, 65535, 65536, 4_194_304] {
            let u = session_uid(pid);
            assert!((SESSION_UID_BASE..SESSION_UID_BASE + SESSION_UIDS).contains(&u));
            assert!(u > 1_879_048_191, "above systemd's container range");
        }
    }

    #[test]
    fn the_view_is_built_a_parent_before_its_children() {
        let d = std::env::temp_dir().join(format!("ns-view-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/f"), b"x").unwrap();
        // A named file that is a link: seen at the link's name, holding the file.
        std::os::unix::fs::symlink(d.join("sub/f"), d.join("link")).unwrap();
        let view = View {
            dirs: vec![d.clone()],
            files: vec![d.join("sub/f"), d.join("link")],
            rdma: false,
        };
        let s = sources(&view);
        let pos = |p: &Path| s.iter().position(|x| x.path == p).unwrap();
        assert!(pos(&d) < pos(&d.join("sub/f")));
        assert!(s[pos(&d.join("link"))].kind == Kind::File);
        assert!(s.iter().any(|x| x.path == Path::new("/dev/null")));
        assert!(!s
            .iter()
            .any(|x| x.path.starts_with("/home") || x.path == Path::new("/etc")));
        std::fs::remove_dir_all(&d).ok();
    }
}
