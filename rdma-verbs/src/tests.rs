//! Unit tests that need no RDMA device (they also pass on a machine with
//! devices: device-dependent assertions are conditional).
use super::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[test]
fn gid_from_ipv4_is_mapped() {
    let g = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)));
    assert_eq!(g.0[..12], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
    assert_eq!(g.0[12..], [10, 77, 0, 1]);
    assert_eq!(g.to_string(), "::ffff:10.77.0.1");
    assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)));
    let v6: Ipv6Addr = "fe80::1".parse().unwrap();
    assert_eq!(Gid::from_ip(IpAddr::V6(v6)).to_ipv6(), v6);
    assert!(Gid::default().is_zero());
}

#[test]
fn mtu_conversions() {
    assert_eq!(Mtu::Mtu1024.bytes(), 1024);
    assert_eq!(Mtu::Mtu4096.bytes(), 4096);
    assert_eq!(Mtu::Mtu256.bytes(), 256);
    assert_eq!(Mtu::from_raw(3), Some(Mtu::Mtu1024));
    assert_eq!(Mtu::from_raw(0), None);
    assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
}

#[test]
fn gid_type_preference() {
    assert!(GidType::RoceV2.rank() < GidType::RoceV1.rank());
    assert!(GidType::RoceV1.rank() < GidType::Ib.rank());
}

#[cfg(target_os = "linux")]
#[test]
fn sysfs_gid_type_parse() {
    use crate::platform::parse_sysfs_gid_type;
    assert_eq!(parse_sysfs_gid_type("RoCE v2\n"), GidType::RoceV2);
    assert_eq!(parse_sysfs_gid_type("IB/RoCE v1\n"), GidType::RoceV1);
    assert_eq!(parse_sysfs_gid_type("?"), GidType::Unknown);
}

#[test]
fn wc_status_names() {
    assert!(WcStatus::SUCCESS.is_success());
    assert_eq!(WcStatus::WR_FLUSH_ERR.name(), "Work Request Flushed Error");
    assert_eq!(
        WcStatus::RETRY_EXC_ERR.name(),
        "transport retry counter exceeded"
    );
    assert_eq!(WcStatus(999).name(), "unknown");
    let wc = WorkCompletion::default();
    assert!(wc.is_success());
    assert_eq!(wc.opcode(), WcOpcode::Send);
}

#[test]
fn flags_compose() {
    let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    assert!(a.contains(AccessFlags::LOCAL_WRITE));
    assert!(!a.contains(AccessFlags::REMOTE_WRITE));
    let s = SendFlags::SIGNALED | SendFlags::INLINE;
    assert!(s.contains(SendFlags::INLINE));
}

#[test]
fn aligned_buf_is_page_aligned_and_zeroed() {
    let ps = page_size();
    assert!(ps.is_power_of_two() && ps >= 4096);
    let mut b = AlignedBuf::new(28 * 1024 + 3).unwrap();
    assert_eq!(b.as_ptr() as usize % ps, 0);
    assert_eq!(b.len(), 28 * 1024 + 3);
    assert!(b.as_slice().iter().all(|&x| x == 0));
    b.as_mut_slice()[5] = 7;
    assert_eq!(b.as_slice()[5], 7);
    assert!(matches!(
        AlignedBuf::new(0),
        Err(VerbsError::InvalidArgument(_))
    ));
    assert!(matches!(
        AlignedBuf::new(usize::MAX - 10),
        Err(VerbsError::InvalidArgument(_))
    ));
}

#[test]
fn rdma_upstream_attr_presets() {
    let rts = RtsAttr::rc(5);
    assert_eq!(
        (rts.timeout, rts.retry_cnt, rts.rnr_retry, rts.max_rd_atomic),
        (Some(14), Some(7), Some(7), Some(1))
    );
    let uc = RtsAttr::uc(0);
    assert_eq!((uc.timeout, uc.retry_cnt), (None, None));
    let av = AddressVector::global(Gid::default(), 1, 1, 0);
    assert!(av.is_global && av.hop_limit == 1);
    let rtr = RtrAttr::uc(Mtu::Mtu1024, 17, 0, av);
    assert_eq!((rtr.max_dest_rd_atomic, rtr.min_rnr_timer), (None, None));
    let rtr = RtrAttr::rc(Mtu::Mtu1024, 17, 17, av);
    assert_eq!(
        (rtr.max_dest_rd_atomic, rtr.min_rnr_timer),
        (Some(1), Some(1))
    );
}

/// Whatever this machine has (no library, library without kernel RDMA,
/// or real devices), the entry points answer with values or typed errors.
#[test]
fn no_panic_whatever_the_machine() {
    let avail = available();
    assert_eq!(avail, load().is_ok());
    if !built_with_verbs() {
        assert!(!avail);
    }
    match devices() {
        Ok(devs) => {
            assert!(avail);
            for d in &devs {
                assert!(!d.name.is_empty());
            }
        }
        Err(e) => assert!(e.is_library_missing(), "{e}"),
    }
    match Context::open("rdma-verbs-no-such-device") {
        Err(VerbsError::NoSuchDevice(n)) => assert_eq!(n, "rdma-verbs-no-such-device"),
        Err(e) => assert!(e.is_library_missing(), "{e}"),
        Ok(_) => panic!("opened a device that cannot exist"),
    }
    // TEST-NET-3: never a local address.
    match find_gid_for_ip("203.0.113.77".parse().unwrap()) {
        Ok(m) => assert!(m.is_none(), "{m:?}"),
        Err(e) => assert!(e.is_library_missing(), "{e}"),
    }
}

/// Runs the current test binary again with `RDMA_VERBS_LIBRARY` pointing at a
/// library that does not exist: every call must report LibraryMissing.
#[test]
fn missing_library_is_a_typed_error() {
    if std::env::var_os("RDMA_VERBS_CHILD").is_some() {
        assert!(!available());
        let e = load().unwrap_err();
        assert!(e.is_library_missing(), "{e}");
        assert!(e.to_string().contains("unavailable"), "{e}");
        assert!(matches!(devices(), Err(VerbsError::LibraryMissing(_))));
        assert!(matches!(
            Context::open("rxe0"),
            Err(VerbsError::LibraryMissing(_))
        ));
        assert!(matches!(
            find_gid_for_ip("10.77.0.1".parse().unwrap()),
            Err(VerbsError::LibraryMissing(_))
        ));
        let io: std::io::Error = e.into();
        assert_eq!(io.kind(), std::io::ErrorKind::Unsupported);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "tests::missing_library_is_a_typed_error",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RDMA_VERBS_CHILD", "1")
        .env(LIBRARY_ENV, "/nonexistent/libibverbs-rdma-verbs-test.so.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
}

/// On a machine with rdma-core but a kernel without RDMA (the dev / CI VMs),
/// the library loads and there is simply no device.
#[cfg(target_os = "linux")]
#[test]
fn kernel_without_rdma_means_no_devices() {
    if !available() || std::path::Path::new("/sys/class/infiniband").exists() {
        return;
    }
    assert_eq!(devices().unwrap(), vec![]);
    assert_eq!(Context::device_names().unwrap(), Vec::<String>::new());
}
