//! Server-wide counters: connections, commands and bytes by command, for logs and benchmarks.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rpc_proto::Command;

#[derive(Default)]
pub struct Stats {
    pub connections: AtomicU64,
    pub active: AtomicU64,
    commands: [AtomicU64; 18],
    bytes_in: [AtomicU64; 18],
    bytes_out: [AtomicU64; 18],
}

impl Stats {
    /// Counts one command with its request payload size and reply size (prefix included).
    pub fn command(&self, cmd: Command, req: u64, rsp: u64) {
        let i = cmd as usize;
        self.commands[i].fetch_add(1, Relaxed);
        self.bytes_in[i].fetch_add(req + 9, Relaxed);
        self.bytes_out[i].fetch_add(rsp, Relaxed);
    }

    /// `(command, count, bytes in, bytes out)` for every command seen at least once.
    pub fn snapshot(&self) -> Vec<(Command, u64, u64, u64)> {
        Command::ALL
            .iter()
            .map(|&c| {
                let i = c as usize;
                (
                    c,
                    self.commands[i].load(Relaxed),
                    self.bytes_in[i].load(Relaxed),
                    self.bytes_out[i].load(Relaxed),
                )
            })
            .filter(|x| x.1 > 0)
            .collect()
    }
}
