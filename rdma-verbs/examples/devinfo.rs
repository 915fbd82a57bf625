//! Prints what `rdma_verbs::devices()` sees (like `ibv_devinfo -v`, abridged)
//! and, for each IP given on the command line, the `find_gid_for_ip` match.
//!
//!     cargo run --release -p rdma-verbs --example devinfo -- [IP ...]
use std::process::ExitCode;

fn main() -> ExitCode {
    println!(
        "built_with_verbs={} available={}",
        rdma_verbs::built_with_verbs(),
        rdma_verbs::available()
    );
    if let Err(e) = rdma_verbs::load() {
        println!("no RDMA: {e}");
        return ExitCode::SUCCESS;
    }
    println!("gid_ex={}", rdma_verbs::has_gid_ex());
    let devs = match rdma_verbs::devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("devices(): {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{} device(s)", devs.len());
    for d in &devs {
        println!("device {}", d.name);
        if let Some(a) = &d.attr {
            println!(
                "  fw_ver={} node_guid={:016x} vendor={:#x}/{:#x} ports={} max_qp={} max_qp_wr={} max_cqe={} max_mr={} max_sge={}",
                a.fw_ver, a.node_guid, a.vendor_id, a.vendor_part_id, a.phys_port_cnt, a.max_qp, a.max_qp_wr, a.max_cqe,
                a.max_mr, a.max_sge
            );
        }
        if let Some(e) = &d.error {
            println!("  error: {e}");
        }
        for p in &d.ports {
            println!(
                "  port {}: state={:?} link_layer={:?} active_mtu={:?} max_mtu={:?} lid={} gid_tbl_len={}",
                p.port, p.state, p.link_layer, p.active_mtu.map(|m| m.bytes()), p.max_mtu.map(|m| m.bytes()), p.lid,
                p.gid_tbl_len
            );
            for g in &p.gids {
                println!("    GID[{}] {} {}", g.index, g.gid, g.gid_type);
            }
        }
    }
    for arg in std::env::args().skip(1) {
        match arg.parse() {
            Ok(ip) => match rdma_verbs::find_gid_for_ip(ip) {
                Ok(Some(m)) => println!(
                    "match {ip}: dev={} port={} gid={} {} mtu={} lid={} state={:?}",
                    m.device,
                    m.port,
                    m.gid_index,
                    m.gid_type,
                    m.active_mtu.bytes(),
                    m.lid,
                    m.port_state
                ),
                Ok(None) => println!("match {ip}: none"),
                Err(e) => println!("match {ip}: error {e}"),
            },
            Err(_) => eprintln!("not an IP address: {arg}"),
        }
    }
    ExitCode::SUCCESS
}
