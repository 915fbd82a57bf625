//! Last line of defence against `GGML_ASSERT` / `GGML_ABORT` reached from the network.
//!
//! This layer checks every tensor, graph and scratch command so that ggml's asserts cannot fire
//! (`tensor.rs`, `check/`). Should one fire anyway, ggml calls `abort()`, which would take every
//! connection down with it. ggml lets us run a callback first: it logs the assertion and parks
//! the calling thread for good, so only the connection whose request hit the assertion hangs
//! (its worker thread and memory are leaked) while the process keeps serving everyone else. After
//! [`MAX_PARKED`] such threads the process aborts as ggml intended, so a peer cannot pile up
//! leaked threads.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::sys;

/// Threads parked after a ggml assertion before the process gives up and aborts.
pub const MAX_PARKED: usize = 16;

static PARKED: AtomicUsize = AtomicUsize::new(0);

/// Whether an assertion parks its thread (a shared server) or lets ggml abort (a session
/// process, where aborting ends only the session that caused it).
static PARK: AtomicBool = AtomicBool::new(true);

/// In a session process: a ggml assertion ends the process (the front logs it and serves on)
/// instead of parking a thread.
pub fn abort_on_assertions() {
    PARK.store(false, Ordering::SeqCst);
}

/// Number of threads parked so far.
#[cfg(test)]
fn parked_threads() -> usize {
    PARKED.load(Ordering::Relaxed)
}

extern "C" fn on_ggml_abort(message: *const std::os::raw::c_char) {
    let msg = if message.is_null() {
        String::from("(no message)")
    } else {
        // SAFETY: ggml passes a NUL-terminated message buffer that lives for this call.
        unsafe { std::ffi::CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    };
    if !PARK.load(Ordering::SeqCst) {
        eprintln!("ggml assertion: {msg}; ending this session's process");
        return; // ggml aborts the process after the callback returns
    }
    let n = PARKED.fetch_add(1, Ordering::SeqCst) + 1;
    if n > MAX_PARKED {
        eprintln!("ggml assertion: {msg}; {MAX_PARKED} threads already parked, aborting");
        return; // ggml aborts the process after the callback returns
    }
    tracing::error!(
        "BUG: ggml assertion reached from a request: {msg}; parking this thread ({n}/{MAX_PARKED}), \
         the connection that sent it will hang until the server restarts"
    );
    eprintln!("ggml assertion: {msg} (thread parked {n}/{MAX_PARKED})");
    loop {
        std::thread::park();
    }
}

/// Installs the callback (once per process).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the callback is a plain extern "C" function valid for the process lifetime.
        unsafe { sys::ggml_set_abort_callback(Some(on_ggml_abort)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assertion_parks_the_thread_instead_of_aborting() {
        install();
        let before = parked_threads();
        // The thread calls ggml_abort (what GGML_ASSERT does) and never returns; it stays parked.
        std::thread::spawn(|| {
            // SAFETY: valid NUL-terminated strings; ggml_abort does not return (our callback parks).
            unsafe {
                sys::ggml_abort(
                    c"test".as_ptr(),
                    1,
                    c"%s".as_ptr(),
                    c"simulated assertion".as_ptr(),
                )
            };
        });
        let t0 = std::time::Instant::now();
        while parked_threads() == before {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "callback not reached"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Still alive: this test finishing proves the process did not abort.
    }
}
