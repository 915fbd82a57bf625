//! The report of `rpc-bench allreduce`: its markdown (method, pairs, machine load, the table,
//! the correctness check), CSV and chart (median per allreduce per size, one panel per link,
//! the floor beside).

use std::path::Path;
use std::time::Duration;

use bench_report::chart::{self, BarSeries, Panel};
use bench_report::{human_bytes, us, Table};

use super::lanes::{Results, Row};
use super::{travels_as_bf16, AllreduceConfig, PairSpec};

/// The label of the reference pair of `vs stock`.
const STOCK: &str = "stock";

/// `2048`, `32768 (bf16)`.
fn size_label(n: u64) -> String {
    if travels_as_bf16(n) {
        format!("{n} (bf16)")
    } else {
        n.to_string()
    }
}

fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        "-".into()
    } else {
        format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
    }
}

/// The stock pair's row of the same link and size.
fn stock_of<'a>(rows: &'a [Row], r: &Row) -> Option<&'a Row> {
    rows.iter()
        .find(|s| s.pair == STOCK && s.link == r.link && s.n == r.n)
}

/// The results as a table.
pub fn table(rows: &[Row]) -> Table {
    Table::of(
        rows,
        &[
            ("link", &|r| r.link.clone()),
            ("link transport", &|r| r.link_transport.clone()),
            ("pair", &|r| r.pair.clone()),
            ("elements", &|r| size_label(r.n)),
            ("link bytes each way", &|r| human_bytes(r.wire as f64)),
            ("relay counted B (1→0 / 0→1)", &|r| {
                r.counted
                    .map_or("-".into(), |(up, down)| format!("{up} / {down}"))
            }),
            ("allreduce p50 us", &|r| us(r.allreduce.0)),
            ("p99 us", &|r| us(r.allreduce.1)),
            ("back-to-back us", &|r| {
                r.back_to_back.map_or("-".into(), us)
            }),
            ("floor p50 us", &|r| us(r.floor.p50)),
            ("vs floor", &|r| ratio(r.allreduce.0, r.floor.p50)),
            ("vs stock", &|r| {
                stock_of(rows, r).map_or("-".into(), |s| ratio(r.allreduce.0, s.allreduce.0))
            }),
            ("with sync p50 us", &|r| us(r.with_sync.p50)),
            ("sync p50 us", &|r| us(r.sync.p50)),
            ("check", &|r| match &r.check {
                Ok(()) => "ok".into(),
                Err(e) => format!("FAILED: {e}"),
            }),
        ],
    )
}

/// The table with the sample counts and the floor's p99.
pub fn csv_table(rows: &[Row]) -> Table {
    let mut t = table(rows);
    t.add_columns(
        rows,
        &[
            ("n", &|r| r.with_sync.n.to_string()),
            ("floor p99 us", &|r| us(r.floor.p99)),
            ("with sync p99 us", &|r| us(r.with_sync.p99)),
            ("sync p99 us", &|r| us(r.sync.p99)),
        ],
    );
    t
}

/// The whole markdown report.
pub fn markdown(cfg: &AllreduceConfig, pairs: &[PairSpec], res: &Results) -> String {
    let pairs_text: Vec<String> = pairs
        .iter()
        .map(|p| {
            format!(
                "`{}` (rank 0 {}, rank 1 {})",
                p.label, p.addrs[0], p.addrs[1]
            )
        })
        .collect();
    let mut md = format!(
        "## rpc-bench allreduce\n\n\
         One COMM_ALLREDUCE of an F32 partial of n elements between two 8.0 servers, the bench \
         their client. Per pair, link and size: {iters} measured iterations in {rounds} rounds \
         (each round visits every link, and within a link every pair and the floor, one \
         iteration each in turn) after {warm} warm-up; {batches} back-to-back batches of \
         {batch} per round. Pairs (rank 0 first): {pairs}. Servers: {threads} compute thread(s).\n\n\
         - **allreduce p50 / p99**: COMM_ALLREDUCE has no reply, so each iteration times \
         COMM_ALLREDUCE on both servers followed by a synchronising round trip on both \
         (GET_TENSOR of one element, which a server answers only once its allreduce is done; \
         `with sync`), and that round trip alone (`sync`), in alternating order; the per-allreduce \
         figure is `with sync` less the median `sync` (p99: the p99 of `with sync` less the \
         median `sync`).\n\
         - **back-to-back**: {batch} allreduces sent on both servers, then one synchronising round \
         trip: (time − median `sync`) ÷ {batch}, the median over batches.\n\
         - **floor**: a raw ping-pong of the same link bytes over the same link, rank-0-like side \
         sends W bytes and reads W, the other reads W and then sends W back (the stock link's \
         order), blocking sockets on two threads, through the same kind of relay; `vs floor` = \
         allreduce p50 ÷ floor p50, `vs stock` = allreduce p50 ÷ the `stock` pair's.\n\
         - **link**: the server-to-server link only (the bench reaches both servers straight); \
         `none` = rank 1 dials rank 0's port + 1000; an emulated link = rank 1 dials the \
         emulating relay (on a port near its own + 1000), which forwards to rank 0's port + 1000. \
         Partials of 32768 elements or more travel as bf16 (2 bytes per element, spec §C); `relay \
         counted` = the bytes per allreduce the relay carried, each way.\n\
         - **check**: per round, rank 0 gets x and rank 1 y (exact in bf16), one allreduce, both \
         read back whole: x + y on both, or the row fails; the timed allreduces sum zeros.\n\n\
         Load average (1, 5, 15 min) before: {lb}; after: {la}.\n\n",
        iters = cfg.iterations,
        rounds = cfg.rounds.clamp(1, cfg.iterations.max(1)),
        warm = cfg.warmup,
        batches = cfg.batches,
        batch = cfg.batch.max(1),
        pairs = pairs_text.join(", "),
        threads = cfg.threads,
        lb = res.load[0],
        la = res.load[1],
    );
    md.push_str(&table(&res.rows).markdown());
    md.push('\n');
    let failed: Vec<&Row> = res.rows.iter().filter(|r| r.check.is_err()).collect();
    if failed.is_empty() {
        md.push_str(&format!(
            "Correctness: all {} rows ok (x + y on both ranks).\n\n",
            res.rows.len()
        ));
    } else {
        md.push_str(&format!(
            "Correctness: **{} of {} rows FAILED**.\n\n",
            failed.len(),
            res.rows.len()
        ));
    }
    md.push_str(&cfg.common.links_section());
    md
}

/// Per link a panel: per size the median per allreduce of each pair, and the floor (hollow).
pub fn draw_chart(
    path: &Path,
    cfg: &AllreduceConfig,
    pairs: &[PairSpec],
    rows: &[Row],
) -> anyhow::Result<()> {
    let links = chart::distinct(rows.iter().map(|r| &r.link));
    let sizes: Vec<u64> = cfg.sizes.iter().copied().filter(|&n| n > 0).collect();
    let cats: Vec<String> = sizes.iter().map(|&n| size_label(n)).collect();
    let names: Vec<String> = pairs.iter().map(|p| p.label.clone()).collect();
    let usf = |d: Duration| d.as_secs_f64() * 1e6;
    let panels = links
        .iter()
        .map(|link| {
            let find = |pair: &str, n: u64| {
                rows.iter()
                    .find(|r| &r.link == link && r.pair == pair && r.n == n)
            };
            let mut series = chart::series(&names, &cats, false, |i, c| {
                let n = sizes[cats.iter().position(|x| x == c)?];
                find(&names[i], n).map(|r| usf(r.allreduce.0))
            });
            series.push(BarSeries {
                name: "floor (raw ping-pong)".into(),
                values: sizes
                    .iter()
                    .map(|&n| {
                        let r = rows.iter().find(|r| &r.link == link && r.n == n);
                        r.map(|r| usf(r.floor.p50))
                    })
                    .collect(),
                color: chart::PALETTE[chart::PALETTE.len() - 1],
                hollow: true,
            });
            Panel::new(
                &format!("link: {link}"),
                "per allreduce p50, us",
                &cats,
                series,
            )
        })
        .collect::<Vec<_>>();
    chart::draw(
        path,
        "rpc-bench allreduce: median per allreduce (solid), link floor (light)",
        &panels,
        &["F32 elements per partial; from 32768 on they cross the link as bf16. Emulated links run through rpc-bench's user-space relay.".into()],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ratios() {
        assert_eq!(size_label(16384), "16384");
        assert_eq!(size_label(32768), "32768 (bf16)");
        let d = Duration::from_micros;
        assert_eq!(ratio(d(150), d(100)), "1.50");
        assert_eq!(ratio(d(1), Duration::ZERO), "-");
    }
}
