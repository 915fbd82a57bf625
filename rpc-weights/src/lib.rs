//! `rpc-weights`: the weights `rpc-server` reads from disk instead of the network, for
//! SET_TENSOR_HASH.
//!
//! [`cache`] is the weight cache (`-c`: one file per hash, written only by the front or the one
//! process of `--no-isolate`, every file opened relative to its directory handle);
//! [`local_weights`] answers from the worker's own GGUF files (`--gguf`), whose headers
//! [`gguf`] reads, bounded like a request; [`disk_read`] moves a file range into tensor memory,
//! hashed only when it must be verified, for both.
//!
//! Its modules are layered bottom up, each importing only those before it: `disk_read` and
//! `gguf` < `cache` < `local_weights`. It depends on `rpc-ggml` (the tensor memory read into,
//! ggml's type sizes), `rpc-proto` (FNV-1a) and nothing of the server: the server's session
//! process reaches the front through the [`cache::CacheKeeper`] it passes in.

#![forbid(unsafe_code)]

pub mod cache;
pub mod disk_read;
pub mod gguf;
pub mod local_weights;
