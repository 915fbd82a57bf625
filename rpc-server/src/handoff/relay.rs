//! The stderr relay: a session process's log, read by the front on a thread of its own and
//! logged through `tracing`, tagged with the session (`session.peer`, `session.pid`), bounded
//! in line length and bytes per second, with terminal escapes removed.

use std::time::Instant;

/// Longest line of a session's stderr the front logs (the rest of it is dropped).
const STDERR_LINE: usize = 2048;
/// Bytes per second of a session's stderr the front logs, and its burst; the excess is dropped
/// and counted.
const STDERR_RATE: f64 = 16.0 * 1024.0;
const STDERR_BURST: f64 = 64.0 * 1024.0;

/// The session's stderr, read by the front on a thread of its own and logged through
/// `tracing`, tagged with the session: bounded lines, bounded bytes per second (a count of what
/// was dropped is logged), control characters (terminal escapes) replaced.
pub(super) fn relay_stderr(err: std::process::ChildStderr, peer: String, pid: u32) {
    use std::io::Read;
    let spawned = std::thread::Builder::new()
        .name(format!("session-{pid}-stderr"))
        .spawn(move || {
            let mut err = err;
            let mut bucket =
                crate::control::TokenBucket::new(STDERR_RATE, STDERR_BURST, Instant::now());
            let mut line: Vec<u8> = Vec::with_capacity(STDERR_LINE);
            let mut truncated = false;
            let (mut dropped_lines, mut dropped_bytes) = (0u64, 0u64);
            let mut buf = [0u8; 4096];
            let mut emit = |line: &[u8], truncated: bool, dl: &mut u64, db: &mut u64| {
                if !bucket.take(line.len() as f64 + 1.0, Instant::now()) {
                    *dl += 1;
                    *db += line.len() as u64;
                    return;
                }
                if *dl > 0 {
                    tracing::warn!(session.peer = %peer, session.pid = pid, "{} lines ({} bytes) of this session's log dropped (over {} bytes/s)", *dl, *db, STDERR_RATE);
                    (*dl, *db) = (0, 0);
                }
                log_session_line(line, truncated, &peer, pid);
            };
            loop {
                let n = match err.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                for &b in buf.get(..n).unwrap_or(&[]) {
                    if b == b'\n' {
                        emit(&line, truncated, &mut dropped_lines, &mut dropped_bytes);
                        line.clear();
                        truncated = false;
                    } else if line.len() < STDERR_LINE {
                        line.push(b);
                    } else {
                        truncated = true;
                    }
                }
            }
            if !line.is_empty() {
                emit(&line, truncated, &mut dropped_lines, &mut dropped_bytes);
            }
            if dropped_lines > 0 {
                tracing::warn!(session.peer = %peer, session.pid = pid, "{dropped_lines} lines ({dropped_bytes} bytes) of this session's log dropped (over {STDERR_RATE} bytes/s)");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot read a session's log");
    }
}

/// One line of a session's log, as the front logs it, at the level the session's line names.
fn log_session_line(raw: &[u8], truncated: bool, peer: &str, pid: u32) {
    let (level, clean) = tidy_session_line(raw, truncated);
    let has = |l: &str| level == Some(l);
    if has("ERROR") {
        tracing::error!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else if has("WARN") {
        tracing::warn!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else if has("DEBUG") || has("TRACE") {
        tracing::debug!(session.peer = %peer, session.pid = pid, "session: {clean}");
    } else {
        tracing::info!(session.peer = %peer, session.pid = pid, "session: {clean}");
    }
}

/// A line of a session's log made fit for the front's: escape sequences removed, other control
/// characters replaced, the session's own timestamp and level taken off (the level returned).
fn tidy_session_line(raw: &[u8], truncated: bool) -> (Option<&'static str>, String) {
    let text = String::from_utf8_lossy(raw);
    let mut clean = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte; any other escape: the next character.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('\u{40}'..='\u{7e}').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c.is_control() && c != '\t' {
            clean.push('?');
        } else {
            clean.push(c);
        }
    }
    if truncated {
        clean.push_str(" [...]");
    }
    // The session's own timestamp and level go (the front's line has both).
    let mut rest = clean.trim_start();
    let is_time =
        |w: &str| w.len() >= 20 && w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('T');
    if let Some((_, r)) = rest.split_once(' ').filter(|(w, _)| is_time(w)) {
        rest = r.trim_start();
    }
    let level = ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"]
        .into_iter()
        .find(|l| rest.split_once(' ').is_some_and(|(w, _)| w == *l));
    if let Some(l) = level {
        rest = rest[l.len()..].trim_start();
    }
    (level, rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_log_line_is_tidied_for_the_front() {
        let (level, text) = tidy_session_line(
            b"2026-12-02T13:07:02.219332Z  WARN session{pid=1}: x: hello \x1b[31mred\x1b[0m\x07 \x1b]0;title\x07end",
            false,
        );
        assert_eq!(level, Some("WARN"));
        assert_eq!(text, "session{pid=1}: x: hello red? 0;title?end");
        assert!(!text.contains('\u{1b}'));
        let (level, text) = tidy_session_line(b"plain \xff\r\n text", true);
        assert_eq!(level, None);
        assert_eq!(text, "plain \u{fffd}?? text [...]");
        assert_eq!(
            tidy_session_line(b"ERROR boom", false),
            (Some("ERROR"), "boom".into())
        );
    }
}
