//! A session process's start ([`main`]): contained first (Linux: `contain.rs`), then its
//! backends and devices from the front's message alone, then handed its client: on stdin and
//! stdout when started for one ([`Handed::from_stdio`]), or, pooled (`--session-wait`), on the
//! control line once a client arrives ([`await_connection`], `front_line.rs`); `serve.rs`
//! serves it.

use std::sync::Arc;

use anyhow::{bail, Context};

use super::front_line::{await_connection, Handed};
use super::serve::serve;
use crate::control::SessionStart;
use crate::session_config::session_config;

/// A session process (`--session-child`), or the front's containment probe
/// (`--sandbox-probe`): configured by the front's message alone (`start`, its switches
/// included).
pub fn main(start: SessionStart, probe: bool, pooled: bool) -> anyhow::Result<()> {
    rpc_ggml::use_huge_pages(start.options.session.huge_pages);
    #[cfg(target_os = "linux")]
    if start.options.sandbox {
        super::contain::contain(&start, probe);
    }
    if probe {
        bail!("--sandbox-probe: no containment to probe (--no-sandbox)");
    }
    rpc_ggml::load_backends_from(start.options.backend_path.as_deref());
    let config = Arc::new(session_config(&start.options.session, true)?);
    if !pooled {
        let handed = Handed::from_stdio()
            .context("a session process started without its socket and control line")?;
        std::process::exit(serve(start, config, handed));
    }
    // Pooled: what a session's first command would do first happens now, while it waits: a
    // backend on each device (on a Mac, the Metal device's command queue and its kernel
    // library, which stays loaded for the process).
    for d in &config.devices {
        drop(d.init_backend(start.options.session.threads));
    }
    match await_connection(&start) {
        Ok(Some((start, handed))) => std::process::exit(serve(start, config, handed)),
        Ok(None) => std::process::exit(0),
        Err(e) => bail!("a pooled session process: {e}"),
    }
}
