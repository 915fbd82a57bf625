//! Tables: markdown for the terminal and the README, CSV for spreadsheets.

use std::fmt::Write as _;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::str::FromStr;

/// A table of strings with a header row.
#[derive(Debug, Clone, Default)]
pub struct Table {
    /// Column names.
    pub headers: Vec<String>,
    /// Rows (each as long as `headers`).
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    /// GitHub-flavoured markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "| {} |", self.headers.join(" | "));
        let _ = writeln!(
            s,
            "|{}",
            self.headers.iter().map(|_| "---|").collect::<String>()
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} |",
                r.iter()
                    .map(|c| c.replace('|', "\\|"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
        }
        s
    }

    /// RFC 4180 CSV.
    pub fn csv(&self) -> String {
        let mut s = String::new();
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            let cells: Vec<String> = r.iter().map(|c| csv_cell(c)).collect();
            let _ = writeln!(s, "{}", cells.join(","));
        }
        s
    }

    /// Writes the CSV to `path`.
    pub fn write_csv(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.csv())
    }
}

fn csv_cell(c: &str) -> String {
    if c.contains([',', '"', '\n']) {
        format!("\"{}\"", c.replace('"', "\"\""))
    } else {
        c.to_string()
    }
}

/// A server to measure: `[LABEL=]HOST:PORT`.
#[derive(Debug, Clone)]
pub struct Target {
    /// Name in tables and charts (default: the address).
    pub label: String,
    /// Resolved address.
    pub addr: SocketAddr,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (label, hostport) = match s.split_once('=') {
            Some((l, h)) => (l.to_string(), h),
            None => (s.to_string(), s),
        };
        let addr = hostport
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {hostport:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("{hostport:?} resolves to no address"))?;
        Ok(Target { label, addr })
    }
}

/// Milliseconds with 3 decimals.
pub fn ms(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// Microseconds with 1 decimal.
pub fn us(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// Human bytes: `1.00 MiB`, `28.0 KiB`, `13 B`.
pub fn human_bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_and_csv() {
        let mut t = Table::new(&["a", "b"]);
        t.push(vec!["1".into(), "x,y".into()]);
        t.push(vec!["2|3".into(), "q\"".into()]);
        assert_eq!(
            t.markdown(),
            "| a | b |\n|---|---|\n| 1 | x,y |\n| 2\\|3 | q\" |\n"
        );
        assert_eq!(t.csv(), "a,b\n1,\"x,y\"\n2|3,\"q\"\"\"\n");
        let tg: Target = "ours=127.0.0.1:5".parse().unwrap();
        assert_eq!((tg.label.as_str(), tg.addr.port()), ("ours", 5));
        let tg: Target = "127.0.0.1:6".parse().unwrap();
        assert_eq!(tg.label, "127.0.0.1:6");
        assert_eq!(human_bytes(28672.0), "28.0 KiB");
    }
}
