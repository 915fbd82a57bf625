//! The control line's ledger: every decision the front makes about a session process's
//! messages, without I/O (`on(message, now) -> Action`), so each rule is tested in memory. The
//! loop that serves the line (`serve.rs`) reads a line, asks the ledger, and does what the
//! [`Action`] says: it holds the sockets, the staging file and the jobs; the ledger holds the
//! accounts.
//!
//! What the ledger decides:
//! - the rate bound and the decoder (`control::Inbound`): a flood or a malformed line ends the
//!   session;
//! - the memory account: `R` granted while the session's reservations plus its store in
//!   progress stay within its budget (and the server's), refused (`N`) past it; `F` gives back
//!   at most what it holds;
//! - the stats gate (`control::StatsGate`): exactly the front's number of counters, each
//!   clamped to what a session can have counted; the first clamp is noted;
//! - the link policy: a `C` from a 7.0 session, or one outside the connection's
//!   `comm::CommPolicy` (a device the session does not have, world ≠ 2, rank 0 elsewhere than
//!   the server's port + 1000, rank 1 to a port or address the policy refuses), ends the
//!   session; one inside it is brokered;
//! - cache staging: one store at a time (`W` before the last `D`, or `D` without `W`, ends the
//!   session); a staging file only where this process stores (a writing cache, not
//!   `--trusted-weights-only`), for more than 0 bytes, within the budget (charged until the
//!   store is done: given back when its file was emptied, else kept until the session ends);
//! - jobs: one store or check in flight per session (a `W` or `V` waits for the one running);
//!   checks and opens only with a cache this process writes.

use std::time::Instant;

use rpc_proto::Limits;
use rpc_session::MemoryBudget;

use crate::comm::{CommPolicy, Target};
use crate::control::{ControlError, Inbound, StatsGate, ToFront, ToSession};

/// What the loop serving the control line must do for one message.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Nothing to answer.
    Nothing,
    /// This reply line.
    Reply(ToSession),
    /// End the session: kill its process, count and log why.
    Violation(ControlError),
    /// A store or check is in flight: wait for it (and report it, [`Ledger::job_done`]), then
    /// hand the message back to [`Ledger::on`].
    WaitForJob(ToFront),
    /// Add these deltas to the server's counters (the order of `stats::reported_counters`);
    /// `first_clamp`: some were clamped, for the first time in this session (worth a warning).
    Count { deltas: Vec<u64>, first_clamp: bool },
    /// Make the link to `target` (`comm::CommPolicy::establish`) and pass its socket (`K`), or
    /// answer `E`; the session's link for `device` is replaced.
    Link { device: u32, target: Target },
    /// Make a staging file of this many bytes (already charged) and pass it (`M`); if that
    /// fails, tell [`Ledger::staging_failed`] and answer `X` (or end the line).
    Stage(u64),
    /// The session says its staging file holds the upload: seal it and start the store job
    /// ([`Ledger::job_started`]), which gives back `charge` when done; if the seal fails, empty
    /// the file and [`Ledger::settle`] the charge (a file sealed against shrinking: a violation).
    Seal { charge: u64 },
    /// Start the job that checks the cache entry `hash` (already counted as running).
    Check(u64),
    /// Open the cache entry `hash` for the session and pass it (`H`/`G`), or answer `U`.
    Open(u64),
}

/// One session's account on the front: what it holds, what its store in progress is charged,
/// which job runs, and the gates its messages pass.
#[derive(Debug)]
pub(super) struct Ledger<'a> {
    budget: &'a MemoryBudget,
    comm: &'a CommPolicy,
    /// The session's devices (a link may be asked for one of them).
    devices: usize,
    major: rpc_proto::Major,
    /// The cache is this process's to write: checks and opens are served.
    cache: bool,
    /// ... and to store into (not `--trusted-weights-only`): staging files are made.
    stores: bool,
    inbound: Inbound,
    gate: StatsGate,
    /// Reservations the session holds.
    held: u64,
    /// Bytes charged for its store (staging file) in progress.
    store_charge: u64,
    /// Charges of stores whose staging file could not be emptied: kept until the session ends.
    kept: u64,
    /// A staging file was passed and its `D` has not come.
    staging: bool,
    /// A store or check runs (one per session).
    job_running: bool,
    clamp_noted: bool,
}

/// What the front knows of a session when its control line opens.
#[derive(Debug)]
pub(super) struct Session<'a> {
    pub budget: &'a MemoryBudget,
    pub comm: &'a CommPolicy,
    pub devices: usize,
    pub major: rpc_proto::Major,
    /// The number of counters its `S` lines carry.
    pub counters: usize,
    /// A cache this process writes (checks, opens).
    pub cache: bool,
    /// ... which takes stores.
    pub stores: bool,
}

impl<'a> Ledger<'a> {
    pub(super) fn new(s: Session<'a>, now: Instant) -> Ledger<'a> {
        Ledger {
            budget: s.budget,
            comm: s.comm,
            devices: s.devices,
            major: s.major,
            cache: s.cache,
            stores: s.stores && s.cache,
            inbound: Inbound::new(now),
            gate: StatsGate::new(s.counters, now),
            held: 0,
            store_charge: 0,
            kept: 0,
            staging: false,
            job_running: false,
            clamp_noted: false,
        }
    }

    /// One line of the session's (without its newline, or the splitter's error): through the
    /// rate bound and the decoder, then [`Ledger::on`].
    pub(super) fn on_line(&mut self, line: Result<Vec<u8>, ControlError>, now: Instant) -> Action {
        match line.and_then(|l| self.inbound.message(&l, now)) {
            Ok(msg) => self.on(msg, now),
            Err(e) => Action::Violation(e),
        }
    }

    /// What to do for one message of the session's.
    pub(super) fn on(&mut self, msg: ToFront, now: Instant) -> Action {
        // W and V wait for the job in flight: one per session.
        if matches!(msg, ToFront::Store(_) | ToFront::Check(_)) && self.job_running {
            return Action::WaitForJob(msg);
        }
        match msg {
            ToFront::Reserve(n) => {
                let ok = self.budget.try_reserve(self.held + self.store_charge, n);
                if ok {
                    self.held += n;
                }
                Action::Reply(if ok { ToSession::Yes } else { ToSession::No })
            }
            ToFront::Free(n) => {
                let n = n.min(self.held);
                self.budget.release(n);
                self.held -= n;
                Action::Nothing
            }
            ToFront::Stats(v) => match self.gate.admit(&v, now) {
                Ok((deltas, clamped)) => {
                    let first_clamp = clamped && !self.clamp_noted;
                    self.clamp_noted |= clamped;
                    Action::Count {
                        deltas,
                        first_clamp,
                    }
                }
                Err(e) => Action::Violation(e),
            },
            // Outside the policy the session process checked before asking: not a request a
            // sound session makes.
            ToFront::CommInit(bytes) => match self.link_request(&bytes) {
                Ok((device, target)) => Action::Link { device, target },
                Err(e) => Action::Violation(e),
            },
            ToFront::Store(n) => {
                if self.staging {
                    return Action::Violation(ControlError::OutOfOrder("W before the last D"));
                }
                if !self.stores
                    || n == 0
                    || !self.budget.try_reserve(self.held + self.store_charge, n)
                {
                    return Action::Reply(ToSession::NoStaging);
                }
                self.store_charge += n;
                self.staging = true;
                Action::Stage(n)
            }
            ToFront::Stored => {
                if !self.staging {
                    return Action::Violation(ControlError::OutOfOrder("D without W"));
                }
                self.staging = false;
                Action::Seal {
                    charge: self.store_charge,
                }
            }
            ToFront::Check(hash) => {
                if !self.cache {
                    return Action::Nothing;
                }
                self.job_running = true;
                Action::Check(hash)
            }
            ToFront::Open(hash) => match self.cache {
                true => Action::Open(hash),
                false => Action::Reply(ToSession::NoEntry),
            },
        }
    }

    /// The staging file of an [`Action::Stage`] could not be made or passed: its charge is
    /// given back and no store is in progress.
    pub(super) fn staging_failed(&mut self, n: u64) {
        self.store_charge -= n;
        self.staging = false;
        self.budget.release(n);
    }

    /// The store job of an [`Action::Seal`] started.
    pub(super) fn job_started(&mut self) {
        self.job_running = true;
    }

    /// Whether a store or check runs.
    pub(super) fn job_running(&self) -> bool {
        self.job_running
    }

    /// The job in flight ended (`done`: its charge and whether its staging file was emptied;
    /// `None`: it reported nothing).
    pub(super) fn job_done(&mut self, done: Option<(u64, bool)>) {
        if let Some(done) = done {
            self.settle(done);
        }
        self.job_running = false;
    }

    /// A finished store's charge: given back when its staging file was emptied, else kept
    /// until the session ends.
    pub(super) fn settle(&mut self, (n, revoked): (u64, bool)) {
        self.store_charge -= n;
        match revoked {
            true => self.budget.release(n),
            false => self.kept += n,
        }
    }

    /// What the session still holds in the memory account (its reservations, its store in
    /// progress, the charges kept): the caller gives it back once the process is gone.
    pub(super) fn held(&self) -> u64 {
        self.held + self.store_charge + self.kept
    }

    /// A session's `C` line checked against the link policy and what the front knows of the
    /// session (its devices): the device and where the link goes, or the violation.
    fn link_request(
        &self,
        bytes: &[u8; rpc_proto::COMM_INIT_SIZE],
    ) -> Result<(u32, Target), ControlError> {
        if self.major != rpc_proto::Major::V8 {
            return Err(ControlError::Link(
                "a protocol 7.0 session has no collectives".to_string(),
            ));
        }
        let req = rpc_proto::Request::decode(
            rpc_proto::Major::V8,
            rpc_proto::Command::CommInit,
            bytes,
            &Limits::default(),
        )
        .map_err(|_| ControlError::Malformed("not a COMM_INIT"))?;
        let rpc_proto::Request::CommInit(init) = req else {
            return Err(ControlError::Malformed("not a COMM_INIT"));
        };
        let target = self
            .comm
            .check(&init, rpc_session::peer::link_targets(self.devices))
            .map_err(|r| ControlError::Link(r.to_string()))?;
        Ok((init.device, target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_session::MemoryLimits;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    fn budget(per_connection: u64, total: u64) -> MemoryBudget {
        MemoryBudget::new(MemoryLimits {
            per_connection,
            total,
        })
    }

    /// The server at 127.0.0.1:50052: rank 0 on 51052, rank 1 to loopback ports 50952-51152.
    fn policy() -> CommPolicy {
        CommPolicy::new(
            "127.0.0.1:50052".parse().unwrap(),
            Default::default(),
            Vec::new(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
    }

    fn session<'a>(budget: &'a MemoryBudget, comm: &'a CommPolicy) -> Session<'a> {
        Session {
            budget,
            comm,
            devices: 1,
            major: rpc_proto::Major::V8,
            counters: 3,
            cache: true,
            stores: true,
        }
    }

    fn comm_init(rank: u32, device: u32, world: u32, host: &str, port: u32) -> ToFront {
        let init = rpc_proto::CommInit {
            device,
            rank,
            world,
            port,
            host: rpc_proto::CommInit::host_field(host).unwrap(),
        };
        let mut bytes = Vec::new();
        rpc_proto::Request::CommInit(init).encode_payload(&mut bytes);
        ToFront::CommInit(bytes.try_into().unwrap())
    }

    #[test]
    fn reservations_are_granted_up_to_the_budget_and_freed() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let mut l = Ledger::new(session(&b, &c), Instant::now());
        let now = Instant::now();
        let yes = Action::Reply(ToSession::Yes);
        let no = Action::Reply(ToSession::No);
        assert_eq!(l.on(ToFront::Reserve(MIB / 2), now), yes);
        assert_eq!(
            l.on(ToFront::Reserve(MIB / 2), now),
            yes,
            "exactly the budget"
        );
        assert_eq!(l.on(ToFront::Reserve(1), now), no, "one byte past it");
        assert_eq!((l.held(), b.used()), (MIB, MIB));
        // A free gives back what it names, and the budget takes a reservation again.
        assert_eq!(l.on(ToFront::Free(MIB / 4), now), Action::Nothing);
        assert_eq!((l.held(), b.used()), (MIB * 3 / 4, MIB * 3 / 4));
        assert_eq!(l.on(ToFront::Reserve(MIB / 4), now), yes);
        assert_eq!(l.on(ToFront::Reserve(1), now), no);
        // A free of more than it holds gives back what it holds, no more.
        assert_eq!(l.on(ToFront::Free(u64::MAX), now), Action::Nothing);
        assert_eq!((l.held(), b.used()), (0, 0));
        assert_eq!(l.on(ToFront::Reserve(u64::MAX), now), no, "no overflow");
    }

    #[test]
    fn the_servers_total_bounds_every_session() {
        let (b, c) = (budget(MIB, MIB + MIB / 2), policy());
        let now = Instant::now();
        let mut one = Ledger::new(session(&b, &c), now);
        let mut two = Ledger::new(session(&b, &c), now);
        assert_eq!(
            one.on(ToFront::Reserve(MIB), now),
            Action::Reply(ToSession::Yes)
        );
        assert_eq!(
            two.on(ToFront::Reserve(MIB), now),
            Action::Reply(ToSession::No)
        );
        assert_eq!(
            two.on(ToFront::Reserve(MIB / 2), now),
            Action::Reply(ToSession::Yes)
        );
        assert_eq!(b.used(), MIB + MIB / 2);
    }

    #[test]
    fn stats_pass_the_gate_and_a_clamp_is_noted_once() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let start = Instant::now();
        let mut l = Ledger::new(session(&b, &c), start);
        assert_eq!(
            l.on(ToFront::Stats(vec![1, 2, 3]), start),
            Action::Count {
                deltas: vec![1, 2, 3],
                first_clamp: false
            }
        );
        let huge = crate::control::COUNTER_PER_SEC * 10;
        let Action::Count {
            deltas,
            first_clamp,
        } = l.on(ToFront::Stats(vec![huge, 0, 0]), start)
        else {
            panic!("counted")
        };
        assert!(deltas[0] < huge, "clamped: {deltas:?}");
        assert!(first_clamp);
        let again = l.on(ToFront::Stats(vec![huge, 0, 0]), start);
        assert!(
            matches!(
                again,
                Action::Count {
                    first_clamp: false,
                    ..
                }
            ),
            "noted once: {again:?}"
        );
        assert!(matches!(
            l.on(ToFront::Stats(vec![1, 2]), start),
            Action::Violation(ControlError::FieldCount { got: 2, want: 3 })
        ));
    }

    #[test]
    fn a_link_inside_the_policy_is_brokered_one_outside_it_is_a_violation() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let now = Instant::now();
        let mut l = Ledger::new(session(&b, &c), now);
        assert_eq!(
            l.on(comm_init(0, 0, 2, "", 51052), now),
            Action::Link {
                device: 0,
                target: Target::Listen(51052)
            },
            "rank 0 on the server's port + 1000"
        );
        assert!(matches!(
            l.on(comm_init(1, 0, 2, "127.0.0.1", 51000), now),
            Action::Link {
                device: 0,
                target: Target::Dial { port: 51000, .. }
            }
        ));
        // Past the devices: the connection's LINK_* slots (one device here: slot s is device
        // 1 + s), under the same policy.
        assert!(matches!(
            l.on(
                comm_init(1, rpc_proto::LINK_SLOTS, 2, "127.0.0.1", 51000),
                now
            ),
            Action::Link {
                device: 8,
                target: Target::Dial { port: 51000, .. }
            }
        ));
        for (what, msg) in [
            ("rank 0 elsewhere", comm_init(0, 0, 2, "", 51053)),
            (
                "past the device and the link slots",
                comm_init(1, 1 + rpc_proto::LINK_SLOTS, 2, "127.0.0.1", 51000),
            ),
            (
                "rank 0 elsewhere, in a link slot",
                comm_init(0, 3, 2, "", 51053),
            ),
            ("world 3", comm_init(1, 0, 3, "127.0.0.1", 51000)),
            ("no RPC port + 1000", comm_init(1, 0, 2, "127.0.0.1", 6379)),
            ("no host", comm_init(1, 0, 2, "", 51000)),
        ] {
            assert!(
                matches!(l.on(msg, now), Action::Violation(ControlError::Link(_))),
                "{what}"
            );
        }
        assert!(matches!(
            l.on(ToFront::CommInit([0xff; rpc_proto::COMM_INIT_SIZE]), now),
            Action::Violation(_)
        ));
        // A 7.0 session has no COMM_INIT at all.
        let mut v7 = Ledger::new(
            Session {
                major: rpc_proto::Major::V7,
                ..session(&b, &c)
            },
            now,
        );
        assert!(matches!(
            v7.on(comm_init(0, 0, 2, "", 51052), now),
            Action::Violation(ControlError::Link(_))
        ));
    }

    #[test]
    fn a_store_is_staged_within_the_budget_one_at_a_time() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let now = Instant::now();
        let mut l = Ledger::new(session(&b, &c), now);
        let no = Action::Reply(ToSession::NoStaging);
        assert_eq!(
            l.on(ToFront::Stored, now),
            Action::Violation(ControlError::OutOfOrder("D without W"))
        );
        assert_eq!(l.on(ToFront::Store(0), now), no, "nothing to store");
        assert_eq!(
            l.on(ToFront::Reserve(MIB / 2), now),
            Action::Reply(ToSession::Yes)
        );
        assert_eq!(
            l.on(ToFront::Store(MIB / 2 + 1), now),
            no,
            "past the budget"
        );
        assert_eq!(l.on(ToFront::Store(MIB / 4), now), Action::Stage(MIB / 4));
        assert_eq!((l.held(), b.used()), (MIB * 3 / 4, MIB * 3 / 4), "charged");
        // The store in progress counts against reservations too.
        assert_eq!(
            l.on(ToFront::Reserve(MIB / 4 + 1), now),
            Action::Reply(ToSession::No)
        );
        assert_eq!(
            l.on(ToFront::Store(1), now),
            Action::Violation(ControlError::OutOfOrder("W before the last D"))
        );
        assert_eq!(l.on(ToFront::Stored, now), Action::Seal { charge: MIB / 4 });
        l.job_started();
        // The next W and V wait for the store in flight, and come back as they were.
        assert_eq!(
            l.on(ToFront::Store(7), now),
            Action::WaitForJob(ToFront::Store(7))
        );
        assert_eq!(
            l.on(ToFront::Check(9), now),
            Action::WaitForJob(ToFront::Check(9))
        );
        l.job_done(Some((MIB / 4, true)));
        assert!(!l.job_running());
        assert_eq!(
            (l.held(), b.used()),
            (MIB / 2, MIB / 2),
            "given back once emptied"
        );
        assert_eq!(l.on(ToFront::Store(7), now), Action::Stage(7));
    }

    #[test]
    fn a_store_whose_file_was_not_emptied_keeps_its_charge() {
        // A server-wide total of 1.5 MiB, 1 MiB per session.
        let (b, c) = (budget(MIB, MIB + MIB / 2), policy());
        let now = Instant::now();
        let mut l = Ledger::new(session(&b, &c), now);
        assert_eq!(l.on(ToFront::Store(MIB), now), Action::Stage(MIB));
        assert_eq!(l.on(ToFront::Stored, now), Action::Seal { charge: MIB });
        l.job_started();
        l.job_done(Some((MIB, false)));
        assert_eq!(
            (l.held(), b.used()),
            (MIB, MIB),
            "kept until the session ends"
        );
        // A kept charge stays in the server's total; the session's own check counts its
        // reservations and its store in progress only (the rule as it stands).
        let no = Action::Reply(ToSession::NoStaging);
        assert_eq!(l.on(ToFront::Store(MIB / 2 + 1), now), no, "past the total");
        assert_eq!(
            l.on(ToFront::Reserve(MIB / 2 + 1), now),
            Action::Reply(ToSession::No)
        );
        assert_eq!(
            l.on(ToFront::Reserve(MIB / 2), now),
            Action::Reply(ToSession::Yes)
        );
        assert_eq!((l.held(), b.used()), (MIB + MIB / 2, MIB + MIB / 2));
    }

    #[test]
    fn a_staging_file_that_was_not_made_gives_its_charge_back() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let now = Instant::now();
        let mut l = Ledger::new(session(&b, &c), now);
        assert_eq!(l.on(ToFront::Store(MIB), now), Action::Stage(MIB));
        l.staging_failed(MIB);
        assert_eq!((l.held(), b.used()), (0, 0));
        assert_eq!(
            l.on(ToFront::Stored, now),
            Action::Violation(ControlError::OutOfOrder("D without W")),
            "no store in progress"
        );
        // A seal that failed: the charge settled as the file was (not) emptied.
        assert_eq!(l.on(ToFront::Store(100), now), Action::Stage(100));
        assert_eq!(l.on(ToFront::Stored, now), Action::Seal { charge: 100 });
        l.settle((100, true));
        assert_eq!((l.held(), b.used()), (0, 0));
        assert!(!l.job_running());
    }

    #[test]
    fn the_cache_rules_stores_checks_and_opens() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let now = Instant::now();
        // No cache this process writes: no staging, no check, no entry.
        let mut none = Ledger::new(
            Session {
                cache: false,
                ..session(&b, &c)
            },
            now,
        );
        assert_eq!(
            none.on(ToFront::Store(10), now),
            Action::Reply(ToSession::NoStaging)
        );
        assert_eq!(none.on(ToFront::Check(1), now), Action::Nothing);
        assert!(!none.job_running());
        assert_eq!(
            none.on(ToFront::Open(1), now),
            Action::Reply(ToSession::NoEntry)
        );
        // --trusted-weights-only: checks and opens, no stores.
        let mut trusted = Ledger::new(
            Session {
                stores: false,
                ..session(&b, &c)
            },
            now,
        );
        assert_eq!(
            trusted.on(ToFront::Store(10), now),
            Action::Reply(ToSession::NoStaging)
        );
        assert_eq!(trusted.on(ToFront::Open(5), now), Action::Open(5));
        assert_eq!(trusted.on(ToFront::Check(5), now), Action::Check(5));
        assert!(trusted.job_running(), "a check is a job");
        trusted.job_done(Some((0, true)));
        assert!(!trusted.job_running());
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_malformed_line_or_a_flood_is_a_violation() {
        let (b, c) = (budget(MIB, 1 << 30), policy());
        let now = Instant::now();
        let mut l = Ledger::new(session(&b, &c), now);
        assert!(matches!(
            l.on_line(Ok(b"R -1".to_vec()), now),
            Action::Violation(_)
        ));
        assert!(matches!(
            l.on_line(Ok(b"HELLO".to_vec()), now),
            Action::Violation(_)
        ));
        assert_eq!(
            l.on_line(Err(ControlError::TooLong), now),
            Action::Violation(ControlError::TooLong)
        );
        assert_eq!(
            l.on_line(Ok(b"R 10".to_vec()), now),
            Action::Reply(ToSession::Yes)
        );
        let flood = (0..30_000)
            .map(|_| l.on_line(Ok(b"F 0".to_vec()), now))
            .find(|a| *a != Action::Nothing);
        assert_eq!(flood, Some(Action::Violation(ControlError::Flood)));
        assert_eq!(l.held(), 10);
    }
}
