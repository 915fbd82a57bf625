//! Where the checks on index tensor contents run, and the checks themselves.
//!
//! A check on a tensor that no earlier node writes runs before the graph; otherwise the graph is
//! cut after the last node that writes the tensor's memory (and at or before its consumer), and
//! the check runs at that cut. Cuts are shared between checks where possible (interval stabbing,
//! greedy by consumer position).

use super::rules::GraphLinks;
use super::{ty, IndexCheck};
use crate::buffer::{BufferRef, Locked};
use crate::ops;
use crate::tensor::{nbytes, TensorSpec};

/// Why the index checks of a graph cannot be scheduled, or why one refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The graph's index tensors cannot be checked before their readers run: one is in no
    /// buffer, its reader writes over it, or there are too many checks for the graph.
    #[error("{0}")]
    Unschedulable(String),
    /// A value of an index tensor is out of range (found before the segment that reads it).
    #[error("{what}: index out of range ({detail})")]
    OutOfRange { what: &'static str, detail: String },
    /// An index tensor could not be read to check it (a view of its buffer is alive, or no
    /// memory to stage it).
    #[error("an index tensor could not be read to check it")]
    Unreadable,
}

/// Upper bound on (checks x writing nodes) comparisons when scheduling checks.
const MAX_SCHEDULE_WORK: usize = 200_000_000;

/// Where the graph is cut (node positions, ascending) and the checks to run before each segment
/// (`checks[i]` before segment `i`; always at least one segment).
pub(crate) struct Schedule {
    pub(crate) cuts: Vec<usize>,
    pub(crate) checks: Vec<Vec<DataCheck>>,
}

/// Schedules the `pending` checks (each with the position in `nodes` of the node reading the
/// index tensor) over the running `nodes` (local indices into `specs` and `links`).
pub(crate) fn schedule_checks(
    specs: &[TensorSpec],
    links: &[GraphLinks],
    nodes: &[u32],
    pending: Vec<(usize, IndexCheck)>,
) -> Result<Schedule, IndexError> {
    if pending.is_empty() {
        return Ok(Schedule {
            cuts: Vec::new(),
            checks: vec![Vec::new()],
        });
    }
    let writes = writes(specs, links, nodes);
    if pending.len().saturating_mul(writes.len().max(1)) > MAX_SCHEDULE_WORK {
        return Err(IndexError::Unschedulable(
            "too many index checks for the graph size".into(),
        ));
    }
    let mut windows = Vec::with_capacity(pending.len());
    for (consumer, c) in pending {
        windows.push(window(specs, &writes, consumer, c)?);
    }
    Ok(assign(windows))
}

/// Memory one running node writes: `[start, end)` of `buf`, by the node at position `pos`.
struct Write<'a> {
    pos: usize,
    buf: &'a BufferRef,
    start: u64,
    end: u64,
}

/// The buffer of `t`, its offset there and its extent (`u64::MAX` if that overflows).
fn extent(t: &TensorSpec) -> Option<(&BufferRef, u64, u64)> {
    let (buf, off) = t.buffer.as_ref()?;
    Some((buf, *off, nbytes(t.type_, &t.ne, &t.nb).unwrap_or(u64::MAX)))
}

/// Memory each running node writes: its result, and for optimizer steps their state sources too.
fn writes<'a>(specs: &'a [TensorSpec], links: &[GraphLinks], nodes: &[u32]) -> Vec<Write<'a>> {
    let mut writes = Vec::new();
    for (pos, &ni) in nodes.iter().enumerate() {
        let d = &specs[ni as usize];
        if ops::is_empty(d.op) {
            continue;
        }
        let state = if d.op == ops::OPT_STEP_ADAMW || d.op == ops::OPT_STEP_SGD {
            &links[ni as usize].src[..]
        } else {
            &[]
        };
        let written = std::iter::once(ni).chain(state.iter().flatten().copied());
        for (buf, start, len) in written.filter_map(|w| extent(&specs[w as usize])) {
            writes.push(Write {
                pos,
                buf,
                start,
                end: start.saturating_add(len),
            });
        }
    }
    writes
}

/// A check with the positions it may run at: from `lo` (after the last earlier write of its
/// tensor) to `consumer` (right before the node that reads it).
struct Window {
    lo: usize,
    consumer: usize,
    check: DataCheck,
}

/// The window of check `c`, read by the node at `consumer`. Refused when the index tensor is not
/// in a buffer or its reader writes over it.
fn window(
    specs: &[TensorSpec],
    writes: &[Write<'_>],
    consumer: usize,
    c: IndexCheck,
) -> Result<Window, IndexError> {
    let t = &specs[c.tensor as usize];
    let Some((buf, off, len)) = extent(t) else {
        return Err(IndexError::Unschedulable(format!(
            "{}: index tensor not in a buffer",
            c.what
        )));
    };
    let end = off.saturating_add(len);
    let mut last_write: Option<usize> = None;
    if len != 0 {
        let overlapping = writes
            .iter()
            .filter(|w| w.pos <= consumer && w.buf == buf && w.start < end && off < w.end);
        for w in overlapping {
            if w.pos == consumer {
                return Err(IndexError::Unschedulable(format!(
                    "{}: the node writes over its own index tensor",
                    c.what
                )));
            }
            last_write = Some(last_write.map_or(w.pos, |p| p.max(w.pos)));
        }
    }
    Ok(Window {
        lo: last_write.map_or(0, |w| w + 1),
        consumer,
        check: DataCheck {
            buf: buf.clone(),
            off,
            ne: t.ne,
            nb: t.nb,
            type_: c.type_,
            bound: c.bound,
            what: c.what,
        },
    })
}

/// Places every check: before the graph when nothing writes its tensor first, else at the last
/// cut made so far if that lies inside its window, else at a new cut right before its consumer
/// (windows taken by consumer position).
fn assign(mut windows: Vec<Window>) -> Schedule {
    windows.sort_by_key(|w| w.consumer);
    let mut cuts: Vec<usize> = Vec::new();
    let mut checks: Vec<Vec<DataCheck>> = vec![Vec::new()];
    for w in windows {
        if w.lo == 0 {
            checks[0].push(w.check);
        } else if cuts.last().is_some_and(|&k| k >= w.lo) {
            checks[cuts.len()].push(w.check);
        } else {
            cuts.push(w.consumer);
            checks.push(vec![w.check]);
        }
    }
    Schedule { cuts, checks }
}

/// A check that every value of an index tensor lies in `[0, bound)`.
pub(crate) struct DataCheck {
    buf: BufferRef,
    off: u64,
    ne: [u32; 4],
    nb: [u64; 4],
    type_: u32,
    bound: u64,
    what: &'static str,
}

impl DataCheck {
    /// Reads the index tensor under `locked` (the flags of the graph's buffers, this one
    /// among them) and checks every value.
    pub(crate) fn run(&self, locked: &Locked<'_>) -> Result<(), IndexError> {
        let len = nbytes(self.type_, &self.ne, &self.nb).ok_or(IndexError::Unreadable)?;
        let ulen = usize::try_from(len).map_err(|_| IndexError::Unreadable)?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(ulen)
            .map_err(|_| IndexError::Unreadable)?;
        bytes.resize(ulen, 0);
        locked
            .read(&self.buf, self.off, &mut bytes)
            .map_err(|_| IndexError::Unreadable)?;
        let wide = self.type_ == ty::I64;
        let esz = if wide { 8 } else { 4 };
        let ne = self.ne.map(|x| x as u64);
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let row = i3 * self.nb[3] + i2 * self.nb[2] + i1 * self.nb[1];
                    for i0 in 0..ne[0] {
                        let at = (row + i0 * self.nb[0]) as usize;
                        let v: i64 = match bytes.get(at..at + esz) {
                            Some(b) if wide => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                            Some(b) => i32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as i64,
                            None => return Err(IndexError::Unreadable),
                        };
                        if v < 0 || v as u64 >= self.bound {
                            return Err(IndexError::OutOfRange {
                                what: self.what,
                                detail: format!(
                                    "index {v} at [{i0}, {i1}, {i2}, {i3}] not in [0, {}) (type {}, ne {:?}, nb {:?})",
                                    self.bound, self.type_, self.ne, self.nb
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
