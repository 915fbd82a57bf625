//! Tables: markdown for the terminal and the README, CSV for spreadsheets; built row by row or
//! column by column ([`Table::of`]).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

/// A column of [`Table::of`]: its header and how a row fills it.
pub type Column<'a, R> = (&'a str, &'a dyn Fn(&R) -> String);

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

    /// One row per item of `rows`, one cell per column: the table-driven form, each column's
    /// header next to what fills it.
    pub fn of<R>(rows: impl IntoIterator<Item = R>, columns: &[Column<R>]) -> Table {
        Table {
            headers: columns.iter().map(|c| c.0.to_string()).collect(),
            rows: rows
                .into_iter()
                .map(|r| columns.iter().map(|c| (c.1)(&r)).collect())
                .collect(),
        }
    }

    /// Appends columns, filled from `rows` (one per row of the table, in order).
    pub fn add_columns<R>(&mut self, rows: impl IntoIterator<Item = R>, columns: &[Column<R>]) {
        self.headers.extend(columns.iter().map(|c| c.0.to_string()));
        for (row, r) in self.rows.iter_mut().zip(rows) {
            row.extend(columns.iter().map(|c| (c.1)(&r)));
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

/// Milliseconds with 3 decimals.
pub fn ms(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// Microseconds with 1 decimal.
pub fn us(d: std::time::Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

/// A count per unit: whole numbers as they are, others with 3 decimals.
pub fn ratio(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as u64)
    } else {
        format!("{v:.3}")
    }
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
        let by_column = Table::of(
            [1, 2],
            &[
                ("n", &|n| n.to_string()),
                ("twice", &|n| (n * 2).to_string()),
            ],
        );
        assert_eq!(
            by_column.markdown(),
            "| n | twice |\n|---|---|\n| 1 | 2 |\n| 2 | 4 |\n"
        );
        assert_eq!(human_bytes(28672.0), "28.0 KiB");
        assert_eq!((ratio(32.0), ratio(1.5)), ("32".into(), "1.500".into()));
        let mut t = Table::new(&["a"]);
        t.push(vec!["1".into()]);
        t.add_columns([2], &[("b", &|n| n.to_string())]);
        assert_eq!(t.csv(), "a,b\n1,2\n");
    }
}
