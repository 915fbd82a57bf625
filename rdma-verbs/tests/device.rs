//! Tests against a real RDMA device.  Skipped (pass trivially, printing a
//! note) unless `RDMA_VERBS_TEST_DEVICE` names a device, e.g. inside the
//! soft-RoCE VM:
//!
//!     tests/vm/cargo-vm.sh test --release -p rdma-verbs --no-run
//!     tests/vm/run-in-vm.sh tests/vm/rdma-verbs-tests.sh
//!
//! `RDMA_VERBS_TEST_IP` (default 10.77.0.1) is an address whose GID the device holds.
use std::time::Duration;

use rdma_verbs::*;

const T: Option<Duration> = Some(Duration::from_secs(10));

fn device() -> Option<String> {
    match std::env::var("RDMA_VERBS_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            eprintln!("RDMA_VERBS_TEST_DEVICE not set: skipping device test");
            None
        }
    }
}

fn test_ip() -> std::net::IpAddr {
    std::env::var("RDMA_VERBS_TEST_IP")
        .unwrap_or_else(|_| "10.77.0.1".into())
        .parse()
        .unwrap()
}

/// Two QPs of one type on one device, connected to each other (loopback).
/// Field order is drop order: the QPs are destroyed before the MRs, so every
/// work request the tests post on `amr`/`bmr` ends before its region is
/// deregistered (the contract of the `unsafe` `Qp::post_send`/`post_recv`).
struct Pair {
    a: Qp,
    b: Qp,
    amr: Mr,
    bmr: Mr,
    acq: Cq,
    bcq: Cq,
    pd: Pd,
    m: GidMatch,
}

const BUF: usize = 64 << 10;

fn pair(dev: &str, qt: QpType, ch: Option<&CompChannel>, ctx: &Context) -> Pair {
    let m = find_gid_with(
        test_ip(),
        &GidSearch {
            device: Some(dev.into()),
            ..Default::default()
        },
    )
    .unwrap()
    .expect("no GID for the test IP");
    let pd = Pd::new(ctx).unwrap();
    let acq = Cq::new(ctx, 64, ch).unwrap();
    let bcq = Cq::new(ctx, 64, ch).unwrap();
    let mut ia = QpInitAttr::new(qt, &acq, &acq, 16, 16);
    ia.max_inline_data = 128;
    let a = Qp::new(&pd, &ia).unwrap();
    let mut ib = QpInitAttr::new(qt, &bcq, &bcq, 16, 16);
    ib.max_inline_data = 128;
    let b = Qp::new(&pd, &ib).unwrap();
    assert!(a.max_inline() >= 128, "{:?}", a.caps());
    let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let amr = Mr::new(&pd, AlignedBuf::new(BUF).unwrap(), acc).unwrap();
    let bmr = Mr::new(&pd, AlignedBuf::new(BUF).unwrap(), acc).unwrap();
    assert_eq!(a.state().unwrap(), QpState::Reset);
    for q in [&a, &b] {
        q.modify_to_init(&InitAttr::upstream(m.port)).unwrap();
        assert_eq!(q.state().unwrap(), QpState::Init);
    }
    let sgid = m.gid_index as u8;
    let av = AddressVector::global(m.gid, sgid, m.port, m.lid);
    let (apsn, bpsn) = match qt {
        QpType::Rc => (a.qp_num() & 0xff_ffff, b.qp_num() & 0xff_ffff),
        QpType::Uc => (0, 0),
    };
    for (q, peer, rq, sq) in [(&a, &b, bpsn, apsn), (&b, &a, apsn, bpsn)] {
        match qt {
            QpType::Rc => {
                q.modify_to_rtr(&RtrAttr::rc(m.active_mtu, peer.qp_num(), rq, av))
                    .unwrap();
                assert_eq!(q.state().unwrap(), QpState::Rtr);
                q.modify_to_rts(&RtsAttr::rc(sq)).unwrap();
            }
            QpType::Uc => {
                q.modify_to_rtr(&RtrAttr::uc(m.active_mtu, peer.qp_num(), rq, av))
                    .unwrap();
                q.modify_to_rts(&RtsAttr::uc(sq)).unwrap();
            }
        }
        assert_eq!(q.state().unwrap(), QpState::Rts);
    }
    Pair {
        a,
        b,
        amr,
        bmr,
        acq,
        bcq,
        pd,
        m,
    }
}

fn fill(mr: &mut Mr, off: usize, len: usize, seed: u8) {
    for (j, x) in mr.as_mut_slice()[off..off + len].iter_mut().enumerate() {
        *x = seed.wrapping_add((j * 7 % 251) as u8);
    }
}

/// a → b transfer of `len` bytes, checked byte for byte.
fn transfer(p: &mut Pair, len: usize, inline: bool, seed: u8) {
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.b.post_recv(7, &p.bmr, 4096, len.max(1)) }.unwrap();
    fill(&mut p.amr, 0, len, seed);
    let mut f = SendFlags::SIGNALED;
    if inline {
        f |= SendFlags::INLINE;
    }
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.a.post_send(9, &p.amr, 0, len, f) }.unwrap();
    let s = p.acq.poll_one_blocking(T).unwrap();
    assert!(s.is_success(), "{s:?}");
    assert_eq!((s.wr_id(), s.opcode()), (9, WcOpcode::Send));
    let r = p.bcq.poll_one_blocking(T).unwrap();
    assert!(r.is_success(), "{r:?}");
    assert_eq!(
        (r.wr_id(), r.opcode(), r.byte_len() as usize),
        (7, WcOpcode::Recv, len)
    );
    assert_eq!(p.bmr.as_slice()[4096..4096 + len], p.amr.as_slice()[..len]);
}

#[test]
fn probe_finds_the_test_gid() {
    let Some(dev) = device() else { return };
    let devs = devices().unwrap();
    let d = devs.iter().find(|d| d.name == dev).expect("device listed");
    assert!(d.error.is_none(), "{:?}", d.error);
    let p = &d.ports[0];
    assert_eq!(p.state, PortState::Active);
    let want = Gid::from_ip(test_ip());
    assert!(p.gids.iter().any(|g| g.gid == want), "{:?}", p.gids);
    let m = find_gid_for_ip(test_ip()).unwrap().unwrap();
    assert_eq!(m.device, dev);
    assert_eq!(m.gid, want);
    assert_eq!(m.gid_type, GidType::RoceV2);
    // Upstream flavors' port selections find the same entry.
    for ports in [PortChoice::Fixed(1), PortChoice::FirstActive] {
        let s = GidSearch {
            device: Some(dev.clone()),
            ports,
            gid_index: None,
        };
        assert_eq!(
            find_gid_with(test_ip(), &s).unwrap().unwrap().gid_index,
            m.gid_index
        );
    }
    // GGML_RDMA_GID-style forced index.
    let s = GidSearch {
        gid_index: Some(m.gid_index),
        ..Default::default()
    };
    assert_eq!(
        find_gid_with("192.0.2.1".parse().unwrap(), &s)
            .unwrap()
            .unwrap()
            .gid,
        want
    );
    assert_eq!(
        find_gid_with("192.0.2.1".parse().unwrap(), &GidSearch::default()).unwrap(),
        None
    );
    let ctx = Context::open(&dev).unwrap();
    let e = ctx.gid_entry(m.port, m.gid_index).unwrap();
    assert_eq!((e.gid, e.gid_type), (want, GidType::RoceV2));
    assert_eq!(ctx.query_gid(m.port, m.gid_index).unwrap(), want);
    assert!(matches!(
        Context::open("no-such-rdma-dev"),
        Err(VerbsError::NoSuchDevice(_))
    ));
}

#[test]
fn rc_loopback_transfers() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let mut p = pair(&dev, QpType::Rc, None, &ctx);
    transfer(&mut p, 64, true, 1);
    transfer(&mut p, 64, false, 2);
    transfer(&mut p, 28 << 10, false, 3);
    transfer(&mut p, 0, false, 4);
    let data = [0x5au8; 100];
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.b.post_recv(1, &p.bmr, 0, 256) }.unwrap();
    p.a.post_send_inline(2, &data, SendFlags::SIGNALED).unwrap();
    assert!(p.acq.poll_one_blocking(T).unwrap().is_success());
    let r = p.bcq.poll_one_blocking(T).unwrap();
    assert_eq!(r.byte_len(), 100);
    assert_eq!(&p.bmr.as_slice()[..100], &data[..]);
    let _ = p.m.active_mtu;
}

#[test]
fn uc_loopback_transfers() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let mut p = pair(&dev, QpType::Uc, None, &ctx);
    transfer(&mut p, 64, true, 5);
    transfer(&mut p, 28 << 10, false, 6);
    transfer(&mut p, 4096, false, 7);
}

#[test]
fn completion_channel_events() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let ch = CompChannel::new(&ctx).unwrap();
    assert!(ch.fd() >= 0);
    let mut p = pair(&dev, QpType::Rc, Some(&ch), &ctx);
    // Nothing armed, nothing pending: no event, and wait() honours its timeout.
    assert!(ch.try_get_event().unwrap().is_none());
    assert!(ch.wait(Some(Duration::from_millis(50))).unwrap().is_none());
    p.bcq.req_notify(false).unwrap();
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.b.post_recv(3, &p.bmr, 0, 64) }.unwrap();
    fill(&mut p.amr, 0, 64, 9);
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.a.post_send(4, &p.amr, 0, 64, SendFlags::SIGNALED) }.unwrap();
    let ev = ch.wait(T).unwrap().expect("CQ event");
    assert!(ev.is_for(&p.bcq));
    assert!(!ev.is_for(&p.acq));
    ev.ack();
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(p.bcq.poll(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id(), 3);
    assert!(p.acq.poll_one_blocking(T).unwrap().is_success());
    // An un-acked event is acked by its drop; the CQ can then be destroyed.
    p.acq.req_notify(false).unwrap();
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.b.post_recv(5, &p.bmr, 0, 64) }.unwrap();
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.a.post_send(6, &p.amr, 0, 64, SendFlags::SIGNALED) }.unwrap();
    let ev = ch.wait(T).unwrap().expect("CQ event");
    assert!(ev.is_for(&p.acq));
    assert!(p.acq.poll_one_blocking(T).unwrap().is_success());
    assert!(p.bcq.poll_one_blocking(T).unwrap().is_success());
    drop(p);
    drop(ev);
}

#[test]
fn errors_are_typed_not_panics() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let p = pair(&dev, QpType::Rc, None, &ctx);
    // Bounds, inline size, foreign PD, foreign context.
    let e =
        // SAFETY: rejected before anything is posted.
        unsafe { p.a.post_send(1, &p.amr, BUF - 8, 16, SendFlags::SIGNALED) }
            .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
    let e =
        // SAFETY: rejected before anything is posted.
        unsafe { p.a.post_send(1, &p.amr, 0, 4096, SendFlags::SIGNALED | SendFlags::INLINE) }
            .unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
    assert!(p
        .a
        .post_send_inline(1, &vec![0u8; 4096], SendFlags::SIGNALED)
        .is_err());
    let pd2 = Pd::new(&ctx).unwrap();
    let mr2 = Mr::new(
        &pd2,
        AlignedBuf::new(4096).unwrap(),
        AccessFlags::LOCAL_WRITE,
    )
    .unwrap();
    assert!(matches!(
        // SAFETY: rejected (foreign PD) before anything is posted.
        unsafe { p.a.post_recv(1, &mr2, 0, 64) },
        Err(VerbsError::InvalidArgument(_))
    ));
    let ctx2 = Context::open(&dev).unwrap();
    let cq2 = Cq::new(&ctx2, 4, None).unwrap();
    let e = Qp::new(&p.pd, &QpInitAttr::new(QpType::Rc, &cq2, &cq2, 1, 1))
        .err()
        .unwrap();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
    // A transition the QP state machine rejects: errno from the kernel.
    let q = Qp::new(&p.pd, &QpInitAttr::new(QpType::Rc, &p.acq, &p.acq, 1, 1)).unwrap();
    let av = AddressVector::global(p.m.gid, p.m.gid_index as u8, p.m.port, 0);
    let e = q
        .modify_to_rtr(&RtrAttr::rc(Mtu::Mtu1024, 1, 0, av))
        .unwrap_err();
    assert!(e.errno().is_some(), "{e}");
    assert!(e.to_string().contains("modify_qp(RTR)"), "{e}");
}

#[test]
fn oversize_message_and_flush_complete_with_error_status() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let p = pair(&dev, QpType::Rc, None, &ctx);
    // 128 bytes into a 64-byte receive: the receive completes in error
    // (HCAs: LOC_LEN_ERR; rxe 6.12: LOC_QP_OP_ERR), the sender gets a
    // remote error; nothing overflows.  Only wr_id and status are defined
    // for error completions (opcode/byte_len are not).
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.b.post_recv(11, &p.bmr, 0, 64) }.unwrap();
    // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
    unsafe { p.a.post_send(12, &p.amr, 0, 128, SendFlags::SIGNALED) }.unwrap();
    let r = p.bcq.poll_one_blocking(T).unwrap();
    assert_eq!(r.wr_id(), 11);
    assert!(
        r.status() == WcStatus::LOC_LEN_ERR || r.status() == WcStatus::LOC_QP_OP_ERR,
        "{r:?}"
    );
    assert!(r.ok().is_err());
    assert_eq!(p.b.state().unwrap(), QpState::Err);
    let s = p.acq.poll_one_blocking(T).unwrap();
    assert_eq!(s.wr_id(), 12);
    assert!(!s.is_success(), "{s:?}");
    eprintln!("oversize: receiver {}, sender {}", r.status(), s.status());
    // Moving a QP to ERR flushes its posted receives.
    let mut q = pair(&dev, QpType::Uc, None, &ctx);
    for i in 0..3 {
        // SAFETY: the QPs of a Pair are destroyed before its MRs (see `Pair`).
        unsafe { q.b.post_recv(100 + i, &q.bmr, 0, 64) }.unwrap();
    }
    q.b.modify_to_error().unwrap();
    assert_eq!(q.b.state().unwrap(), QpState::Err);
    for i in 0..3 {
        let wc = q.bcq.poll_one_blocking(T).unwrap();
        assert_eq!((wc.wr_id(), wc.status()), (100 + i, WcStatus::WR_FLUSH_ERR));
    }
    q.b.modify_to_reset().unwrap();
    assert_eq!(q.b.state().unwrap(), QpState::Reset);
    fill(&mut q.amr, 0, 1, 0);
}

#[test]
fn parents_outlive_children_whatever_the_drop_order() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let p = pair(&dev, QpType::Rc, None, &ctx);
    drop(ctx); // context, PD and CQs stay alive through the QP/MR references
    let Pair {
        a,
        b,
        amr,
        bmr,
        acq,
        bcq,
        pd,
        m: _,
    } = p;
    drop(pd);
    // SAFETY: `b` is dropped before `bmr` below.
    unsafe { b.post_recv(1, &bmr, 0, 64) }.unwrap();
    // SAFETY: `a` is dropped before `amr` below.
    unsafe { a.post_send(2, &amr, 0, 64, SendFlags::SIGNALED) }.unwrap();
    drop(acq.clone());
    assert!(acq.poll_one_blocking(T).unwrap().is_success());
    assert!(bcq.poll_one_blocking(T).unwrap().is_success());
    // Drop CQs before the QPs that use them (kept alive by the QPs), then
    // the Apple order: QPs first, then MRs.
    drop(acq);
    drop(bcq);
    drop(a);
    drop(b);
    drop(amr);
    drop(bmr);
}

#[test]
fn owned_qp_posts_safely_and_checks_the_pd() {
    let Some(dev) = device() else { return };
    let ctx = Context::open(&dev).unwrap();
    let Pair {
        a,
        b,
        amr,
        bmr,
        acq,
        bcq,
        pd,
        m: _,
    } = pair(&dev, QpType::Rc, None, &ctx);
    let acc = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let spare = || Mr::new(&pd, AlignedBuf::new(4096).unwrap(), acc).unwrap();
    // A region of another PD is refused (and handed back to nobody: dropped with the error).
    let pd2 = Pd::new(&ctx).unwrap();
    let foreign = Mr::new(&pd2, AlignedBuf::new(4096).unwrap(), acc).unwrap();
    let q = Qp::new(&pd, &QpInitAttr::new(QpType::Rc, &acq, &acq, 1, 1)).unwrap();
    let e = OwnedQp::new(q, spare(), foreign).unwrap_err();
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e}");
    let mut ea = OwnedQp::new(a, amr, spare()).unwrap();
    let eb = OwnedQp::new(b, spare(), bmr).unwrap();
    eb.post_recv(21, 0, 256).unwrap();
    ea.send_mem_mut()[..256].fill(0xa5);
    ea.post_send(22, 0, 256, SendFlags::SIGNALED).unwrap();
    let s = acq.poll_one_blocking(T).unwrap();
    assert_eq!((s.wr_id(), s.is_success()), (22, true), "{s:?}");
    let r = bcq.poll_one_blocking(T).unwrap();
    assert_eq!((r.wr_id(), r.byte_len()), (21, 256), "{r:?}");
    assert!(eb.recv_mr().as_slice()[..256].iter().all(|&x| x == 0xa5));
    // Bounds are still checked.
    assert!(matches!(
        eb.post_recv(23, BUF - 8, 16),
        Err(VerbsError::InvalidArgument(_))
    ));
    // Dropped with a receive outstanding: the QP goes first, then the regions.
    eb.post_recv(24, 0, 64).unwrap();
    drop(eb);
    drop(ea);
}
