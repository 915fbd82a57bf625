//! The session process's sandbox on macOS (part of containment, the default): a Seatbelt profile
//! applied with `sandbox_init` once the transport is up, before the first command is read (the
//! counterpart of `sandbox.rs` on Linux; `--no-sandbox` leaves it out).
//!
//! The profile allows by default and denies what reaches beyond the session, so that Metal (its
//! driver, its compiler service, its caches) keeps working as in an unsandboxed process:
//!
//! - starting programs or processes (`process-exec*`, `process-fork`);
//! - new sockets, listening and new connections (`system-socket`, `network-bind`,
//!   `network-outbound`): the client's socket and the control line to the front exist already,
//!   and an RDMA queue pair is set up before the profile applies;
//! - writing files anywhere but the weight cache, `/dev`, and the per-user temporary and cache
//!   directories under `/private/var/folders` (Metal's shader caches);
//! - reading anything under the user's home directory but the weight cache (keys, documents
//!   and the like stay out of a compromised session's reach; `--gguf` files were opened before,
//!   and an open file needs no new permission).
//!
//! Not run on this project's CI (Linux only): the profile text is built and unit-tested on every
//! OS; applying it and the forbidden-action test (`tests/tests/isolate.rs`,
//! `RPC_SANDBOX_SELFTEST=1`) run where the tests run on a Mac.

use std::path::Path;

/// A path as a Seatbelt (Scheme) string literal.
fn quoted(p: &Path) -> String {
    let mut s = String::from("\"");
    for c in p.to_string_lossy().chars() {
        if c == '"' || c == '\\' {
            s.push('\\');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// The profile text: `home` is the user's home directory (reads under it are denied),
/// `cache_dir` the weight cache (read and write).
pub fn profile(home: Option<&Path>, cache_dir: Option<&Path>) -> String {
    let mut p = String::from(
        "(version 1)\n\
         (allow default)\n\
         (deny process-exec*)\n\
         (deny process-fork)\n\
         (deny system-socket)\n\
         (deny network-bind)\n\
         (deny network-outbound (remote ip \"*:*\"))\n\
         (deny file-write*)\n\
         (allow file-write* (subpath \"/dev\") (subpath \"/private/var/folders\"))\n",
    );
    if let Some(home) = home {
        p.push_str(&format!("(deny file-read* (subpath {}))\n", quoted(home)));
    }
    // Last: later rules win, so the cache stays readable and writable inside a denied home.
    if let Some(c) = cache_dir {
        p.push_str(&format!(
            "(allow file-read* file-write* (subpath {}))\n",
            quoted(c)
        ));
    }
    p
}

/// Applies [`profile`] to this process (every thread, irreversibly).
#[cfg(target_os = "macos")]
pub fn apply(home: Option<&Path>, cache_dir: Option<&Path>) -> Result<(), String> {
    let text = profile(home, cache_dir);
    let c = std::ffi::CString::new(text).map_err(|_| "a path holds a NUL byte".to_string())?;
    crate::ggml::seatbelt::apply_profile(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_denies_what_reaches_beyond_the_session_and_keeps_the_cache() {
        let p = profile(
            Some(Path::new("/Users/me")),
            Some(Path::new("/Users/me/Library/Caches/llama.cpp/rpc")),
        );
        for rule in [
            "(deny process-exec*)",
            "(deny process-fork)",
            "(deny system-socket)",
            "(deny network-bind)",
            "(deny file-write*)",
            "(deny file-read* (subpath \"/Users/me\"))",
        ] {
            assert!(p.contains(rule), "{rule} missing from\n{p}");
        }
        // The cache rule comes after the home rule (later rules win in Seatbelt).
        let cache = p
            .find("(allow file-read* file-write* (subpath \"/Users/me/Library/Caches/llama.cpp/rpc\"))")
            .expect("cache rule");
        assert!(cache > p.find("(deny file-read*").unwrap());
        assert_eq!(p.matches('(').count(), p.matches(')').count(), "balanced");
    }

    #[test]
    fn paths_are_quoted_as_scheme_strings() {
        assert_eq!(quoted(Path::new(r#"/a "b"\c"#)), r#""/a \"b\"\\c""#);
        let p = profile(Some(Path::new("/x\")(allow default")), None);
        assert!(
            p.contains(r#"(deny file-read* (subpath "/x\")(allow default"))"#),
            "{p}"
        );
    }
}
