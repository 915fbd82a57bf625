//! `bench-report`: how the benchmarks present what they measured, apart from the measuring.
//!
//! - [`table`]: a table of strings, built column by column, as GitHub markdown or CSV, and the
//!   number formats the tables share (`ms`, `us`, `human_bytes`);
//! - [`chart`]: grouped bar charts as PNG (plotters, an embedded font);
//! - [`Output`]: the `--csv`, `--md` and `--no-progress` flags: a report to stdout and to files
//!   when asked, a progress bar on a terminal;
//! - [`process`]: a tool run to its end with its log, a server process killed on drop;
//! - [`median`] and [`pooled`]: the statistics of repeated runs.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod chart;
pub mod process;
pub mod table;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use indicatif::ProgressStyle;

pub use indicatif::ProgressBar;

pub use table::{human_bytes, ms, ratio, us, Table};

/// Where a report goes: its command-line flags.
#[derive(clap::Args, Debug, Clone)]
pub struct Output {
    /// Also write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Also write the markdown report to a file.
    #[arg(long, value_name = "FILE")]
    pub md: Option<PathBuf>,
    /// No progress bar (default: shown when stderr is a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

impl Output {
    /// Prints the markdown report `md`; writes it and `csv` where `--md` / `--csv` say.
    pub fn emit(&self, md: &str, csv: &Table) -> anyhow::Result<()> {
        print!("{md}");
        if let Some(p) = &self.csv {
            csv.write_csv(p)
                .with_context(|| format!("cannot write {}", p.display()))?;
            eprintln!("CSV written to {}", p.display());
        }
        if let Some(p) = &self.md {
            std::fs::write(p, md).with_context(|| format!("cannot write {}", p.display()))?;
            eprintln!("markdown written to {}", p.display());
        }
        Ok(())
    }

    /// A progress bar of `total` steps on stderr, unless `--no-progress` or stderr is no
    /// terminal.
    pub fn progress_bar(&self, total: u64) -> ProgressBar {
        if self.no_progress || !std::io::stderr().is_terminal() {
            return ProgressBar::hidden();
        }
        let pb = ProgressBar::new(total);
        pb.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb
    }
}

/// The median of `v` (the lower of the two middle ones of an even count; the default if empty).
pub fn median<T: Ord + Copy + Default>(v: &[T]) -> T {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

/// (mean, standard deviation) of several runs, each given as its own (mean, standard
/// deviation): the mean of the means, and a deviation combining the spread within the runs and
/// between them.
pub fn pooled(runs: &[(f64, f64)]) -> (f64, f64) {
    let n = runs.len().max(1) as f64;
    let mean = runs.iter().map(|r| r.0).sum::<f64>() / n;
    let var = runs.iter().map(|&(m, sd)| sd * sd + (m - mean).powi(2));
    (mean, (var.sum::<f64>() / n).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_pooled() {
        assert_eq!(median(&[3, 1, 2]), 2);
        assert_eq!(median(&[4, 1, 3, 2]), 2);
        assert_eq!(median::<u32>(&[]), 0);
        assert_eq!(pooled(&[(1.0, 0.0), (3.0, 0.0)]), (2.0, 1.0));
        assert_eq!(pooled(&[(2.0, 3.0)]), (2.0, 3.0));
    }
}
