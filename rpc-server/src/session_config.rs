//! What each session computes with, built from its options alone ([`session_config`]): the
//! devices (named by `-d`, else every GPU, else the CPU), the weight cache of `-c` and the
//! `--gguf` weights; the same in the front (or the one process of `--no-isolate`) and in a
//! session process. Also how the stock tool lists a device ([`device_line`]).

use anyhow::{bail, Context};
use rpc_ggml::{Device, DeviceKind};
use rpc_session::SessionConfig;
use rpc_weights::cache::WeightCache;
use rpc_weights::local_weights::LocalWeights;

use crate::options::SessionOptions;

const MIB: u64 = 1024 * 1024;

/// A device as the stock tool lists it: `  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)`.
pub fn device_line(d: &Device) -> String {
    let (free, total) = d.memory();
    format!(
        "  {}: {} ({} MiB, {} MiB free)",
        d.name(),
        d.description(),
        total / MIB,
        free / MIB
    )
}

fn select_devices(names: &[String]) -> anyhow::Result<Vec<Device>> {
    let all = Device::all();
    if !names.is_empty() {
        let mut out = Vec::new();
        for n in names {
            match Device::by_name(n) {
                Some(d) => out.push(d),
                None => {
                    eprintln!("error: unknown device: {n}");
                    eprintln!("available devices:");
                    for d in &all {
                        eprintln!("  {}: {}", d.name(), d.description());
                    }
                    bail!("no such device: {n}");
                }
            }
        }
        return Ok(out);
    }
    let gpus: Vec<Device> = all
        .iter()
        .filter(|d| !matches!(d.kind(), DeviceKind::Cpu | DeviceKind::Accel))
        .cloned()
        .collect();
    if !gpus.is_empty() {
        return Ok(gpus);
    }
    all.into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .map(|d| vec![d])
        .context("no CPU device found")
}

/// What each session computes with, from its options: the devices, the weight cache and the
/// `--gguf` weights. A session process opens the cache read-only (its writes go to the front)
/// and reads the `--gguf` index its front made.
pub fn session_config(o: &SessionOptions, in_child: bool) -> anyhow::Result<SessionConfig> {
    let devices = select_devices(&o.devices)?
        .into_iter()
        .map(|d| d.reporting(o.reported_memory))
        .collect();
    let cache = match &o.cache_dir {
        Some(dir) => {
            let opened = match in_child {
                true => WeightCache::open_read_only(dir, o.cache_max_size),
                false => WeightCache::open(dir, o.cache_max_size),
            };
            // Only this process (the front) must reach the directory: a session process has its
            // entries opened by the front (Linux) or shares its uid (macOS).
            let cache = opened
                .with_context(|| match in_child {
                    true => format!("cannot open cache directory {}", dir.display()),
                    false => format!(
                        "cannot open cache directory {}: the server creates, reads and writes it \
                         as the user it runs as; give that user access to it (its owner or mode, \
                         and search permission on its parents), or name another with --cache-dir",
                        dir.display()
                    ),
                })?
                .verify_every_load(o.verify_loads);
            Some(match o.trusted_seeded_before {
                Some(t) => cache.trusted_only(i128::from(t)),
                None => cache,
            })
        }
        None => None,
    };
    let local = match o.gguf.is_empty() {
        true => None,
        false => {
            let index = o.gguf_index.clone();
            let local = match in_child {
                true => LocalWeights::from_index(&o.gguf, index)?,
                false => {
                    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                    LocalWeights::build(&o.gguf, index, threads)?
                }
            };
            Some(local.verify_every_load(o.verify_loads))
        }
    };
    Ok(SessionConfig {
        devices,
        n_threads: o.threads,
        cache,
        local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::ServerOptions;
    use crate::server;

    /// `-m/--mem`: what every device reports (GET_DEVICE_MEMORY answers from `Device::memory`),
    /// and the default `--max-alloc-total` it bounds: a device counts with the smaller of what it
    /// reports and what it has.
    #[test]
    fn mem_is_what_the_devices_report_and_bounds_the_default_total() {
        let cpu = |reported| SessionOptions {
            devices: vec!["CPU".into()],
            reported_memory: reported,
            ..SessionOptions::default()
        };
        let own = session_config(&cpu(None), false).unwrap();
        let (_, has) = own.devices[0].actual_memory();
        assert_eq!(own.devices[0].memory(), own.devices[0].actual_memory());
        assert_eq!(server::device_memory(&own), has);
        let less = session_config(&cpu(Some(64 << 20)), false).unwrap();
        assert_eq!(less.devices[0].memory(), (64 << 20, 64 << 20));
        assert_eq!(server::device_memory(&less), 64 << 20);
        let more = session_config(&cpu(Some(has * 4)), false).unwrap();
        assert_eq!(more.devices[0].memory(), (has * 4, has * 4));
        assert_eq!(server::device_memory(&more), has, "bounded by what it has");
        // The options a session process is configured from carry it.
        let o = ServerOptions {
            session: cpu(Some(64 << 20)),
            ..ServerOptions::default()
        };
        assert_eq!(o.memory(server::device_memory(&less)).total, 64 << 20);
    }
}
