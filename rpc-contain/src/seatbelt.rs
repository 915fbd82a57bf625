//! macOS's `sandbox_init` (libSystem), the one C call of the session sandbox on macOS
//! (`sandbox_mac.rs` builds the profile); a module of its own because it needs `unsafe`, which
//! the crate allows only here and in `sys_linux.rs`.
//!
//! The other call here, [`darwin_user_cache_dir`] (libc's `confstr`), only looks up where Darwin
//! keeps this user's caches, for the profile's Metal shader-cache rule; it changes nothing.

use std::ffi::{c_char, c_int, CStr};
use std::path::PathBuf;

extern "C" {
    // libSystem (libsystem_sandbox): flags 0 = `profile` is the profile's text.
    fn sandbox_init(profile: *const c_char, flags: u64, errorbuf: *mut *mut c_char) -> c_int;
    fn sandbox_free_error(errorbuf: *mut c_char);
}

/// Applies the Seatbelt profile text `profile` to this process (every thread, irreversibly);
/// the error is libsandbox's message.
pub fn apply_profile(profile: &CStr) -> Result<(), String> {
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: `profile` is a valid NUL-terminated string for the call; `err` is a valid
    // out-pointer that sandbox_init sets to NULL or to a string it allocated.
    let rc = unsafe { sandbox_init(profile.as_ptr(), 0, &mut err) };
    if rc == 0 {
        return Ok(());
    }
    if err.is_null() {
        return Err(format!("sandbox_init failed ({rc})"));
    }
    // SAFETY: a non-NULL `err` is a NUL-terminated string owned by libsandbox, read once
    // and then freed exactly once with its own free function.
    let msg = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    unsafe { sandbox_free_error(err) };
    Err(msg)
}

/// This user's Darwin cache directory (`confstr(_CS_DARWIN_USER_CACHE_DIR)`, e.g.
/// `/var/folders/xx/yyyy/C/`), where Metal keeps its per-program shader caches; `None` if
/// libc cannot say.
pub fn darwin_user_cache_dir() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `buf` is writable for `buf.len()` bytes; confstr writes at most that many bytes
    // (the NUL included) and returns the size the whole value needs, 0 on error.
    let n = unsafe {
        libc::confstr(
            libc::_CS_DARWIN_USER_CACHE_DIR,
            buf.as_mut_ptr().cast::<c_char>(),
            buf.len(),
        )
    };
    if n == 0 || n > buf.len() {
        return None;
    }
    buf.truncate(n - 1);
    Some(PathBuf::from(std::ffi::OsString::from_vec(buf)))
}
