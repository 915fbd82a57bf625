//! The session process's sandbox on Linux (part of containment, the default), installed by the
//! inner stage right after its namespaces, root and identity (`namespaces.rs`), while it has one
//! thread and before it reads a byte from the client; any layer that cannot be installed
//! refuses the session (`--no-sandbox` turns containment off):
//!
//! - **seccomp-bpf, default deny**: an allow-list ([`allowed`]) of the system calls real
//!   sessions make (measured: `docs/containment-syscalls.md`), several only with the arguments
//!   they need: `clone` for threads only, `kill`/`tgkill` to itself only, `socket` only for the
//!   RDMA netlink family of RDMA sessions, `socketpair` only of Unix sockets (the runtime's
//!   signal wake-up; a pair within the process), `ioctl` only for its request list (no `TIOCSTI`),
//!   `prctl` for thread names, `prlimit64` on itself, `mmap`/`mprotect` never executable (CPU
//!   builds), `fcntl` without signal ownership. Everything else (exec, new processes, sockets,
//!   `memfd_create`, shared memory, `chmod`/`chown`/`*xattr`, mounts, namespaces, `ptrace`,
//!   `pidfd_*`, keyrings, BPF, `io_uring`, identity changes, …) answers `EPERM`. A call of
//!   another architecture (i386 through `int 0x80`) kills the process; x32 numbers are not on
//!   the list. `clone3` answers `ENOSYS`, so the C library falls back to `clone`, whose flags
//!   the filter can see.
//! - **Landlock**: read-only access to the system's libraries, `/proc`, `/sys`, the weight cache
//!   and the `--gguf` files; read-write access to device files only. (The mount view already
//!   holds nothing else; Landlock is the second wall.) It binds only the threads created after
//!   it, so it is installed while the process has one thread, which is checked.
//! - **rlimits**: no core files; at most 1024 descriptors; as root at most 1024 threads for
//!   the session's own uid; and, once the session knows its budget ([`limit_memory`]), its whole
//!   address space (shared mappings included) bounded by the budget plus a fixed allowance.
//!
//! `RPC_SANDBOX_SELFTEST=1` makes each session process try forbidden actions once it serves and
//! log the outcome (rpc-server's `child/contain.rs`; `tests/tests/isolate.rs` asserts on those lines).
//! macOS: `sandbox_mac.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Beyond the buffers a session holds: graphs, staging, the runtime, ggml's thread pool, the
/// program and its libraries.
const ADDRESS_ALLOWANCE: u64 = 2 << 30;
/// Descriptors a session may hold (it holds a handful: its socket, control line, stderr, the
/// runtime's, `--gguf` files, an RDMA device).
const MAX_FILES: u64 = 1024;
/// Threads of one session (as root, where the session has a uid of its own).
const MAX_THREADS: u64 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("landlock: not enforced (this kernel has no Landlock)")]
    NoLandlock,
    #[error("{0} threads exist already (Landlock would not bind them)")]
    Threads(usize),
    #[error("rlimit: {0}")]
    Rlimit(#[from] std::io::Error),
}

/// What the filter must let a session do beyond plain CPU serving.
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// RDMA verbs: a netlink socket of the RDMA family (device discovery) and the verbs ioctl.
    pub rdma: bool,
    /// A GPU backend (CUDA, Vulkan): any ioctl but the terminal's, executable mappings (drivers
    /// load and JIT code), no address-space bound.
    pub gpu: bool,
}

impl Needs {
    /// What this build and session need.
    pub fn of_build(rdma: bool) -> Needs {
        Needs {
            rdma,
            gpu: cfg!(any(feature = "cuda", feature = "vulkan")),
        }
    }
}

/// What was installed, for the session's log and the banner.
#[derive(Debug, Clone)]
pub struct Installed {
    pub syscalls: usize,
    pub landlock: &'static str,
}

/// `arch_prctl` codes (x86_64, asm/prctl.h) and the AMX tile data feature.
#[cfg(target_arch = "x86_64")]
const ARCH_GET_XCOMP_PERM: u32 = 0x1022;
#[cfg(target_arch = "x86_64")]
const ARCH_REQ_XCOMP_PERM: u32 = 0x1023;
#[cfg(target_arch = "x86_64")]
const XFEATURE_XTILE_DATA: u64 = 18;

/// A condition on argument `arg`: equal to `v` (64-bit compare).
#[cfg(target_arch = "x86_64")]
fn eq(arg: u8, v: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, v)
        .expect("argument index below 6")
}

/// A condition on argument `arg`: equal to `v` in its low 32 bits (an `int` argument).
fn eq32(arg: u8, v: u32) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, u64::from(v))
        .expect("argument index below 6")
}

/// A condition: argument `arg` has none of the bits of `mask`.
fn none_of(arg: u8, mask: u64) -> SeccompCondition {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        0,
    )
    .expect("argument index below 6")
}

fn rule(conds: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conds).expect("a rule has at least one condition")
}

/// Allowed with any arguments.
const PLAIN: &[libc::c_long] = &[
    // memory
    libc::SYS_brk,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    // threads and waiting
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_getcpu,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
    // signals, to itself
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    // time
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    // I/O on descriptors it holds
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_lseek,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    // files it may see (the mount view and Landlock decide which)
    libc::SYS_openat,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getcwd,
    // about itself
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_capget,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_getrusage,
    libc::SYS_times,
    libc::SYS_getrandom,
];

/// The x86_64-only spellings of the same needs.
#[cfg(target_arch = "x86_64")]
const PLAIN_X86_64: &[libc::c_long] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_readlink,
    libc::SYS_poll,
    libc::SYS_select,
    libc::SYS_epoll_wait,
    libc::SYS_dup2,
    libc::SYS_getrlimit,
    libc::SYS_getdents,
    libc::SYS_time,
];
#[cfg(not(target_arch = "x86_64"))]
const PLAIN_X86_64: &[libc::c_long] = &[];

/// `ioctl` requests a CPU session makes: non-blocking mode, close-on-exec, bytes readable, and
/// the RDMA verbs ioctl (`RDMA_VERBS_IOCTL`, `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`).
const IOCTLS: &[u32] = &[
    libc::FIONBIO as u32,
    libc::FIOCLEX as u32,
    libc::FIONCLEX as u32,
    libc::FIONREAD as u32,
    0xc018_1b01,
];

/// `prctl` options: a thread's name (Rust and OpenMP name their threads), whether it may dump.
const PRCTLS: &[u32] = &[
    libc::PR_SET_NAME as u32,
    libc::PR_GET_NAME as u32,
    libc::PR_GET_DUMPABLE as u32,
];

/// `fcntl` commands: descriptor and status flags, duplication, seals read. Not `F_SETOWN`/
/// `F_SETSIG` (signals sent by the kernel on its behalf), not locks.
const FCNTLS: &[u32] = &[
    libc::F_GETFD as u32,
    libc::F_SETFD as u32,
    libc::F_GETFL as u32,
    libc::F_SETFL as u32,
    libc::F_DUPFD as u32,
    libc::F_DUPFD_CLOEXEC as u32,
    libc::F_GET_SEALS as u32,
];

/// The allow-list: system call → the argument conditions of which one must hold (empty: any
/// arguments). `pid` is the session's own pid (1, in its PID namespace).
pub fn allowed(needs: Needs, pid: u32) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut m: BTreeMap<i64, Vec<SeccompRule>> = PLAIN
        .iter()
        .chain(PLAIN_X86_64)
        .map(|&nr| (nr, Vec::new()))
        .collect();
    let any_of = |arg: u8, vals: &[u32]| -> Vec<SeccompRule> {
        vals.iter().map(|&v| rule(vec![eq32(arg, v)])).collect()
    };
    // Answered ENOSYS by the first filter ([`seccomp_filters`]): the kernel returns the
    // strictest answer of all filters.
    m.insert(libc::SYS_clone3, Vec::new());
    // Threads, never processes: clone with CLONE_THREAD.
    let thread = libc::CLONE_THREAD as u64;
    m.insert(
        libc::SYS_clone,
        vec![rule(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(thread),
            thread,
        )
        .expect("argument index below 6")])],
    );
    // Signals to itself only (abort, raise).
    m.insert(libc::SYS_kill, vec![rule(vec![eq32(0, pid)])]);
    m.insert(libc::SYS_tgkill, vec![rule(vec![eq32(0, pid)])]);
    // Its own limits, read or lowered (raising a hard limit needs a capability it lacks).
    m.insert(libc::SYS_prlimit64, vec![rule(vec![eq32(0, 0)])]);
    m.insert(libc::SYS_prctl, any_of(0, PRCTLS));
    // A connected pair of Unix sockets within itself (the async runtime's signal wake-up): no
    // reach beyond the process.
    m.insert(
        libc::SYS_socketpair,
        vec![rule(vec![eq32(0, libc::AF_UNIX as u32)])],
    );
    m.insert(libc::SYS_fcntl, any_of(1, FCNTLS));
    // ggml's CPU backend asks for the AMX tile state (on machines that have it) while it
    // computes: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILE_DATA)` and the query of it.
    #[cfg(target_arch = "x86_64")]
    m.insert(
        libc::SYS_arch_prctl,
        vec![
            rule(vec![
                eq32(0, ARCH_REQ_XCOMP_PERM),
                eq(1, XFEATURE_XTILE_DATA),
            ]),
            rule(vec![eq32(0, ARCH_GET_XCOMP_PERM)]),
        ],
    );
    if needs.gpu {
        let tiocsti = SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            u64::from(libc::TIOCSTI as u32),
        )
        .expect("argument index below 6");
        m.insert(libc::SYS_ioctl, vec![rule(vec![tiocsti])]);
        m.insert(libc::SYS_mmap, Vec::new());
        m.insert(libc::SYS_mprotect, Vec::new());
    } else {
        m.insert(libc::SYS_ioctl, any_of(1, IOCTLS));
        // Never executable: the program and its libraries are mapped before the filter.
        let exec = libc::PROT_EXEC as u64;
        m.insert(libc::SYS_mmap, vec![rule(vec![none_of(2, exec)])]);
        m.insert(libc::SYS_mprotect, vec![rule(vec![none_of(2, exec)])]);
    }
    if needs.rdma {
        // Device discovery asks the kernel over netlink (NETLINK_RDMA).
        m.insert(
            libc::SYS_socket,
            vec![rule(vec![
                eq32(0, libc::AF_NETLINK as u32),
                eq32(2, libc::NETLINK_RDMA as u32),
            ])],
        );
        m.insert(libc::SYS_bind, Vec::new());
    }
    m
}

/// The two seccomp filters, in the order they are installed: `clone3` answers `ENOSYS`, then the
/// allow-list (anything else `EPERM`; another architecture kills the process). The first lets
/// the second be installed (`prctl`, `seccomp`), which then allows neither.
fn seccomp_filters(
    needs: Needs,
    pid: u32,
) -> Result<([seccompiler::BpfProgram; 2], usize), SandboxError> {
    let err = |e: seccompiler::BackendError| SandboxError::Seccomp(e.to_string());
    let rules = allowed(needs, pid);
    let n = rules.len();
    let arch = std::env::consts::ARCH.try_into().map_err(err)?;
    let allow = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )
    .map_err(err)?;
    // clone3 hides its flags in memory the filter cannot read: "not implemented" makes the C
    // library fall back to clone.
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    Ok((
        [
            clone3.try_into().map_err(err)?,
            allow.try_into().map_err(err)?,
        ],
        n,
    ))
}

/// Read-only for `read`, read-write device files for `/dev`; `files` are single files.
fn landlock(read_dirs: &[PathBuf], read_files: &[PathBuf]) -> Result<RulesetStatus, SandboxError> {
    let abi = ABI::V5;
    let mut rs = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .create()?;
    let read = AccessFs::from_read(abi);
    let read_file = read & AccessFs::from_file(abi);
    // Device files: opened, read, written and driven by ioctl (RDMA verbs, GPU drivers).
    let rw_files = read | AccessFs::WriteFile | AccessFs::IoctlDev;
    // System libraries: drivers (RDMA providers, GPU runtimes) are loaded when first used.
    let system = [
        "/usr",
        "/lib",
        "/lib64",
        "/etc/ld.so.cache",
        "/etc/libibverbs.d",
        "/proc",
        "/sys",
    ];
    for p in system {
        if let Ok(fd) = PathFd::new(p) {
            let access = if Path::new(p).is_dir() {
                read
            } else {
                read_file
            };
            rs = rs.add_rule(PathBeneath::new(fd, access))?;
        }
    }
    if let Ok(fd) = PathFd::new("/dev") {
        rs = rs.add_rule(PathBeneath::new(fd, rw_files))?;
    }
    for d in read_dirs {
        if let Ok(fd) = PathFd::new(d) {
            rs = rs.add_rule(PathBeneath::new(fd, read))?;
        }
    }
    for f in read_files {
        if let Ok(fd) = PathFd::new(f) {
            rs = rs.add_rule(PathBeneath::new(fd, read_file))?;
        }
    }
    Ok(rs.restrict_self()?.ruleset)
}

/// Memory an RDMA session may pin (registered queue-pair memory): its client's queue pair and
/// the links of its devices, each at most 8 MiB (upstream RC's 24 receives of 256 KiB and a
/// send buffer). The kernel's default is 8 MiB, one queue pair.
pub const RDMA_MEMLOCK: u64 = 64 << 20;

/// Raises the locked-memory limit to [`RDMA_MEMLOCK`] for a session that uses RDMA; called while
/// the process may still raise a hard limit (before it drops its identity). Where it cannot, an
/// RDMA set-up that needs more fails on `ibv_reg_mr` and stays on TCP.
pub fn allow_rdma_memlock() -> Result<(), SandboxError> {
    let now = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    if now.current.is_none_or(|c| c >= RDMA_MEMLOCK) {
        return Ok(());
    }
    set_limit(rustix::process::Resource::Memlock, RDMA_MEMLOCK)
}

fn set_limit(r: rustix::process::Resource, v: u64) -> Result<(), SandboxError> {
    let lim = rustix::process::Rlimit {
        current: Some(v),
        maximum: Some(v),
    };
    rustix::process::setrlimit(r, lim).map_err(|e| SandboxError::Rlimit(e.into()))
}

/// Installs the sandbox on this process, which must have one thread: rlimits, Landlock (read
/// `read_dirs` and `read_files`), then the system-call filter. `own_uid`: the session has a uid
/// of its own, so its thread count can be bounded.
pub fn install(
    needs: Needs,
    read_dirs: &[PathBuf],
    read_files: &[PathBuf],
    own_uid: bool,
) -> Result<Installed, SandboxError> {
    use rustix::process::Resource;
    let threads = crate::namespaces::thread_count()?;
    if threads != 1 {
        return Err(SandboxError::Threads(threads));
    }
    set_limit(Resource::Core, 0)?;
    set_limit(Resource::Nofile, MAX_FILES)?;
    if own_uid {
        set_limit(Resource::Nproc, MAX_THREADS)?;
    }
    let landlock = match landlock(read_dirs, read_files)? {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced (older kernel)",
        RulesetStatus::NotEnforced => return Err(SandboxError::NoLandlock),
    };
    let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
    let (filters, syscalls) = seccomp_filters(needs, pid)?;
    for prog in filters {
        seccompiler::apply_filter_all_threads(&prog)
            .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    }
    Ok(Installed { syscalls, landlock })
}

/// Bounds the session's whole address space (private and shared mappings alike) by its memory
/// budget plus `ADDRESS_ALLOWANCE` (2 GiB), once the budget is known and before the client's first
/// byte is read. Not for GPU builds: their drivers reserve address space far beyond memory.
pub fn limit_memory(budget: u64) -> Result<Option<u64>, SandboxError> {
    if cfg!(any(feature = "cuda", feature = "vulkan")) {
        return Ok(None);
    }
    let limit = budget.saturating_add(ADDRESS_ALLOWANCE);
    if limit >= u64::MAX / 2 {
        return Ok(None);
    }
    set_limit(rustix::process::Resource::As, limit)?;
    Ok(Some(limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_has_no_call_that_reaches_beyond_the_session() {
        for needs in [
            Needs::default(),
            Needs {
                rdma: true,
                gpu: true,
            },
        ] {
            let m = allowed(needs, 1);
            for nr in [
                libc::SYS_execve,
                libc::SYS_execveat,
                libc::SYS_memfd_create,
                libc::SYS_shmget,
                libc::SYS_connect,
                libc::SYS_listen,
                libc::SYS_accept4,
                libc::SYS_ptrace,
                libc::SYS_process_vm_readv,
                libc::SYS_pidfd_open,
                libc::SYS_pidfd_send_signal,
                libc::SYS_tkill,
                libc::SYS_fchmod,
                libc::SYS_fchmodat,
                libc::SYS_fchownat,
                libc::SYS_setxattr,
                libc::SYS_fsetxattr,
                libc::SYS_unlinkat,
                libc::SYS_renameat2,
                libc::SYS_mount,
                libc::SYS_unshare,
                libc::SYS_setns,
                libc::SYS_setresuid,
                libc::SYS_bpf,
                libc::SYS_io_uring_setup,
                libc::SYS_keyctl,
                libc::SYS_userfaultfd,
                libc::SYS_perf_event_open,
                libc::SYS_seccomp,
                libc::SYS_ftruncate,
                libc::SYS_pipe2,
            ] {
                assert!(!m.contains_key(&nr), "syscall {nr} is allowed");
            }
            if !needs.rdma {
                assert!(!m.contains_key(&libc::SYS_socket));
                assert!(!m.contains_key(&libc::SYS_bind));
            }
        }
        assert!(!IOCTLS.contains(&(libc::TIOCSTI as u32)));
    }

    #[test]
    fn the_filters_compile_for_this_architecture() {
        let (_, n) = seccomp_filters(Needs::default(), 1).unwrap();
        assert!(n > 50, "{n}");
        let (_, m) = seccomp_filters(
            Needs {
                rdma: true,
                gpu: false,
            },
            1,
        )
        .unwrap();
        assert_eq!(m, n + 2, "socket and bind for RDMA");
    }

    /// A classic-BPF interpreter for the instructions seccompiler emits, run over a
    /// `seccomp_data` (nr, arch, instruction pointer, six arguments), as the kernel runs a
    /// filter.
    fn run_bpf(prog: &[seccompiler::sock_filter], data: &[u8; 64]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let i = &prog[pc];
            pc += 1;
            let k = i.k as usize;
            match i.code {
                0x20 => a = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap()), // LD W ABS
                0x00 => a = i.k,                                                    // LD IMM
                0x54 => a &= i.k,                                                   // AND K
                0x06 => return i.k,                                                 // RET K
                0x05 => pc += k,                                                    // JA
                0x15 | 0x25 | 0x35 | 0x45 => {
                    let taken = match i.code {
                        0x15 => a == i.k,
                        0x25 => a > i.k,
                        0x35 => a >= i.k,
                        _ => a & i.k != 0,
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                c => panic!("BPF opcode {c:#x} not interpreted"),
            }
        }
    }

    const ALLOW: u32 = 0x7fff_0000;
    const KILL_PROCESS: u32 = 0x8000_0000;
    const fn errno(e: i32) -> u32 {
        0x0005_0000 | e as u32
    }

    /// What the installed filters answer for one call: every filter runs, the strictest action
    /// wins (the most recently installed among equals), as in the kernel.
    fn verdict(needs: Needs, arch: u32, nr: i64, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, v) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_ne_bytes());
        }
        let (filters, _) = seccomp_filters(needs, 1).unwrap();
        let action = |r: u32| (r & 0xffff_0000) as i32;
        filters
            .iter()
            .rev()
            .map(|p| run_bpf(p, &data))
            .reduce(|best, r| if action(r) < action(best) { r } else { best })
            .unwrap()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    // libc's request constants are `c_ulong` here and `c_int` elsewhere.
    #[allow(clippy::unnecessary_cast)]
    fn the_filter_answers_each_call_as_intended() {
        const X86_64: u32 = 0xC000_003E;
        const I386: u32 = 0x4000_0003;
        const X32_BIT: i64 = 0x4000_0000;
        let cpu = Needs::default();
        let rdma = Needs {
            rdma: true,
            gpu: false,
        };
        let gpu = Needs {
            rdma: false,
            gpu: true,
        };
        let v = |n: Needs, nr: i64, args: [u64; 6]| verdict(n, X86_64, nr, args);
        let z = [0u64; 6];
        let eperm = errno(libc::EPERM);
        assert_eq!(v(cpu, libc::SYS_getpid, z), ALLOW);
        assert_eq!(v(cpu, libc::SYS_getpid | X32_BIT, z), eperm, "x32 numbers");
        assert_eq!(verdict(cpu, I386, 20, z), KILL_PROCESS, "i386 calls");
        assert_eq!(v(cpu, libc::SYS_clone3, z), errno(libc::ENOSYS));
        assert_eq!(v(cpu, libc::SYS_clone, [0x3d0f00, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            v(cpu, libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            eperm
        );
        for nr in [
            libc::SYS_execve,
            libc::SYS_memfd_create,
            libc::SYS_fork,
            libc::SYS_shmget,
        ] {
            assert_eq!(v(cpu, nr, z), eperm, "{nr}");
        }
        let sock = |d: u64, p: u64| [d, libc::SOCK_RAW as u64, p, 0, 0, 0];
        let (inet, nl) = (libc::AF_INET as u64, libc::AF_NETLINK as u64);
        let nl_rdma = libc::NETLINK_RDMA as u64;
        assert_eq!(v(cpu, libc::SYS_socket, sock(nl, nl_rdma)), eperm);
        assert_eq!(v(rdma, libc::SYS_socket, sock(nl, nl_rdma)), ALLOW);
        assert_eq!(
            v(rdma, libc::SYS_socket, sock(nl, 0)),
            eperm,
            "NETLINK_ROUTE"
        );
        assert_eq!(v(rdma, libc::SYS_socket, sock(inet, 0)), eperm);
        assert_eq!(v(cpu, libc::SYS_connect, z), eperm);
        let unix = libc::AF_UNIX as u64;
        assert_eq!(v(cpu, libc::SYS_socketpair, [unix, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(v(cpu, libc::SYS_socketpair, [inet, 1, 0, 0, 0, 0]), eperm);
        // Signals: to itself (pid 1 in its namespace) only.
        assert_eq!(v(cpu, libc::SYS_tgkill, [1, 1, 6, 0, 0, 0]), ALLOW);
        assert_eq!(v(cpu, libc::SYS_tgkill, [2, 2, 9, 0, 0, 0]), eperm);
        assert_eq!(
            v(cpu, libc::SYS_kill, [u64::MAX, 9, 0, 0, 0, 0]),
            eperm,
            "kill(-1)"
        );
        assert_eq!(v(cpu, libc::SYS_prlimit64, [0, 7, 0, 0, 0, 0]), ALLOW);
        assert_eq!(v(cpu, libc::SYS_prlimit64, [4242, 7, 0, 0, 0, 0]), eperm);
        // ioctl: the terminal's TIOCSTI never, whatever its upper bits.
        let tiocsti = libc::TIOCSTI as u64;
        for n in [cpu, gpu] {
            assert_eq!(v(n, libc::SYS_ioctl, [2, tiocsti, 0, 0, 0, 0]), eperm);
            assert_eq!(
                v(n, libc::SYS_ioctl, [2, tiocsti | (1 << 40), 0, 0, 0, 0]),
                eperm
            );
            assert_eq!(
                v(n, libc::SYS_ioctl, [3, libc::FIONBIO as u64, 0, 0, 0, 0]),
                ALLOW
            );
        }
        assert_eq!(
            v(
                cpu,
                libc::SYS_ioctl,
                [3, libc::TIOCGWINSZ as u64, 0, 0, 0, 0]
            ),
            eperm
        );
        assert_eq!(
            v(rdma, libc::SYS_ioctl, [5, 0xc018_1b01, 0, 0, 0, 0]),
            ALLOW
        );
        // No executable memory in a CPU build.
        let (rw, rwx) = (3u64, 7u64);
        assert_eq!(
            v(cpu, libc::SYS_mmap, [0, 4096, rw, 0x22, u64::MAX, 0]),
            ALLOW
        );
        assert_eq!(
            v(cpu, libc::SYS_mmap, [0, 4096, rwx, 0x22, u64::MAX, 0]),
            eperm
        );
        assert_eq!(v(cpu, libc::SYS_mprotect, [0, 4096, rwx, 0, 0, 0]), eperm);
        assert_eq!(v(gpu, libc::SYS_mprotect, [0, 4096, rwx, 0, 0, 0]), ALLOW);
        // fcntl without signal ownership; arch_prctl only for AMX.
        assert_eq!(
            v(cpu, libc::SYS_fcntl, [3, libc::F_GETFL as u64, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(
            v(cpu, libc::SYS_fcntl, [3, libc::F_SETOWN as u64, 1, 0, 0, 0]),
            eperm
        );
        assert_eq!(
            v(cpu, libc::SYS_arch_prctl, [0x1023, 18, 0, 0, 0, 0]),
            ALLOW
        );
        assert_eq!(v(cpu, libc::SYS_arch_prctl, [0x1002, 0, 0, 0, 0, 0]), eperm);
        // Files: the calls exist (the view and Landlock decide); changing modes does not.
        assert_eq!(v(cpu, libc::SYS_openat, z), ALLOW);
        for nr in [
            libc::SYS_fchmodat,
            libc::SYS_fchown,
            libc::SYS_setxattr,
            libc::SYS_unlinkat,
        ] {
            assert_eq!(v(cpu, nr, z), eperm, "{nr}");
        }
    }
}
