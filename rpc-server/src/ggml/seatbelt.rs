//! macOS's `sandbox_init` (libSystem), the one C call of the session sandbox on macOS
//! (`sandbox_mac.rs` builds the profile); here because this module is the crate's FFI layer.

use std::ffi::{c_char, c_int, CStr};

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
