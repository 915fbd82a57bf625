//! `rpc-contain`: containment of rpc-server's session processes, the processes that handle
//! attacker-shaped memory (OpenSSH's privilege separation, a browser's renderer): what a session
//! process does to itself before it reads a byte from its client, so that a request that gets
//! past validation and trips a ggml kernel reaches nothing but its own client.
//!
//! - Linux: [`namespaces`] (its own PID, network, mount, IPC, UTS and cgroup namespaces, a
//!   read-only root of its own, an identity that owns nothing) and then [`sandbox`] (rlimits,
//!   Landlock, the default-deny seccomp allow-list, the address-space bound).
//! - macOS: [`sandbox_mac`], the Seatbelt profile (its text is built, and tested, on every OS).
//!
//! When and in which order a session process calls them is rpc-server's (`child/contain.rs`,
//! from `child/start.rs` and `child/serve.rs`); this crate knows nothing of the server: no options, no control line. The GPU
//! backend the build drives is this crate's `cuda`/`vulkan` feature, forwarded by rpc-server's.

// No `unsafe` here but in the two OS FFI modules (`sys_linux`: `unshare`, which rustix marks
// unsafe, and `fork`; `seatbelt`: macOS's `sandbox_init` and `confstr`), each block with a
// `// SAFETY:` line.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

#[cfg(target_os = "linux")]
pub mod namespaces;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod sandbox_mac;
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
mod seatbelt;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sys_linux;
