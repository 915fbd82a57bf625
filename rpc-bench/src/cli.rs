//! What every subcommand shares: the `--links`, `--csv`, `--md` and `--no-progress` flags
//! ([`Common`]): the links (each once) with their sources for the report, the report written out;
//! and what the subcommands that run stock tools share, `--proto` and `--bin` ([`Stock`]).

use std::path::PathBuf;

use bench_report::Output;
use clap::Args;
use rpc_proto::Major;

use crate::links::{self, LinkProfile};
use crate::tools::default_bin;

/// Which stock llama.cpp tools run (`e2e`, `load`), by the protocol they speak.
#[derive(Args, Debug, Clone)]
pub struct Stock {
    /// Protocol of the stock tools and servers: 7 (`scripts/stock-llama.sh`, the default, what
    /// the measurements so far used) or 8 (llama.cpp since October 2026,
    /// `STOCK_PROTO=8 scripts/stock-llama.sh`). Our rpc-server speaks 8.0.0 on -p and 7.0.0 on
    /// --proto7-port; a client of the other major aborts.
    #[arg(long, default_value = "7", value_parser = parse_major)]
    pub proto: Major,
    /// Directory of the stock llama.cpp tools; default: $STOCK_BIN (7) or $STOCK_BIN8 (8), else
    /// the stock build of that protocol `scripts/stock-llama.sh` cached.
    #[arg(long)]
    pub bin: Option<PathBuf>,
}

impl Stock {
    /// The directory of the stock tools.
    pub fn dir(&self) -> PathBuf {
        self.bin.clone().unwrap_or_else(|| default_bin(self.proto))
    }
}

/// `7`, `8` (also `7.0`, `8.0.0`).
fn parse_major(s: &str) -> Result<Major, String> {
    s.trim_end_matches(".0")
        .parse::<u8>()
        .ok()
        .and_then(Major::from_number)
        .ok_or_else(|| format!("'{s}': the protocol is 7 or 8"))
}

/// The flags of every subcommand.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Link profiles, comma-separated: none, 2.5gbe, 10gbe, tb5-tcp, tb5-rdma (projected only),
    /// custom:RTT_US:GBIT_S, or all.
    #[arg(long, default_value = "all", value_parser = parse_links)]
    pub links: LinkList,
    /// `--csv`, `--md`, `--no-progress`.
    #[command(flatten)]
    pub out: Output,
}

/// A parsed `--links` value, each link once.
#[derive(Debug, Clone)]
pub struct LinkList(pub Vec<LinkProfile>);

fn parse_links(s: &str) -> Result<LinkList, String> {
    let mut v: Vec<LinkProfile> = Vec::new();
    for l in links::parse_links(s).map_err(|e| e.to_string())? {
        if !v.iter().any(|x| x.name == l.name) {
            v.push(l);
        }
    }
    Ok(LinkList(v))
}

impl Common {
    /// The links, each once.
    pub fn links(&self) -> &[LinkProfile] {
        &self.links.0
    }

    /// The links as markdown bullet lines with their figures and sources.
    pub fn links_section(&self) -> String {
        let mut s = String::from("Links (figures and sources):\n\n");
        for l in self.links() {
            let (figures, kind) = (l.figures(), l.kind.label());
            s.push_str(&format!(
                "- `{}` ({figures}, {kind}): {}\n",
                l.name, l.source
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_choice() {
        assert_eq!(parse_major("7"), Ok(Major::V7));
        assert_eq!(parse_major("8.0.0"), Ok(Major::V8));
        assert!(
            parse_major("9").is_err() && parse_major("70").is_err() && parse_major("").is_err()
        );
        let s = Stock {
            proto: Major::V8,
            bin: Some("/x".into()),
        };
        assert_eq!(s.dir(), PathBuf::from("/x"), "--bin wins over the default");
    }
}
