//! A session process (`--session-child`), the whole of its side: it serves one client whose
//! connection its front handed over (`handoff/`), on the socket that is its stdin, reporting to
//! the front on the control line that is its stdout (`control.rs`): memory reservations,
//! counters, links and the weight cache's writes go to the front, and (Linux) the cache entries
//! it reads come from it. Its configuration is one message from the front, [`SessionStart`];
//! nothing is rebuilt from flags. A pooled one (`--session-wait`) gets it, and the client's
//! socket, on the control line once a client arrives ([`await_connection`]). The front's
//! containment probe (`--sandbox-probe`) is a session process that stops once contained.
//!
//! One job per file, in the order a session process runs them: `start.rs` ([`main`]: contained,
//! configured, handed its client), `contain.rs` (every containment step, and the front's
//! [`probe_containment`] at start), `serve.rs` (serving the client), `front_line.rs` (its side
//! of the control line, from the client's hand-over on).
//!
//! [`SessionStart`]: crate::control::SessionStart

mod contain;
mod front_line;
mod serve;
mod start;

pub use contain::probe_containment;
pub use front_line::{await_connection, Handed};
pub use start::main;
