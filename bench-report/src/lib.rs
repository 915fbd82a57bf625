//! `bench-report`: how the benchmarks present what they measured, apart from the measuring.
//!
//! - [`table`]: a table of strings, built column by column, as GitHub markdown or CSV, and the
//!   number formats the tables share (`ms`, `us`, `human_bytes`);
//! - [`chart`]: grouped bar charts as PNG (plotters, an embedded font);
//! - [`emit`]: a report to stdout, and to `--md` / `--csv` files when asked; [`progress_bar`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod chart;
pub mod table;

use std::path::Path;

use anyhow::Context;
use indicatif::ProgressStyle;

pub use indicatif::ProgressBar;

pub use table::{human_bytes, ms, us, Table};

/// Prints the markdown report `md`; writes it to `md_file` and `csv` to `csv_file` when given.
pub fn emit(
    md: &str,
    csv: &Table,
    md_file: Option<&Path>,
    csv_file: Option<&Path>,
) -> anyhow::Result<()> {
    print!("{md}");
    if let Some(p) = csv_file {
        csv.write_csv(p)
            .with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!("CSV written to {}", p.display());
    }
    if let Some(p) = md_file {
        std::fs::write(p, md).with_context(|| format!("cannot write {}", p.display()))?;
        eprintln!("markdown written to {}", p.display());
    }
    Ok(())
}

/// A progress bar of `total` steps on stderr, hidden unless `show`.
pub fn progress_bar(total: u64, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
