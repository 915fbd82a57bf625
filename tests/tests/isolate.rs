//! Containment (the default: `front.rs`, `handoff/`, `child/`): each session computes in a
//! process of its own. The real binary is started here (a session process is the same executable), and its session
//! processes are found as the server's child processes (`pgrep -P`, `ps`: the same on Linux and
//! macOS; `/proc` only in the Linux-only tests): a session killed by a signal
//! (what a kernel bug past validation does) ends only its own connection; the server, another
//! session's data and new clients are untouched; the server-wide memory limit spans all session
//! processes, and what a killed one held is given back; 100 sessions killed in a row leave the
//! front's memory flat; the session processes' commands reach the front's counters.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_tests::*;

/// `target/release/rpc-server` (built by `cargo build --release`, which `scripts/test.sh` runs
/// before the tests; built here if missing).
fn ours_bin() -> PathBuf {
    release_server_bin(BuildServer::IfMissing)
}

/// The server process, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_env(extra, &[])
    }

    fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let mport = free_port();
        let log = std::env::temp_dir().join(format!("rpc-isolate-{port}.log"));
        let f = std::fs::File::create(&log).expect("log file");
        let child = Command::new(ours_bin())
            .args([
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                "1",
                "--isolate",
            ])
            .args(["--metrics", &format!("127.0.0.1:{mport}")])
            .args(extra)
            .env("RPC_LOG", "debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("start rpc-server --isolate");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_listening(addr);
        Server {
            child,
            addr,
            metrics: format!("127.0.0.1:{mport}").parse().unwrap(),
            log,
        }
    }

    /// The server's session processes (its children), oldest first.
    fn sessions(&self) -> Vec<u32> {
        children(self.child.id())
    }

    /// Waits until the server has `n` session processes; returns them.
    fn wait_sessions(&self, n: usize) -> Vec<u32> {
        let t = Instant::now();
        loop {
            let s = self.sessions();
            if s.len() == n {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "expected {n} session processes, have {s:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn rss_kib(&self) -> u64 {
        ps_field(self.child.id(), "rss")
            .and_then(|v| v.parse().ok())
            .expect("the server's RSS (ps -o rss=)")
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// One sample from `/metrics`, e.g. `rpc_memory_allocated_bytes` or
    /// `rpc_commands_total{command="ALLOC_BUFFER"}`.
    fn metric(&self, name: &str) -> u64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(self.metrics).expect("metrics");
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics")) as u64
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The child processes of `pid`, sorted (`pgrep -P`: procps on Linux, BSD on macOS; exit 1 when
/// there is none).
fn children(pid: u32) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-P", &pid.to_string()])
        .output()
        .expect("pgrep");
    let mut v: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// One column of `ps -o FIELD= -p PID` (BSD and procps ps both take it); `None` once the process
/// is gone.
fn ps_field(pid: u32, field: &str) -> Option<String> {
    let out = Command::new("ps")
        .args(["-o", &format!("{field}="), "-p", &pid.to_string()])
        .output()
        .expect("ps");
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn kill(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_computes_in_a_process_of_its_own() {
    let s = Server::start(&[]);
    let mut c = connect(s.addr).await;
    // The front answers HELLO and the device queries itself: no process yet.
    assert_eq!(c.device_count().await.unwrap(), 1);
    let (align, max) = (
        c.get_alignment(0).await.unwrap(),
        c.get_max_size(0).await.unwrap(),
    );
    assert!(align > 0 && max > 0);
    c.get_device_memory(0).await.unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        s.sessions(),
        Vec::<u32>::new(),
        "queries alone start no process"
    );
    // The first other command starts the session process, which serves it.
    let buf = alloc(&mut c, 3 * 64).await;
    let pids = s.wait_sessions(1);
    let cmdline = ps_field(pids[0], "command").unwrap_or_default();
    assert!(
        cmdline.contains("--session-child"),
        "the child is a session process: {cmdline:?}"
    );
    // Answers of the front and of the session process agree.
    assert_eq!(c.get_alignment(0).await.unwrap(), align);
    assert_eq!(c.get_max_size(0).await.unwrap(), max);
    let (a, b, sum) = add_graph(&buf, 16);
    let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
    c.set_tensor(&a, 0, &f32_bytes(&av), false).await.unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&av), false).await.unwrap();
    c.graph_compute(0, &[3], &[a, b, sum]).await.unwrap();
    let got = bytes_f32(&c.get_tensor(&sum, 0, 64).await.unwrap());
    let want: Vec<f32> = av.iter().map(|x| 2.0 * x).collect();
    assert_eq!(got, want);
    drop(c);
    s.wait_sessions(0);
    // The session's commands reached the front's counters (reported as the process ended).
    let t = Instant::now();
    while s.metric("rpc_commands_total{command=\"GRAPH_COMPUTE\"}") < 1 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no GRAPH_COMPUTE counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        s.metric("rpc_commands_total{command=\"SET_TENSOR\"}"),
        2,
        "SET_TENSORs counted by the front"
    );
    assert_eq!(s.metric("rpc_memory_allocated_bytes"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_harms_no_one_else() {
    let mut s = Server::start(&[]);
    // A bystander with a secret in its buffer.
    let mut by = connect(s.addr).await;
    let bbuf = alloc(&mut by, 4096).await;
    let secret = pattern(4096, 42);
    let t = bbuf.f32(1, &[1024], 0).build();
    by.set_tensor(&t, 0, &secret, false).await.unwrap();
    let bystander = s.wait_sessions(1)[0];
    // (A SIGSEGV sent with kill(2) does not end a Rust process: its handler for stack overflows
    // returns, and only a real fault re-raises. SIGABRT is what a ggml assertion ends in.)
    for sig in ["-ABRT", "-KILL", "-ILL"] {
        let mut victim = connect(s.addr).await;
        let _vb = alloc(&mut victim, 1 << 20).await;
        let pids = s.wait_sessions(2);
        let v = *pids.iter().find(|&&p| p != bystander).unwrap();
        kill(v, sig);
        expect_closed(&mut victim, "a session whose process was killed").await;
        s.wait_sessions(1);
        assert!(s.alive(), "the server died with a session ({sig})");
        // The bystander's data and session are intact.
        assert_eq!(by.get_tensor(&t, 0, 4096).await.unwrap(), secret, "{sig}");
        let mut fresh = connect(s.addr).await;
        assert_eq!(fresh.device_count().await.unwrap(), 1);
        drop(fresh);
        s.wait_sessions(1);
    }
    let log = s.log();
    assert!(log.contains("killed by SIGABRT"), "log: {log}");
    assert!(log.contains("killed by SIGKILL"), "log: {log}");
    assert_eq!(
        s.metric("rpc_memory_allocated_bytes"),
        4096,
        "only the bystander's buffer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_limit_spans_every_session_process() {
    let s = Server::start(&[
        "--max-alloc-total",
        "64M",
        "--max-alloc-per-connection",
        "56M",
    ]);
    let mut a = connect(s.addr).await;
    let _ab = alloc(&mut a, 48 << 20).await;
    // Over the per-connection limit: refused inside the session process, counted by the front.
    assert!(
        a.alloc_buffer(0, 16 << 20).await.unwrap().is_none(),
        "48 + 16 MiB over 56 MiB per connection"
    );
    let pa = s.wait_sessions(1)[0];
    let mut b = connect(s.addr).await;
    assert!(
        b.alloc_buffer(0, 32 << 20).await.unwrap().is_none(),
        "48 + 32 MiB over a 64 MiB total, in two processes"
    );
    s.wait_sessions(2);
    assert_eq!(s.metric("rpc_memory_allocated_bytes"), 48 << 20);
    // One refusal in a session process, one by the front's server-wide account: both counted.
    let t = Instant::now();
    while s.metric("rpc_memory_refused_allocations_total") < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "refusals counted: {}",
            s.metric("rpc_memory_refused_allocations_total")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(s.metric("rpc_memory_refused_allocations_total"), 2);
    // What a killed session held is given back.
    kill(pa, "-KILL");
    expect_closed(&mut a, "killed").await;
    s.wait_sessions(1);
    assert!(b.alloc_buffer(0, 32 << 20).await.unwrap().is_some());
    assert_eq!(s.metric("rpc_memory_allocated_bytes"), 32 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_killed_sessions_leave_the_front_flat() {
    let mut s = Server::start(&[]);
    async fn one(s: &Server) {
        let mut c = connect(s.addr).await;
        let _b = alloc(&mut c, 1 << 20).await;
        let pid = s.wait_sessions(1)[0];
        kill(pid, "-KILL");
        expect_closed(&mut c, "killed").await;
        s.wait_sessions(0);
    }
    for _ in 0..10 {
        one(&s).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = s.rss_kib();
    for _ in 0..100 {
        one(&s).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = s.rss_kib();
    assert!(s.alive());
    assert!(
        after <= before + 1024,
        "front RSS {before} KiB -> {after} KiB over 100 killed sessions"
    );
    assert_eq!(s.metric("rpc_memory_allocated_bytes"), 0);
    let mut c = connect(s.addr).await;
    assert_eq!(c.device_count().await.unwrap(), 1);
    eprintln!("front RSS over 100 killed sessions: {before} KiB -> {after} KiB");
}

/// A forbidden action from inside a session fails (Linux: seccomp, Landlock; macOS: the Seatbelt
/// profile of `sandbox_mac.rs`): the session process tries them right after its sandbox is up
/// (`RPC_SANDBOX_SELFTEST=1`), with a real client connected; the weight cache stays usable. The
/// server's `HOME` is a directory of the test's with a file in it, which the session must not
/// read. With `--no-sandbox` the same actions succeed (the control: the self-test can see a
/// difference).
#[cfg(any(target_os = "linux", target_os = "macos"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_process_cannot_leave_its_sandbox() {
    let cache = TempDir::new("isolate-cache");
    let dir = cache.path().to_str().unwrap().to_string();
    let home = TempDir::new("isolate-home");
    std::fs::write(home.path().join(".rpc-sandbox-probe"), b"secret").unwrap();
    let home = home.path().to_str().unwrap().to_string();
    let run = |extra: &'static [&'static str]| {
        let (dir, home) = (dir.clone(), home.clone());
        async move {
            let mut args = vec!["--cache-dir", dir.as_str()];
            args.extend_from_slice(extra);
            let s = Server::start_env(
                &args,
                &[("RPC_SANDBOX_SELFTEST", "1"), ("HOME", home.as_str())],
            );
            let mut c = connect(s.addr).await;
            alloc(&mut c, 4096).await; // starts the session process
            assert_eq!(c.device_count().await.unwrap(), 1, "the session serves");
            let t = Instant::now();
            while !s.log().contains("list the cache") {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "no self-test: {}",
                    s.log()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let mut fresh = connect(s.addr).await;
            assert_eq!(fresh.device_count().await.unwrap(), 1, "still serving");
            s.log()
        }
    };
    let log = run(&[]).await;
    let line = |what: &str| {
        log.lines()
            .find(|l| l.contains(&format!("sandbox self-test: {what}")))
            .unwrap_or_else(|| panic!("no self-test line for {what}: {log}"))
            .to_string()
    };
    for what in [
        "open a TCP connection",
        "listen on a port",
        "start /bin/true",
    ] {
        assert!(line(what).contains("denied"), "{}", line(what));
    }
    assert!(line("list the cache").contains("allowed"));
    assert!(line("write the cache").contains("denied"));
    if log.contains("landlock=\"not enforced") {
        eprintln!("skip: no Landlock in this kernel; file rules not checked");
    } else {
        let mut files = vec!["read a file in the home directory", "create a file in /tmp"];
        if cfg!(target_os = "linux") {
            files.push("open /etc/hostname");
        }
        for what in files {
            assert!(line(what).contains("denied"), "{}", line(what));
        }
    }
    let control = run(&["--no-sandbox"]).await;
    for what in [
        "read a file in the home directory",
        "start /bin/true",
        "listen on a port",
    ] {
        let l = control
            .lines()
            .find(|l| l.contains(&format!("sandbox self-test: {what}")))
            .unwrap_or_else(|| panic!("no control line for {what}: {control}"));
        assert!(l.contains("ALLOWED"), "without the sandbox: {l}");
    }
}

/// No session outlives its server: when the front process dies (SIGKILL, no `Q`), a session
/// process in the middle of a long compute ends within about a second instead of computing on
/// (a 4096 × 4096 × 16384 f32 MUL_MAT takes several seconds on one thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_soon_after_its_front_dies() {
    let mut s = Server::start(&[]);
    let mut c = connect(s.addr).await;
    let (k, m, n) = (16384u32, 4096u32, 4096u32);
    let (a_bytes, b_bytes) = (u64::from(k * m) * 4, u64::from(k * n) * 4);
    let buf = alloc(&mut c, a_bytes + b_bytes + u64::from(m * n) * 4).await;
    let a = buf.f32(1, &[k, m], 0).build();
    let b = buf.f32(2, &[k, n], a_bytes).build();
    let d = buf
        .f32(3, &[m, n], a_bytes + b_bytes)
        .op(rpc_client::ops::MUL_MAT, &[])
        .srcs(&[1, 2])
        .flags(rpc_client::TENSOR_FLAG_COMPUTE)
        .build();
    let session = s.wait_sessions(1)[0];
    // GRAPH_COMPUTE has no reply: the GET_TENSOR after it waits for the compute.
    let compute = tokio::spawn(async move {
        c.graph_compute(0, &[3], &[a, b, d]).await?;
        c.get_tensor(&d, 0, 4).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    if compute.is_finished() {
        panic!("the compute ended at once: {:?}", compute.await.unwrap());
    }
    kill(s.child.id(), "-KILL");
    let _ = s.child.wait();
    let t = Instant::now();
    let gone = |pid: u32| match ps_field(pid, "stat") {
        Some(st) => st.starts_with('Z'),
        None => true,
    };
    while !gone(session) {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "session process {session} still running {:?} after its front died",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("session process ended {:?} after its front", t.elapsed());
    assert!(
        compute.await.unwrap().is_err(),
        "the client sees its connection end"
    );
}

/// 8.0's collectives between two contained servers: a session process may open no socket, so
/// its front sets up the server-to-server link and passes the socket down (`SCM_RIGHTS`); the
/// partials are then summed over it, session process to session process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contained_sessions_join_a_pairwise_link() {
    // Random ports: rank 1 may dial any.
    let (s0, s1) = (
        Server::start(&[]),
        Server::start(&["--comm-peer-ports", "1-64535"]),
    );
    let (mut c0, mut c1) = (connect(s0.addr).await, connect(s1.addr).await);
    // A buffer first: the session processes exist (and are sandboxed) before COMM_INIT.
    let (b0, b1) = (alloc(&mut c0, 64).await, alloc(&mut c1, 64).await);
    let (ok0, ok1) = join_pair(&mut c0, &mut c1, s0.addr.port()).await;
    assert!(ok0 && ok1, "both contained ranks joined");
    let (t0, t1) = (b0.f32(1, &[16], 0).build(), b1.f32(1, &[16], 0).build());
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..16).map(|i| 100.0 * i as f32).collect();
    c0.set_tensor(&t0, 0, &f32_bytes(&x), false).await.unwrap();
    c1.set_tensor(&t1, 0, &f32_bytes(&y), false).await.unwrap();
    c0.comm_allreduce(0, &t0).await.unwrap();
    c1.comm_allreduce(0, &t1).await.unwrap();
    let want: Vec<f32> = (0..16).map(|i| 101.0 * i as f32).collect();
    assert_eq!(bytes_f32(&c0.get_tensor(&t0, 0, 64).await.unwrap()), want);
    assert_eq!(bytes_f32(&c1.get_tensor(&t1, 0, 64).await.unwrap()), want);
    assert_eq!(
        s0.sessions().len(),
        1,
        "rank 0 served by its session process"
    );
}

/// Only the front writes the weight cache: an upload with the cache flag through a contained
/// session (one small SET_TENSOR, served in the session, and one large, streamed) becomes an
/// entry named by the hash of its bytes, written by the front from the session's staging file,
/// with no temp file left behind, and the next client's SET_TENSOR_HASH finds it. Without the
/// sandbox too (the same path: the session never writes the directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_reach_the_cache_through_the_front() {
    for extra in [&[][..], &["--no-sandbox"][..]] {
        let cache = TempDir::new("isolate-store");
        let dir = cache.path().to_str().unwrap().to_string();
        let mut args = vec!["--cache-dir", dir.as_str()];
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        let mut c = connect(s.addr).await;
        let buf = alloc(&mut c, 1 << 20).await;
        let small = pattern(4096, 7);
        let large = pattern(256 << 10, 8);
        let ts = buf.f32(1, &[1024], 0).build();
        let tl = buf.f32(1, &[64 << 10], 0).build();
        c.set_tensor(&ts, 0, &small, true).await.unwrap();
        c.set_tensor(&tl, 0, &large, true).await.unwrap();
        let entry = |b: &[u8]| cache.path().join(format!("{:016x}", rpc_proto::fnv1a64(b)));
        let t = Instant::now();
        while !(entry(&small).is_file() && entry(&large).is_file()) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no cache entries ({extra:?}): {}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(std::fs::read(entry(&large)).unwrap(), large);
        assert_eq!(std::fs::read(entry(&small)).unwrap(), small);
        let mut next = connect(s.addr).await;
        let nb = alloc(&mut next, 1 << 20).await;
        let nt = nb.f32(1, &[64 << 10], 0).build();
        assert!(next
            .set_tensor_hash(&nt, 0, rpc_proto::fnv1a64(&large))
            .await
            .unwrap());
        assert_eq!(
            next.get_tensor(&nt, 0, large.len() as u64).await.unwrap(),
            large
        );
        let leftovers: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
        assert!(
            s.metric("rpc_memory_allocated_bytes") <= 2 << 20,
            "staging given back"
        );
    }
}

/// A `--gguf` file, or the `--gguf` index in a private cache directory, that a contained session
/// (a uid of its own, as root) could not read would be skipped by every session without a word:
/// the front's probe session tries them at start, and the server refuses to start, naming the
/// path and the fix. (Not as root, sessions share the server's uid: nothing to refuse.)
#[cfg(target_os = "linux")]
#[test]
fn unreadable_gguf_weights_are_refused_at_start() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = TempDir::new("isolate-gguf-private");
    if std::fs::metadata(dir.path()).unwrap().uid() != 0 {
        eprintln!("skip: sessions share a non-root server's uid");
        return;
    }
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"not even a GGUF: its readability is what counts").unwrap();
    let cache = TempDir::new("isolate-gguf-cache");
    let refused = |args: &[&str]| {
        let out = Command::new(ours_bin())
            .args(["-H", "127.0.0.1", "-p", &free_port().to_string(), "-t", "1"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run rpc-server");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let m = model.to_str().unwrap();
    let c = cache.path().to_str().unwrap();
    // The file itself private (mode 0600, root's).
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, err) = refused(&["--gguf", m]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("session processes cannot read --gguf") && err.contains("chmod o+r"),
        "{err}"
    );
    // Readable file, its index in a private (0700) cache directory.
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let (code, err) = refused(&["-c", "--cache-dir", c, "--gguf", m]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("cannot read the --gguf index") && err.contains("chmod o+x"),
        "{err}"
    );
    // Both readable: the server starts (and is stopped here once its banner is out).
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(ours_bin())
        .args(["-H", "127.0.0.1", "-p", &free_port().to_string(), "-t", "1"])
        .args(["-c", "--cache-dir", c, "--gguf", m])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run rpc-server");
    let mut banner = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let t = Instant::now();
    while !banner.contains("containment") && t.elapsed() < Duration::from_secs(30) {
        if std::io::BufRead::read_line(&mut out, &mut banner).unwrap_or(0) == 0 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(banner.contains("containment"), "started: {banner}");
}

/// A private cache directory (mode 0700, as `mktemp -d` makes it, or a cache under a private
/// home): a contained session runs as a uid of its own (as root, `namespaces::session_uid`),
/// which cannot search it, so the front opens each entry the session looks up and passes it
/// down (`O` on the control line). A first client's upload over 10 MiB (SET_TENSOR_HASH not
/// found, then SET_TENSOR with the cache flag, as the stock client does) becomes an entry, and
/// a second client's SET_TENSOR_HASH is a hit whose bytes GET_TENSOR returns; with sessions
/// started for their client and pooled ones. (Not as root, the session's uid is the server's
/// own, which reads the directory anyway: the same path runs.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_cache_directory_serves_contained_sessions() {
    use std::os::unix::fs::PermissionsExt;
    // Sessions started for their client, and pooled ones (contained before any client).
    for extra in [&[][..], &["--session-pool", "1"][..]] {
        let cache = TempDir::new("isolate-private");
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = cache.path().to_str().unwrap().to_string();
        let mut args = vec!["-c", "--cache-dir", dir.as_str()];
        args.extend_from_slice(extra);
        let s = Server::start(&args);
        let len = (10 << 20) + (64 << 10); // over the stock client's hashing threshold
        let data = pattern(len, 21);
        let hash = rpc_proto::fnv1a64(&data);
        let mut c = connect(s.addr).await;
        let buf = alloc(&mut c, len as u64).await;
        let t = buf.f32(1, &[(len / 4) as u32], 0).build();
        assert!(
            !c.set_tensor_hash(&t, 0, hash).await.unwrap(),
            "not cached yet"
        );
        c.set_tensor(&t, 0, &data, true).await.unwrap();
        assert_eq!(c.get_tensor(&t, 0, 16).await.unwrap(), data[..16].to_vec());
        let entry = cache.path().join(format!("{hash:016x}"));
        let t0 = Instant::now();
        while !entry.is_file() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no cache entry: {}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut next = connect(s.addr).await;
        let nb = alloc(&mut next, len as u64).await;
        let nt = nb.f32(1, &[(len / 4) as u32], 0).build();
        assert!(
            next.set_tensor_hash(&nt, 0, hash).await.unwrap(),
            "a hit from the private directory ({extra:?}): {}",
            s.log()
        );
        assert_eq!(next.get_tensor(&nt, 0, len as u64).await.unwrap(), data);
        let mode = std::fs::metadata(cache.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "the directory stays private");
        drop(next);
        drop(c);
        let t0 = Instant::now();
        while s.metric("rpc_cache_hits_total") < 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the hit is not counted: {}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !s.log().contains("cannot open cache directory"),
            "{}",
            s.log()
        );
    }
}

/// `--trusted-weights-only`: an upload is never stored, and an entry written after the start
/// is not served; an entry seeded before the start is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_weights_only_serves_only_seeded_entries() {
    let cache = TempDir::new("isolate-trusted");
    let seeded = pattern(128 << 10, 11);
    let hs = rpc_proto::fnv1a64(&seeded);
    std::fs::write(cache.path().join(format!("{hs:016x}")), &seeded).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let dir = cache.path().to_str().unwrap().to_string();
    let s = Server::start(&["--cache-dir", dir.as_str(), "--trusted-weights-only"]);
    let late = pattern(128 << 10, 12);
    let hl = rpc_proto::fnv1a64(&late);
    std::fs::write(cache.path().join(format!("{hl:016x}")), &late).unwrap();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 1 << 20).await;
    let t = buf.f32(1, &[32 << 10], 0).build();
    assert!(c.set_tensor_hash(&t, 0, hs).await.unwrap(), "seeded");
    assert_eq!(
        c.get_tensor(&t, 0, seeded.len() as u64).await.unwrap(),
        seeded
    );
    assert!(
        !c.set_tensor_hash(&t, 0, hl).await.unwrap(),
        "written after the start"
    );
    let up = pattern(128 << 10, 13);
    c.set_tensor(&t, 0, &up, true).await.unwrap();
    assert_eq!(c.get_tensor(&t, 0, 16).await.unwrap(), up[..16].to_vec());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !cache
            .path()
            .join(format!("{:016x}", rpc_proto::fnv1a64(&up)))
            .exists(),
        "no upload stored"
    );
}

/// A session's stderr is a pipe the front reads: the session's own log lines come out of the
/// front, tagged with the session's peer and pid (`RPC_SANDBOX_SELFTEST=1` makes a session log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_log_line_comes_out_of_the_front_tagged() {
    let s = Server::start_env(&["--no-sandbox"], &[("RPC_SANDBOX_SELFTEST", "1")]);
    let mut c = connect(s.addr).await;
    alloc(&mut c, 4096).await;
    let pid = s.wait_sessions(1)[0];
    let t = Instant::now();
    let tagged = |log: &str| {
        log.lines()
            .find(|l| {
                l.contains("sandbox self-test: start /bin/true")
                    && l.contains(&format!("session.pid={pid}"))
                    && l.contains("session.peer=127.0.0.1:")
            })
            .map(str::to_string)
    };
    while tagged(&s.log()).is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no tagged session line: {}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The session's escape sequences never reach the front's output.
    assert!(!s.log().contains('\u{1b}'));
}

/// `/proc/<pid>/status` field `key` (e.g. `Uid`), its first value.
#[cfg(target_os = "linux")]
fn status_field(pid: u32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// Seen from outside, the process that serves a contained session (the inner stage, the child of
/// the process the front started: `namespaces.rs`) has namespaces of its own (PID, network,
/// mount, IPC, UTS), an identity that owns nothing (as root: a dedicated uid and gid, no
/// groups; otherwise a user namespace), no capabilities, no new privileges, a seccomp filter,
/// and a root holding only the system's libraries, `/proc`, `/sys` and a few `/dev` nodes.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_process_owns_nothing_and_sees_only_its_own_view() {
    let s = Server::start(&[]);
    let mut c = connect(s.addr).await;
    alloc(&mut c, 4096).await;
    let outer = s.wait_sessions(1)[0];
    assert_contained(&s, outer);
    drop(c);
    s.wait_sessions(0);
}

/// The same with `--session-pool 1`: the process started ahead, before any client, is the one
/// that serves the first client, contained exactly as a fresh one; so is its replacement while
/// it waits.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_session_process_owns_nothing_and_sees_only_its_own_view() {
    let s = Server::start(&["--session-pool", "1"]);
    let pooled = s.wait_sessions(1)[0];
    let cmdline = ps_field(pooled, "command").unwrap_or_default();
    assert!(
        cmdline.contains("--session-wait"),
        "started ahead, waiting: {cmdline:?}"
    );
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[4], 0).build();
    c.set_tensor(&t, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false)
        .await
        .unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&t, 0, 16).await.unwrap()),
        [1.0, 2.0, 3.0, 4.0]
    );
    let now = s.wait_sessions(2);
    assert!(now.contains(&pooled), "the pooled process serves: {now:?}");
    assert_contained(&s, pooled);
    let replacement = *now.iter().find(|&&p| p != pooled).unwrap();
    assert_contained(&s, replacement);
    drop(c);
    // The connection's end is its process's; the replacement waits on.
    let t = Instant::now();
    while s.sessions() != [replacement] {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{:?}: the served process ends, the replacement stays",
            s.sessions()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process that serves a contained session: the inner stage, the child of `outer`, once its
/// containment is in place (a pooled process may still be setting it up).
#[cfg(target_os = "linux")]
fn inner_of(outer: u32) -> u32 {
    let t = Instant::now();
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{outer}/task/{outer}/children"))
            .unwrap_or_default();
        if let Some(p) = kids.split_whitespace().next() {
            let p = p.parse::<u32>().unwrap();
            if status_field(p, "Seccomp") == "2" {
                return p;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no contained inner process"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The checks of [`a_session_process_owns_nothing_and_sees_only_its_own_view`] on the session
/// process `outer` of server `s`.
#[cfg(target_os = "linux")]
fn assert_contained(s: &Server, outer: u32) {
    let inner = inner_of(outer);
    let front = s.child.id();
    for ns in ["pid", "net", "mnt", "ipc", "uts"] {
        let of = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/{ns}")).unwrap();
        assert_ne!(of(inner), of(front), "{ns} namespace shared with the front");
    }
    let uid: u32 = status_field(inner, "Uid").parse().unwrap();
    if status_field(front, "Uid") == "0" {
        assert!(uid >= 0x7F00_0000, "a dedicated uid, not {uid}");
        assert_eq!(status_field(inner, "Gid"), uid.to_string());
        assert_eq!(status_field(inner, "Groups"), "", "no supplementary groups");
    }
    assert_eq!(status_field(inner, "CapEff"), "0000000000000000");
    assert_eq!(status_field(inner, "CapPrm"), "0000000000000000");
    assert_eq!(status_field(inner, "CapBnd"), "0000000000000000");
    assert_eq!(status_field(inner, "NoNewPrivs"), "1");
    assert_eq!(status_field(inner, "Seccomp"), "2");
    // Its root: what it may read, nothing else (no home, no /tmp content, one /etc file).
    let root = PathBuf::from(format!("/proc/{inner}/root"));
    let names = |d: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(root.join(d))
            .unwrap_or_else(|e| panic!("{d}: {e}"))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let top = names("");
    // The server's working directory is kept (relative --gguf paths are named from it): an
    // empty directory, holding nothing of what is there outside.
    let cwd = std::env::current_dir().unwrap();
    let cwd_rel = cwd.strip_prefix("/").unwrap().to_path_buf();
    let cwd_top = cwd_rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    assert_eq!(
        std::fs::read_dir(root.join(&cwd_rel))
            .map(|d| d.count())
            .ok(),
        Some(0),
        "the working directory in the view is empty"
    );
    for absent in ["home", "root", "tmp", "var", "run", "boot", "work"] {
        if cwd_top.as_deref() == Some(absent) {
            continue;
        }
        assert!(
            !top.contains(&absent.to_string()),
            "/{absent} in the view: {top:?}"
        );
    }
    assert!(top.contains(&"usr".to_string()) && top.contains(&"proc".to_string()));
    assert!(names("etc")
        .iter()
        .all(|n| n == "ld.so.cache" || n == "libibverbs.d"));
    assert!(
        names("dev").iter().all(
            |n| ["null", "zero", "full", "random", "urandom", "infiniband"].contains(&n.as_str())
        ),
        "{:?}",
        names("dev")
    );
    // Its /proc shows its own PID namespace: itself, as process 1.
    let pids: Vec<String> = names("proc")
        .into_iter()
        .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        .collect();
    assert_eq!(pids, vec!["1".to_string()]);
    // The root is read-only.
    let w = std::fs::write(root.join("planted"), b"x");
    assert!(w.is_err(), "the session's root is writable");
}

/// A pooled session process ends with its front: killed outright (SIGKILL, no shutdown), the
/// front takes the waiting processes with it (their control lines close, their parent-death
/// signal fires); none is left running, outer or inner.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_session_processes_end_with_their_front() {
    let mut s = Server::start(&["--session-pool", "2"]);
    let outers = s.wait_sessions(2);
    let all: Vec<u32> = outers.iter().flat_map(|&o| [o, inner_of(o)]).collect();
    kill(s.child.id(), "-KILL");
    let _ = s.child.wait();
    let gone = |p: u32| ps_field(p, "stat").is_none_or(|st| st.starts_with('Z'));
    let t = Instant::now();
    while !all.iter().all(|&p| gone(p)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "pooled processes outlived their front: {:?}",
            all.iter().filter(|&&p| !gone(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With a pool, one client after another (on either protocol's port, back to back: more than
/// the pool holds) is served, each by a process of its own, and the pool is back to its size
/// after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_serves_clients_in_a_row_on_both_ports() {
    let p7 = free_port();
    let s = Server::start(&["--session-pool", "1", "--proto7-port", &p7.to_string()]);
    s.wait_sessions(1);
    let a7: SocketAddr = format!("127.0.0.1:{p7}").parse().unwrap();
    for (i, addr) in [s.addr, a7, s.addr, a7].into_iter().enumerate() {
        let mut c = connect(addr).await;
        let buf = alloc(&mut c, 4096).await;
        let (a, b, sum) = add_graph(&buf, 4);
        let v: Vec<f32> = (0..4).map(|x| (x + i) as f32).collect();
        c.set_tensor(&a, 0, &f32_bytes(&v), false).await.unwrap();
        c.set_tensor(&b, 0, &f32_bytes(&v), false).await.unwrap();
        c.graph_compute(0, &[3], &[a, b, sum]).await.unwrap();
        let got = bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap());
        assert_eq!(
            got,
            v.iter().map(|x| 2.0 * x).collect::<Vec<_>>(),
            "client {i}"
        );
    }
    s.wait_sessions(1);
    assert!(
        !s.log()
            .contains("pooled session process ended while waiting"),
        "{}",
        s.log()
    );
}

/// `-m/--mem` (the stock flag): the memory every device reports, in MiB, to GET_DEVICE_MEMORY
/// whether the front or the session process answers; it also bounds the default total limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mem_is_what_get_device_memory_reports() {
    let s = Server::start(&["-m", "100"]);
    let mut c = connect(s.addr).await;
    let m = c.get_device_memory(0).await.unwrap();
    assert_eq!(
        (m.free, m.total),
        (100 << 20, 100 << 20),
        "the front's answer"
    );
    alloc(&mut c, 4096).await;
    s.wait_sessions(1);
    let m = c.get_device_memory(0).await.unwrap();
    assert_eq!(
        (m.free, m.total),
        (100 << 20, 100 << 20),
        "the session's answer"
    );
    assert!(
        s.log().contains("MiB per connection, 100 MiB in total"),
        "{}",
        s.log()
    );
    // Over the total it bounds: refused, the connection lives.
    assert!(
        c.alloc_buffer(0, 200 << 20).await.unwrap().is_none(),
        "an allocation over -m's bound fails"
    );
}
