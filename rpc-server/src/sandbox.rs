//! The session process's sandbox on Linux (part of containment, the default), in two steps so
//! that what a request might make a ggml kernel do runs with no more rights than serving its own
//! session needs: the file rules and rlimits as the process starts (before the transport is set
//! up: an RDMA device opened under other credentials than the ones that later write to it is
//! refused by the kernel, `ib_safe_file_access`), the system-call filter once the transport is
//! up, before the first command is read (device discovery may need a netlink socket).
//!
//! - **seccomp-bpf**: the system calls that reach beyond the session fail with `EPERM`: starting
//!   programs or processes (`execve`, `fork`, `clone` without `CLONE_THREAD`), new sockets and
//!   connections (`socket`, `connect`, `bind`, `listen`, `accept`), signalling or tracing other
//!   processes (`kill`, `ptrace`, `process_vm_*`), and kernel-wide controls (mounts, namespaces,
//!   modules, BPF, keyrings, `io_uring`, identity changes). `clone3` answers `ENOSYS`, so the C
//!   library falls back to `clone`, whose flags the filter can see.
//! - **Landlock**: no file may be opened except under the weight cache directory (read and write:
//!   the cache stores entries), device and kernel files (`/dev`, read and write, for GPU and RDMA
//!   devices; `/proc`, `/sys`, read only) and the system's libraries (`/usr`, `/lib`, read only:
//!   drivers are loaded when first used). Best effort: a kernel without Landlock leaves the
//!   file rules unenforced, which the session logs.
//! - **rlimits**: no core files; the data segment bounded by the session's memory budget plus
//!   a fixed allowance for graphs and the runtime.
//!
//! `RPC_SANDBOX_SELFTEST=1` makes each session process try forbidden actions right after the
//! sandbox is up and log what happened (`isolate.rs`; `tests/tests/isolate.rs` asserts on those
//! lines). macOS: `sandbox_mac.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, ABI,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Beyond the buffers a session holds: graphs, staging, the runtime, ggml's thread pool.
const DATA_ALLOWANCE: u64 = 2 << 30;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("rlimit: {0}")]
    Rlimit(#[from] std::io::Error),
}

/// System calls that fail with `EPERM` inside a session (the ones every architecture has; the
/// x86_64-only ones are added in [`denied`]).
const DENIED: &[libc::c_long] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_kill,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_personality,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_quotactl,
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_mknodat,
];

fn denied() -> Vec<libc::c_long> {
    let mut v = DENIED.to_vec();
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_mknod,
    ]);
    v
}

/// The two seccomp filters: the deny list (`EPERM`) and `clone3` (`ENOSYS`). The kernel runs
/// every installed filter and takes the strictest answer.
fn seccomp_filters() -> Result<[seccompiler::BpfProgram; 2], SandboxError> {
    let err = |e: seccompiler::BackendError| SandboxError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        denied().into_iter().map(|nr| (nr, Vec::new())).collect();
    // A new process, not a thread: clone's flags (argument 0) without CLONE_THREAD.
    let no_thread = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        0,
    )
    .map_err(err)?;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![no_thread]).map_err(err)?],
    );
    let arch = std::env::consts::ARCH.try_into().map_err(err)?;
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
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
    Ok([
        deny.try_into().map_err(err)?,
        clone3.try_into().map_err(err)?,
    ])
}

fn landlock(cache_dir: Option<&Path>) -> Result<RulesetStatus, SandboxError> {
    let abi = ABI::V5;
    let mut rs = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .create()?;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    // Device files: opened, read, written and driven by ioctl (RDMA verbs, GPU drivers).
    let rw_files = read | AccessFs::WriteFile | AccessFs::IoctlDev;
    // System libraries: drivers (RDMA providers, GPU runtimes) are loaded when first used.
    let libs = [
        "/usr",
        "/lib",
        "/lib64",
        "/etc/ld.so.cache",
        "/etc/libibverbs.d",
    ];
    let system = libs.iter().map(|p| (*p, read));
    for (p, access) in [("/proc", read), ("/sys", read), ("/dev", rw_files)]
        .into_iter()
        .chain(system)
    {
        if let Ok(fd) = PathFd::new(p) {
            rs = rs.add_rule(PathBeneath::new(fd, access))?;
        }
    }
    if let Some(d) = cache_dir {
        if let Ok(fd) = PathFd::new(d) {
            rs = rs.add_rule(PathBeneath::new(fd, all))?;
        }
    }
    Ok(rs.restrict_self()?.ruleset)
}

fn rlimits(budget: u64) -> Result<(), SandboxError> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let zero = Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    setrlimit(Resource::Core, zero).map_err(std::io::Error::from)?;
    let data = budget.saturating_add(DATA_ALLOWANCE);
    if data < u64::MAX / 2 {
        let lim = Rlimit {
            current: Some(data),
            maximum: Some(data),
        };
        setrlimit(Resource::Data, lim).map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// Step 1, as the session process starts: rlimits and the file rules (Landlock), for the whole
/// process. `budget`: the most the session may hold in buffers; `cache_dir`: the weight cache,
/// if any. Returns how far Landlock is enforced.
pub fn restrict_files(budget: u64, cache_dir: Option<&Path>) -> Result<&'static str, SandboxError> {
    rlimits(budget)?;
    Ok(match landlock(cache_dir)? {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partially enforced (older kernel)",
        RulesetStatus::NotEnforced => "not enforced (no Landlock in this kernel)",
    })
}

/// Step 2, once the transport is up: the system-call filter, on every thread.
pub fn restrict_syscalls() -> Result<(), SandboxError> {
    for prog in seccomp_filters()? {
        seccompiler::apply_filter_all_threads(&prog)
            .map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    }
    Ok(())
}
