//! The report of `rpc-bench e2e`: its markdown (prose and tables: results per link, where the
//! output layer goes, commands on the wire, RDMA wire cost per framing beside the VM's
//! measurement), CSV and chart, and [`command`], which runs the benchmark and writes them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bench_report::chart::{self, Panel};
use bench_report::{human_bytes, ms, ratio, Table};
use rpc_transport::rdma::wire::Framing;

use super::{placement_label, run, E2eConfig, E2eRow, Phase, OUTPUT_PLACEMENTS};
use crate::links::LinkKind;
use crate::traffic::WireTraffic;
use crate::Origin;

/// The results as a table (times per token; traffic per token).
pub fn table(rows: &[E2eRow]) -> Table {
    let n = |r: &E2eRow| f64::from(r.phase.tokens().max(1));
    let per_token = |d: Option<Duration>| d.map_or("-".into(), ms);
    Table::of(
        rows,
        &[
            ("server", &|r| r.server.clone()),
            ("link", &|r| r.link.clone()),
            ("test", &|r| r.phase.name()),
            ("t/s", &|r| match (r.measured, r.projected) {
                (Some(m), _) => format!("{:.2} ± {:.2}", m.tps, m.tps_sd),
                (None, Some(p)) => format!("({:.2})", n(r) / p.as_secs_f64().max(1e-12)),
                _ => "-".into(),
            }),
            ("ms/token measured", &|r| per_token(r.per_token()[0])),
            ("ms/token projected", &|r| per_token(r.per_token()[1])),
            ("link ms/token", &|r| per_token(r.per_token()[2])),
            ("round trips/token", &|r| {
                ratio(r.traffic.round_trips as f64 / n(r))
            }),
            ("bytes/token up", &|r| {
                format!("{:.0}", r.traffic.c2s_bytes as f64 / n(r))
            }),
            ("bytes/token down", &|r| {
                format!("{:.0}", r.traffic.s2c_bytes as f64 / n(r))
            }),
            ("numbers", &|r| r.origin.label().into()),
        ],
    )
}

/// Per server and link: ms per generated token under each placement (measured, or projected for
/// projection-only links) with the link's own share of it (round trips × RTT + bytes ÷
/// bandwidth, from the counted traffic), which is faster and by how much, and its flags.
pub fn placement_table(rows: &[E2eRow], servers: &[String], ngl: &str) -> Table {
    let names = OUTPUT_PLACEMENTS.map(|p| p.0);
    let [w, c] = names.map(|n| format!("{n}: tg ms/token (link share)"));
    let [faster, saves] = ["faster", "saves ms/token"];
    let mut t = Table::new(&["server", "link", &w, &c, faster, saves, "flags", "numbers"]);
    for server in servers {
        let labels = names.map(|n| placement_label(server, n));
        let links = chart::distinct(
            rows.iter()
                .filter(|r| labels.contains(&r.server))
                .map(|r| &r.link),
        );
        for link in links {
            // Per placement: its tg row and ms per token (measured, else projected).
            let per: Vec<Option<(&E2eRow, Duration)>> = labels
                .iter()
                .map(|label| {
                    let r = rows.iter().find(|r| {
                        r.server == *label && r.link == link && matches!(r.phase, Phase::Tg(_))
                    })?;
                    let [measured, projected, _] = r.per_token();
                    Some((r, measured.or(projected)?))
                })
                .collect();
            let mut row = vec![server.clone(), link.clone()];
            row.extend(per.iter().map(|v| {
                v.map_or("-".into(), |(r, d)| {
                    let share = r.per_token()[2];
                    let share = share.map_or(String::new(), |c| format!(" (link {})", ms(c)));
                    format!("{}{share}", ms(d))
                })
            }));
            let known = per
                .iter()
                .enumerate()
                .filter_map(|(i, v)| Some((i, (*v)?.1)));
            match (
                known.clone().min_by_key(|k| k.1),
                known.clone().max_by_key(|k| k.1),
            ) {
                (Some((bi, b)), Some((_, w))) if known.count() > 1 => {
                    row.push(names[bi].into());
                    row.push(format!(
                        "{} ({:.1} %)",
                        ms(w - b),
                        (w - b).as_secs_f64() / w.as_secs_f64().max(1e-12) * 100.0
                    ));
                    let flags = format!("-ngl {ngl} {}", OUTPUT_PLACEMENTS[bi].1.join(" "));
                    row.push(format!("`{}`", flags.trim_end()));
                }
                _ => row.extend(["-".into(), "-".into(), "-".into()]),
            }
            let origin = per.iter().flatten().next().map(|(r, _)| r.origin.label());
            row.push(origin.unwrap_or("-").into());
            t.push(row);
        }
    }
    t
}

/// Commands of each server per generated token and per prompt batch (from the `none` rows).
pub fn commands_table(rows: &[E2eRow]) -> Table {
    // Per generated token, or per prompt batch (one run).
    let unit = |r: &E2eRow| match r.phase {
        Phase::Tg(n) => ("per generated token".to_string(), f64::from(n.max(1))),
        Phase::Pp(n) => (format!("per prompt batch of {n} tokens"), 1.0),
    };
    let n = |r: &E2eRow| unit(r).1;
    Table::of(
        rows.iter().filter(|r| r.link == "none"),
        &[
            ("server", &|r| r.server.clone()),
            ("unit", &|r| unit(r).0),
            ("commands", &|r| r.traffic.commands_summary(n(r))),
            ("round trips", &|r| {
                ratio(r.traffic.round_trips as f64 / n(r))
            }),
            ("bytes up", &|r| {
                human_bytes(r.traffic.c2s_bytes as f64 / n(r))
            }),
            ("bytes down", &|r| {
                human_bytes(r.traffic.s2c_bytes as f64 / n(r))
            }),
        ],
    )
}

/// RDMA wire cost per generated token under each framing, computed from the captured traffic
/// with [`rpc_transport::rdma::wire`] (the `none` tg rows), beside what `tests/vm/test-lean.sh`
/// measured in the soft-RoCE VM (rxe counters; another model, so compare ratios) when given.
pub fn wire_table(rows: &[E2eRow], measured: Option<&str>) -> Table {
    // One row per server and framing.
    let cells: Vec<(&E2eRow, usize, Framing)> = rows
        .iter()
        .filter(|r| r.link == "none" && matches!(r.phase, Phase::Tg(_)))
        .flat_map(|r| {
            Framing::ALL
                .iter()
                .enumerate()
                .map(move |(i, f)| (r, i, *f))
        })
        .collect();
    let n = |r: &E2eRow| f64::from(r.phase.tokens().max(1));
    let per = |(r, i, _): &(&E2eRow, usize, Framing), f: fn(&WireTraffic) -> u64| {
        f(&r.traffic.wire[*i]) as f64 / n(r)
    };
    let vm = |&(_, _, f): &(&E2eRow, usize, Framing), pick: fn((f64, f64)) -> f64| {
        measured
            .and_then(|m| vm_wire(m, f))
            .map_or("-".into(), |m| format!("{:.1}", pick(m)))
    };
    Table::of(
        cells,
        &[
            ("server", &|c| c.0.server.clone()),
            ("framing", &|c| c.2.name().into()),
            ("SENDs/token", &|c| {
                let credits = per(c, |w| w.credit_sends);
                let credits = if credits > 0.0 {
                    format!(" (≤ {credits:.1} credit-only)")
                } else {
                    String::new()
                };
                format!("{:.1}{credits}", per(c, |w| w.sends))
            }),
            ("packets/token (MTU 1024)", &|c| {
                format!("{:.1}", per(c, |w| w.packets[0]))
            }),
            ("packets/token (MTU 4096)", &|c| {
                format!("{:.1}", per(c, |w| w.packets[1]))
            }),
            ("bytes on the wire/token", &|c| {
                human_bytes(per(c, |w| w.bytes))
            }),
            ("vs upstream UC packets", &|c| {
                let apple = c.0.traffic.wire[1].packets[0] as f64 / n(c.0);
                if apple > 0.0 {
                    format!("1/{:.0}", apple / per(c, |w| w.packets[0]).max(1e-9))
                } else {
                    "-".into()
                }
            }),
            ("VM measured SENDs/token", &|c| vm(c, |m| m.0)),
            ("VM measured packets/token (MTU 1024)", &|c| vm(c, |m| m.1)),
            ("source", &|c| {
                if c.2.is_lean() {
                    "computed: no-response requests coalesced into the next round trip".into()
                } else {
                    "computed: upstream's framing of each message".into()
                }
            }),
        ],
    )
}

/// (SENDs/token, packets/token) that `tests/vm/test-lean.sh` measured for a framing, from the table
/// it writes (`target/lean-vm/lean-table.txt`: lines `config SENDs/token packets/token` for a-rc,
/// a-uc (stock client, upstream flavors) and b-rc, b-uc (through rpc-shim, lean framing)).
pub fn vm_wire(table: &str, f: Framing) -> Option<(f64, f64)> {
    let key = ["a-rc", "a-uc", "b-rc", "b-uc"][Framing::ALL.iter().position(|k| *k == f)?];
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))?;
    let mut n = line.split_whitespace().skip(1).map(|x| x.parse().ok());
    Some((n.next()??, n.next()??))
}

/// `rpc-bench e2e`: runs the benchmark and writes its report.
pub fn command(cfg: E2eConfig) -> anyhow::Result<()> {
    // Read before the run, so that a wrong --vm-wire fails at once.
    let vm_path = cfg
        .vm_wire
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/lean-vm/lean-table.txt"));
    let vm = match std::fs::read_to_string(&vm_path) {
        Ok(text) => Some(text),
        Err(e) if cfg.vm_wire.is_some() => anyhow::bail!("--vm-wire {}: {e}", vm_path.display()),
        Err(_) => None,
    };
    let (rows, notes) = run(&cfg)?;
    let mut md = format!(
        "## rpc-bench e2e\n\nClient: stock `llama-bench -ngl {} -sm {} -p {} -n {} -r {} -t {} {}` ({}, protocol {}), model `{}`; servers: {}; \
         timings averaged over {} rounds (each round runs every link for every server in turn).\n\
         Per token: pp = one {}-token batch ÷ {}, tg = one generated token. Round trips and bytes are counted \
         exactly by the relay (difference between -r 1 and -r {} runs). `numbers`: *measured (relay, no delay)* \
         is the base; *measured (emulated link)* ran through the user-space link emulator; *projected* = base + \
         round trips × RTT + bytes ÷ bandwidth (t/s in parentheses are projected).\n\n",
        cfg.ngl,
        cfg.split_mode,
        cfg.n_prompt,
        cfg.n_gen,
        cfg.reps,
        cfg.threads,
        cfg.bench_args,
        cfg.stock.dir().display(),
        cfg.stock.proto,
        cfg.model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        cfg.server.iter().map(|t| {
            let addrs = t.addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>();
            format!("{} ({})", t.label, addrs.join(" + "))
        }).collect::<Vec<_>>().join(", "),
        cfg.rounds,
        cfg.n_prompt,
        cfg.n_prompt,
        cfg.reps,
    );
    md.push_str(&table(&rows).markdown());
    if cfg.compare_output {
        md.push_str(
            "\nWhere the output layer goes: on the worker the whole logits vector comes back every \
             token; on the client (its matrix kept in client memory by `-ot`) only the hidden state \
             does, and the client computes the logits. ms per generated token per placement, the \
             faster one, what it saves, and the flags to use.\n\n",
        );
        let servers: Vec<String> = cfg.server.iter().map(|t| t.label.clone()).collect();
        md.push_str(&placement_table(&rows, &servers, &cfg.ngl).markdown());
    }
    md.push_str("\nCommands on the wire (counted through the relay):\n\n");
    md.push_str(&commands_table(&rows).markdown());
    md.push_str(
        "\nRDMA wire cost per generated token: the traffic above framed by each RDMA flavor \
         (`rpc_transport::rdma::wire`, checked SEND by SEND against the framings on the fake fabric). \
         Upstream RC: every `send_data()` part is a SEND; upstream UC (Apple): every message is whole \
         128 KiB strides; lean (ours, rpc-shim or rpc-client to rpc-server): no-response requests \
         coalesced into the next round trip, frames sized to the data.",
    );
    if vm.is_some() {
        md.push_str(&format!(
            " The VM columns come from `{}` (tests/vm/test-lean.sh: rxe counters in the soft-RoCE VM, \
             synthetic llama model, stock client, through the real rpc-shim for lean): a different model, \
             so compare ratios between framings.",
            vm_path.display()
        ));
    }
    md.push_str("\n\n");
    md.push_str(&wire_table(&rows, vm.as_deref()).markdown());
    md.push('\n');
    for l in &notes {
        md.push_str(&format!("- {l}\n"));
    }
    md.push('\n');
    md.push_str(&cfg.common.links_section());
    cfg.common.out.emit(&md, &table(&rows))?;
    if let Some(png) = &cfg.png {
        draw_chart(png, &rows, &cfg)?;
    }
    Ok(())
}

fn draw_chart(path: &Path, rows: &[E2eRow], cfg: &E2eConfig) -> anyhow::Result<()> {
    let cats = chart::distinct(rows.iter().map(|r| &r.link));
    let servers = chart::distinct(rows.iter().map(|r| &r.server));
    let mut panels = Vec::new();
    for (phase, title) in [
        (
            Phase::Tg(cfg.n_gen),
            format!("generation (tg{}): ms per token", cfg.n_gen),
        ),
        (
            Phase::Pp(cfg.n_prompt),
            format!("prompt processing (pp{}): ms per token", cfg.n_prompt),
        ),
    ] {
        let find = |s: &str, l: &str| {
            (rows.iter()).find(|r| r.server == s && r.link == l && r.phase == phase)
        };
        let measured = |r: &E2eRow| r.per_token()[0].map(|d| d.as_secs_f64() * 1e3);
        let projected = |r: &E2eRow| {
            let p = r.per_token()[1].filter(|_| r.origin != Origin::MeasuredRelay);
            p.map(|d| d.as_secs_f64() * 1e3)
        };
        let series = chart::measured_and_projected(
            &servers,
            &cats,
            find,
            ("measured", &measured),
            &projected,
        );
        panels.push(Panel::new(&title, "ms per token", &cats, series));
    }
    // The link's own share per generated token: deterministic, from the counted traffic.
    let link_cats: Vec<String> = cats
        .iter()
        .filter(|c| c.as_str() != "none" && c.as_str() != "direct")
        .cloned()
        .collect();
    let tg = Phase::Tg(cfg.n_gen);
    let names: Vec<String> = servers.iter().map(|s| format!("{s} projected")).collect();
    let series = chart::series(&names, &link_cats, true, |ti, l| {
        rows.iter()
            .find(|r| r.server == servers[ti] && r.link == l && r.phase == tg)
            .and_then(|r| r.per_token()[2])
            .map(|d| d.as_secs_f64() * 1e3)
    });
    let title = format!(
        "link share of a generated token (tg{}): round trips x RTT + bytes / bandwidth",
        cfg.n_gen
    );
    panels.push(Panel::new(&title, "ms per token", &link_cats, series));
    let mut footer = vec![format!(
        "Stock llama-bench -ngl {} through each link to the worker; solid = measured (none: loopback + counting relay; \
         others: user-space link emulator), light = projected.",
        cfg.ngl
    )];
    for l in cfg
        .common
        .links()
        .iter()
        .filter(|l| l.kind != LinkKind::Native)
    {
        let (figures, kind) = (l.figures(), l.kind.label());
        let pad = match l.name.as_str() {
            "tb5-rdma" => "; messages padded to 128 KiB strides (upstream Apple UC flavor)",
            _ => "",
        };
        footer.push(format!("{}: {figures} ({kind}){pad}", l.name));
    }
    chart::draw(
        path,
        "rpc-bench e2e: per-token latency per link",
        &panels,
        &footer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2e::BenchResult;
    use crate::traffic::Traffic;

    #[test]
    fn parses_the_vm_lean_table() {
        let t = "config      SENDs/token    packets/token\na-rc  26.0  53.1\na-uc 9.0 1152.0\nb-rc 4.6 13.2\nb-uc garbage\n";
        assert_eq!(vm_wire(t, Framing::UpstreamRc), Some((26.0, 53.1)));
        assert_eq!(vm_wire(t, Framing::AppleUc), Some((9.0, 1152.0)));
        assert_eq!(vm_wire(t, Framing::LeanRc), Some((4.6, 13.2)));
        assert_eq!(vm_wire(t, Framing::LeanUc), None);
    }

    #[test]
    fn placement_table_names_the_faster_placement() {
        let row = |server: &str, link: &str, ms_per_run: u64| E2eRow {
            server: server.into(),
            link: link.into(),
            phase: Phase::Tg(4),
            measured: Some(BenchResult {
                phase: Phase::Tg(4),
                avg: Duration::from_millis(ms_per_run),
                stddev: Duration::ZERO,
                tps: 0.0,
                tps_sd: 0.0,
            }),
            projected: None,
            traffic: Traffic::default(),
            link_cost: (link != "none").then(|| Duration::from_millis(ms_per_run / 10)),
            origin: Origin::MeasuredEmulated,
        };
        // Worker: 40 ms per token on 2.5gbe, client: 30; on none the worker wins (8 vs 10).
        let [w, c] = OUTPUT_PLACEMENTS.map(|p| placement_label("a", p.0));
        let rows = [
            row(&w, "none", 32),
            row(&c, "none", 40),
            row(&w, "2.5gbe", 160),
            row(&c, "2.5gbe", 120),
        ];
        let t = placement_table(&rows, &["a".into()], "99");
        assert_eq!(t.rows.len(), 2);
        let [wn, cn] = OUTPUT_PLACEMENTS.map(|p| p.0);
        assert_eq!(t.rows[0][1..5], ["none", "8.000", "10.000", wn]);
        assert_eq!(t.rows[0][5], "2.000 (20.0 %)");
        assert_eq!(
            t.rows[1][1..5],
            ["2.5gbe", "40.000 (link 4.000)", "30.000 (link 3.000)", cn]
        );
        assert_eq!(t.rows[1][5], "10.000 (25.0 %)");
        let flags = r"`-ngl 99 -ot ^(output|token_embd)\.weight$=CPU`";
        assert_eq!(t.rows[1][6], flags);
    }
}
