//! The session process's sandbox on macOS (part of containment, the default): a Seatbelt profile
//! applied with `sandbox_init` once the transport is up, before the first command is read (the
//! counterpart of `sandbox.rs` on Linux; `--no-sandbox` leaves it out).
//!
//! The profile starts from `(deny default)` and allows only what a session needs; each allowance
//! carries a comment in the profile text saying why it is there and where it comes from:
//!
//! - itself: signals to itself (a ggml assertion aborts), information about itself, `stat` of
//!   any path (realpath), reading its own executable (backtraces);
//! - reading (and mapping as code) the system libraries and frameworks, the GPU driver bundles
//!   (`/System/Library/Extensions`), the dyld shared cache and the OS cryptexes, the OS version
//!   files, `/dev/null` and the random devices;
//! - sysctl reads of hardware (`hw.*`, `machdep.cpu.*`: ggml's CPU feature and core-count
//!   probes, Metal), the OS version names and its own `kern.proc.pid.<pid>`;
//! - Metal compute: opening the GPU's IOKit user clients (`IOAccelerator` family: AGX on Apple
//!   silicon; IOSurface), reading IOKit properties, looking up `com.apple.MTLCompilerService`
//!   (pipelines are compiled lazily, after the profile applies), logging, user and group look-up,
//!   the notification page, and READING this program's Metal shader cache
//!   (`<DARWIN_USER_CACHE_DIR>/<program>`);
//! - Apple's RDMA over Thunderbolt: opening the `AppleThunderboltRDMA` user clients (the queue
//!   pair itself is set up before the profile applies);
//! - the weight cache, READ-ONLY (only the front writes it), and the `--gguf` files, read-only.
//!
//! No file can be written anywhere: not the weight cache, not the temporary directories, not even
//! Metal's shader cache. A shader cache that sessions could write would let one session plant
//! compiled GPU code that the next session (another client) loads; Metal works with its cache
//! denied (Chromium's `DISABLE_METAL_SHADER_CACHE`, crbug.com/1159113), at the cost of compiling
//! each pipeline once per session. No process starts, no socket is created, bound or connected
//! (`(deny network*)`, `system-socket`): the client's socket, the control line to the front and
//! the peer links are connected stream sockets the process already holds, and XNU asks the
//! sandbox about a send only when it names an address or the socket is unconnected, and about a
//! receive only on datagram sockets (`bsd/kern/uipc_syscalls.c` `sendit`,
//! `bsd/kern/uipc_socket.c` `soreceive`), so they need no allowance.
//!
//! Sources (learnt from, not copied): Chromium's deny-default Seatbelt policies
//! `sandbox/policy/mac/common.sb`, `gpu.sb` and `on_device_model_execution.sb` (a Metal ML
//! inference process: the closest match to a session); XNU's socket MAC checks; ggml's `sysctl`
//! probes (`ggml-cpu.cpp`, `ggml-feats.h`, `kleidiai.cpp`); public `ioreg` listings for the AGX
//! and Thunderbolt-RDMA class names; `docs/worker-mac.md` lists them with what to verify.
//!
//! Paths are resolved before they go into the profile (Seatbelt matches the resolved path, and
//! `/var`, `/tmp`, `/etc` are symlinks into `/private`): canonicalized where they exist, else the
//! longest existing prefix is ([`resolve`]); then quoted as Scheme strings. Every path rule is an
//! allowance, so a path that cannot be resolved or written (not UTF-8) fails closed: the rule is
//! left out and the access is denied.
//!
//! Checked only on paper: the profile text is built and unit-tested on every OS (here, Linux);
//! applying it and the forbidden-action test (`tests/tests/isolate.rs`, `RPC_SANDBOX_SELFTEST=1`)
//! run only where the tests run on a Mac, which this project's machine is not.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// What the profile is built from; paths as the process knows them ([`profile`] resolves them).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The weight cache (`-c`): read-only.
    pub cache_dir: Option<PathBuf>,
    /// The `--gguf` files: read-only.
    pub gguf: Vec<PathBuf>,
    /// This user's Darwin cache directory (`confstr(_CS_DARWIN_USER_CACHE_DIR)`).
    pub darwin_cache_dir: Option<PathBuf>,
    /// This executable (`std::env::current_exe`).
    pub exe: Option<PathBuf>,
    /// This process's id (its own `kern.proc.pid.<pid>` sysctl).
    pub pid: u32,
}

/// `p` made absolute with every symlink resolved: `canonicalize` where it exists; otherwise the
/// longest existing prefix is canonicalized and the rest appended as given (a tail holding `..`
/// is returned unresolved, which only makes its allowance match nothing).
pub fn resolve(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut head = abs.as_path();
    let mut tail: Vec<&OsStr> = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(head) {
            let mut out = real;
            for c in tail.iter().rev() {
                out.push(c);
            }
            return out;
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name);
                head = parent;
            }
            _ => return abs,
        }
    }
}

/// `s` as a Seatbelt (Scheme) string literal: quotes and backslashes escaped.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
}

/// `p` resolved and quoted; `None` (the rule is left out: denied) when it is not UTF-8.
fn path_literal(p: &Path) -> Option<String> {
    resolve(p).to_str().map(quoted)
}

/// Where Metal keeps this program's shader cache: `<DARWIN_USER_CACHE_DIR>/<program>` (Metal
/// names the directory after the bundle identifier, the program's name for a bare executable:
/// `.../C/<id>/com.apple.metal/...`; Chromium's `maybe-allow-metal-shader-cache-access` uses
/// the same per-program directory).
pub fn metal_cache_dir(darwin_cache_dir: &Path, exe: &Path) -> Option<PathBuf> {
    Some(resolve(darwin_cache_dir).join(exe.file_name()?))
}

/// One profile entry: its reasons as `;` comment lines, then the rule.
fn rule(p: &mut String, why: &str, text: &str) {
    for line in why.lines() {
        p.push_str("; ");
        p.push_str(line.trim());
        p.push('\n');
    }
    p.push_str(text);
    p.push_str("\n\n");
}

/// The profile text (SBPL): `(deny default)`, then the allowances a session needs, each with
/// its reason, then the explicit denials.
pub fn profile(i: &Inputs) -> String {
    let mut p = String::from(
        "(version 1)\n(deny default)\n\n\
         ; rpc-server session process (rpc-contain/src/sandbox_mac.rs). Everything not allowed\n\
         ; below is denied. Sources: Chromium sandbox/policy/mac/{common,gpu,\n\
         ; on_device_model_execution}.sb; XNU socket MAC checks; ggml's sysctl probes.\n\n",
    );

    // --- The process itself.
    rule(
        &mut p,
        "A ggml assertion aborts the process (rpc-ggml's abort.rs): SIGABRT to itself.\n\
         Chromium common.sb (crbug.com/20370).",
        "(allow signal (target self))",
    );
    rule(
        &mut p,
        "Information about itself only (thread names, its own pid info: Rust std, Metal).\n\
         Chromium common.sb allows process-info-pidinfo on self.",
        "(allow process-info* (target self))",
    );
    rule(
        &mut p,
        "stat/realpath of any path (file names and sizes, never contents or listings).\n\
         Chromium common.sb (\"Allow realpath() to work\").",
        "(allow file-read-metadata (subpath \"/\"))",
    );
    if let Some(exe) = i.exe.as_deref().and_then(path_literal) {
        rule(
            &mut p,
            "Its own executable: symbolizing a backtrace reads it. Chromium common.sb.",
            &format!("(allow file-read* (literal {exe}))"),
        );
    }

    // --- System libraries and frameworks.
    rule(
        &mut p,
        "System libraries and frameworks, the GPU driver bundles (/System/Library/Extensions:\n\
         AGXMetal*.bundle, loaded by Metal), the dyld shared cache (its cryptex on macOS 13+,\n\
         /System/Library/dyld before) and the OS cryptexes, read and mapped as code: Metal\n\
         and the RDMA provider load code lazily.\n\
         Chromium common.sb (frameworks, /usr/lib, cryptexes) and gpu.sb (Extensions, crbug.com/515280).",
        "(allow file-read* file-map-executable\n  \
         (subpath \"/usr/lib\")\n  \
         (subpath \"/System/Library/Frameworks\")\n  \
         (subpath \"/System/Library/PrivateFrameworks\")\n  \
         (subpath \"/System/Library/Extensions\")\n  \
         (subpath \"/System/Library/dyld\")\n  \
         (subpath \"/System/Cryptexes/OS\")\n  \
         (subpath \"/System/Volumes/Preboot/Cryptexes/OS\")\n  \
         (subpath \"/private/var/db/dyld\"))",
    );
    rule(
        &mut p,
        "The OS version (Foundation, Metal feature checks). Chromium common.sb.",
        "(allow file-read-data\n  \
         (literal \"/System/Library/CoreServices/SystemVersion.plist\")\n  \
         (literal \"/System/Library/CoreServices/SystemVersionCompat.plist\"))",
    );
    rule(
        &mut p,
        "/dev/null and the random devices, read only. Chromium common.sb.",
        "(allow file-read-data\n  \
         (literal \"/dev/null\")\n  \
         (literal \"/dev/random\")\n  \
         (literal \"/dev/urandom\"))",
    );

    // --- sysctl.
    rule(
        &mut p,
        "Hardware facts: ggml's CPU backend probes hw.optional.arm.FEAT_*, hw.nperflevels,\n\
         hw.perflevel*, machdep.cpu.brand_string (ggml-feats.h, ggml-cpu.cpp, kleidiai.cpp);\n\
         core counts and memory size (hw.ncpu, hw.memsize: ggml, Metal, Rust std). The OS\n\
         version names and its own kern.proc.pid entry. Nothing about other processes.\n\
         Chromium common.sb and on_device_model_execution.sb (named hw.*/kern.* entries).",
        &format!(
            "(allow sysctl-read\n  \
             (sysctl-name-prefix \"hw.\")\n  \
             (sysctl-name-prefix \"machdep.cpu.\")\n  \
             (sysctl-name \"kern.ostype\")\n  \
             (sysctl-name \"kern.osrelease\")\n  \
             (sysctl-name \"kern.osversion\")\n  \
             (sysctl-name \"kern.osproductversion\")\n  \
             (sysctl-name \"kern.osvariant_status\")\n  \
             (sysctl-name \"kern.version\")\n  \
             (sysctl-name \"kern.secure_kernel\")\n  \
             (sysctl-name \"kern.usrstack64\")\n  \
             (sysctl-name \"kern.maxfilesperproc\")\n  \
             (sysctl-name \"sysctl.proc_cputype\")\n  \
             (sysctl-name \"kern.proc.pid.{}\"))",
            i.pid
        ),
    );

    // --- Metal compute.
    rule(
        &mut p,
        "Metal: the GPU's IOKit user clients. On Apple silicon the GPU (AGXAccelerator) is an\n\
         IOAccelerator and each Metal process holds an AGXDeviceUserClient (as ioreg lists it);\n\
         IOSurface backs shared buffers. The device is opened before the profile applies; this\n\
         covers clients Metal opens later (queues, residency sets).\n\
         Chromium gpu.sb and on_device_model_execution.sb (iokit-connection IOAccelerator,\n\
         IOAccelerationUserClient, IOSurfaceRootUserClient; crbug.com/75343).",
        "(allow iokit-open\n  \
         (iokit-connection \"IOAccelerator\")\n  \
         (iokit-user-client-class \"AGXDeviceUserClient\")\n  \
         (iokit-user-client-class \"AGXSharedUserClient\")\n  \
         (iokit-user-client-class \"IOAccelerationUserClient\")\n  \
         (iokit-user-client-class \"IOSurfaceRootUserClient\"))",
    );
    rule(
        &mut p,
        "Metal and the RDMA provider read IOKit registry properties of their devices\n\
         (read-only inspection; nothing is set).",
        "(allow iokit-get-properties)",
    );
    rule(
        &mut p,
        "Metal's compiler service: ggml compiles each compute pipeline the first time an op\n\
         runs, after the profile applies. Chromium gpu.sb, on_device_model_execution.sb\n\
         (crbug.com/957217).",
        "(allow mach-lookup (xpc-service-name \"com.apple.MTLCompilerService\"))",
    );
    rule(
        &mut p,
        "Logging from Apple's frameworks (os_log, asl), user and group look-up (getpwuid from\n\
         Foundation). Chromium common.sb (crbug.com/792229, crbug.com/792228).",
        "(allow mach-lookup\n  \
         (global-name \"com.apple.logd\")\n  \
         (global-name \"com.apple.system.logger\")\n  \
         (global-name \"com.apple.system.opendirectoryd.libinfo\"))",
    );
    rule(
        &mut p,
        "notify(3)'s shared page, read only. Chromium on_device_model_execution.sb, gpu.sb.",
        "(allow ipc-posix-shm-read-data (ipc-posix-name \"apple.shm.notification_center\"))",
    );
    if let Some(dir) = i
        .darwin_cache_dir
        .as_deref()
        .zip(i.exe.as_deref())
        .and_then(|(c, e)| metal_cache_dir(c, e))
        .and_then(|d| d.to_str().map(quoted))
    {
        rule(
            &mut p,
            "This program's Metal shader cache (<DARWIN_USER_CACHE_DIR>/<program>/com.apple.metal),\n\
             READ ONLY, and read-only sandbox extensions for it (Metal hands them to its compiler\n\
             service). Not writable: a session could otherwise plant compiled GPU code for the\n\
             next session; Metal works with its cache denied (Chromium DISABLE_METAL_SHADER_CACHE,\n\
             crbug.com/1159113). Chromium common.sb maybe-allow-metal-shader-cache-access, gpu.sb.",
            &format!(
                "(allow file-read* (subpath {dir}))\n\
                 (allow file-issue-extension\n  \
                 (require-all\n    \
                 (extension-class \"com.apple.app-sandbox.read\")\n    \
                 (subpath {dir})))"
            ),
        );
    }

    // --- RDMA over Thunderbolt.
    rule(
        &mut p,
        "Apple's RDMA over Thunderbolt (librdma -> libthunderboltrdma, rdma-transports.md 5.1):\n\
         the verbs device and queue pair are opened before the profile applies and posting and\n\
         polling make no system call; this covers the provider's device clients for what\n\
         follows (teardown, a lazy open). Class names as public ioreg listings and panic\n\
         reports show them (AppleThunderboltRDMA, AppleThunderboltRDMAInterface = rdma_enN).",
        "(allow iokit-open\n  \
         (iokit-connection \"AppleThunderboltRDMA\")\n  \
         (iokit-connection \"AppleThunderboltRDMAInterface\"))",
    );

    // --- The weights.
    if let Some(c) = i.cache_dir.as_deref().and_then(path_literal) {
        rule(
            &mut p,
            "The weight cache, READ ONLY: cached tensors and the gguf index are read by the\n\
             session; only the front process writes the cache.",
            &format!("(allow file-read* (subpath {c}))"),
        );
    }
    let gguf: Vec<String> = i.gguf.iter().filter_map(|g| path_literal(g)).collect();
    if !gguf.is_empty() {
        let lits: String = gguf.iter().map(|g| format!("\n  (literal {g})")).collect();
        rule(
            &mut p,
            "The --gguf files, read only (opened before the profile applies; this covers a\n\
             reopen).",
            &format!("(allow file-read*{lits})"),
        );
    }

    // --- Explicit denials, last so that nothing above reopens them (later rules win).
    rule(
        &mut p,
        "No network: no socket is created, bound, listened on or connected. The client's socket,\n\
         the control line and the peer links are connected stream sockets already held; XNU\n\
         checks a send only with an address or on an unconnected socket and a receive only on\n\
         datagram sockets (bsd/kern/uipc_syscalls.c sendit, uipc_socket.c soreceive).",
        "(deny network* system-socket)",
    );
    rule(
        &mut p,
        "No program or process is started.",
        "(deny process-exec* process-fork)",
    );
    rule(
        &mut p,
        "No file is written anywhere (the weight cache included).",
        "(deny file-write*)",
    );
    p
}

/// Applies [`profile`] to this process (every thread, irreversibly). `home` is no longer needed
/// (`(deny default)` keeps the home directory out); kept so callers need not change.
#[cfg(target_os = "macos")]
pub fn apply(home: Option<&Path>, cache_dir: Option<&Path>) -> Result<(), String> {
    let _ = home;
    apply_with(cache_dir, &[])
}

/// [`apply`] with the `--gguf` files named in the profile (read-only).
#[cfg(target_os = "macos")]
pub fn apply_with(cache_dir: Option<&Path>, gguf: &[PathBuf]) -> Result<(), String> {
    let inputs = Inputs {
        cache_dir: cache_dir.map(Path::to_path_buf),
        gguf: gguf.to_vec(),
        darwin_cache_dir: crate::seatbelt::darwin_user_cache_dir(),
        exe: std::env::current_exe().ok(),
        pid: std::process::id(),
    };
    let text = profile(&inputs);
    tracing::debug!(profile = %text, "Seatbelt profile");
    let c = std::ffi::CString::new(text).map_err(|_| "a path holds a NUL byte".to_string())?;
    crate::seatbelt::apply_profile(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The profile's top-level forms, comments dropped, strings kept whole (a `;` or a
    /// parenthesis inside a string is text).
    fn forms(text: &str) -> Vec<String> {
        let (mut out, mut cur) = (Vec::new(), String::new());
        let (mut depth, mut in_str, mut esc, mut comment) = (0i32, false, false, false);
        for c in text.chars() {
            if comment {
                comment = c != '\n';
                continue;
            }
            if in_str {
                cur.push(c);
                if esc {
                    esc = false;
                } else if c == '\\' {
                    esc = true;
                } else if c == '"' {
                    in_str = false;
                }
                continue;
            }
            match c {
                ';' => {
                    comment = true;
                    continue;
                }
                '"' => in_str = true,
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0, "unbalanced ')' in\n{text}");
            if depth > 0 || c == ')' {
                cur.push(if c.is_whitespace() { ' ' } else { c });
            }
            if depth == 0 && c == ')' {
                out.push(cur.split_whitespace().collect::<Vec<_>>().join(" "));
                cur.clear();
            }
        }
        assert!(
            depth == 0 && !in_str,
            "unterminated form or string in\n{text}"
        );
        out
    }

    /// A fresh directory under the temporary directory (removed at drop).
    struct Scratch(PathBuf);
    impl Scratch {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let d = std::env::temp_dir().join(format!(
                "rpc-sandbox-mac-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sample() -> Inputs {
        Inputs {
            cache_dir: Some("/Users/me/Library/Caches/llama.cpp/rpc".into()),
            gguf: vec!["/Volumes/models/m.gguf".into()],
            darwin_cache_dir: Some("/private/var/folders/ab/cd/C".into()),
            exe: Some("/Users/me/ggml-rpc-rs/target/release/rpc-server".into()),
            pid: 4242,
        }
    }

    #[test]
    fn the_profile_starts_from_deny_default_and_never_allows_default() {
        let p = profile(&sample());
        assert!(p.starts_with("(version 1)\n(deny default)\n"), "{p}");
        let f = forms(&p);
        assert_eq!(f[0], "(version 1)");
        assert_eq!(f[1], "(deny default)");
        for form in &f {
            let tokens: Vec<&str> = form
                .trim_matches(|c| c == '(' || c == ')')
                .split_whitespace()
                .collect();
            if tokens[0] == "allow" {
                assert!(
                    !tokens.iter().any(|t| t.trim_end_matches(')') == "default"),
                    "{form}"
                );
            }
        }
        assert!(!p.contains("(allow default"), "{p}");
    }

    #[test]
    fn nothing_is_writable_and_the_weights_are_read_only() {
        let p = profile(&sample());
        for form in forms(&p) {
            if form.starts_with("(allow") {
                assert!(
                    !form.contains("file-write") && !form.contains("file* "),
                    "a write allowance: {form}"
                );
                assert!(!form.contains("process-exec") && !form.contains("network"));
            }
        }
        let f = forms(&p);
        assert!(
            f.contains(
                &"(allow file-read* (subpath \"/Users/me/Library/Caches/llama.cpp/rpc\"))"
                    .to_string()
            ),
            "{p}"
        );
        assert!(
            f.contains(&"(allow file-read* (literal \"/Volumes/models/m.gguf\"))".to_string()),
            "{p}"
        );
        // The explicit denials come last, so nothing before them can reopen what they deny.
        let n = f.len();
        assert_eq!(
            &f[n - 3..],
            [
                "(deny network* system-socket)",
                "(deny process-exec* process-fork)",
                "(deny file-write*)"
            ]
        );
        // The Metal shader cache is readable, under this program's name, and nothing else of
        // the Darwin cache directory is.
        let metal = "\"/private/var/folders/ab/cd/C/rpc-server\"";
        assert!(
            f.contains(&format!("(allow file-read* (subpath {metal}))")),
            "{p}"
        );
        assert_eq!(p.matches("/private/var/folders/ab/cd/C").count(), 2, "{p}");
        assert!(p.contains("(sysctl-name \"kern.proc.pid.4242\")"), "{p}");
    }

    #[test]
    fn nothing_under_home_but_the_cache_is_named() {
        let p = profile(&sample());
        for form in forms(&p) {
            if form.contains("/Users/me") {
                assert!(
                    form.contains("/Users/me/Library/Caches/llama.cpp/rpc")
                        || form.contains("/target/release/rpc-server"),
                    "{form}"
                );
                assert!(form.starts_with("(allow file-read* "), "{form}");
            }
        }
    }

    #[test]
    fn paths_under_a_symlink_are_resolved_whether_they_exist_or_not() {
        let s = Scratch::new();
        let real = s.0.join("real");
        std::fs::create_dir_all(real.join("cache")).unwrap();
        std::fs::write(real.join("m.gguf"), b"GGUF").unwrap();
        let link = s.0.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real = std::fs::canonicalize(&real).unwrap();
        // Exists: canonicalized.
        assert_eq!(resolve(&link.join("cache")), real.join("cache"));
        // Does not exist yet: the longest existing prefix is resolved, the rest appended.
        assert_eq!(
            resolve(&link.join("not").join("yet")),
            real.join("not").join("yet")
        );
        let p = profile(&Inputs {
            cache_dir: Some(link.join("cache")),
            gguf: vec![link.join("m.gguf")],
            darwin_cache_dir: Some(link.join("C")),
            exe: Some(link.join("rpc-server")),
            pid: 1,
        });
        let r = real.to_str().unwrap();
        for want in [
            format!("(subpath \"{r}/cache\")"),
            format!("(literal \"{r}/m.gguf\")"),
            format!("(subpath \"{r}/C/rpc-server\")"),
        ] {
            assert!(p.contains(&want), "{want} missing from\n{p}");
        }
        assert!(
            !p.contains(link.to_str().unwrap()),
            "an unresolved path in\n{p}"
        );
    }

    #[test]
    fn paths_are_quoted_as_scheme_strings_and_cannot_add_rules() {
        assert_eq!(quoted(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
        let s = Scratch::new();
        let hostile =
            s.0.join("x\")(allow default)(allow file-write* (subpath \"");
        let p = profile(&Inputs {
            cache_dir: Some(hostile.clone()),
            ..Inputs::default()
        });
        let r = std::fs::canonicalize(&s.0).unwrap();
        let want = format!(
            r#"(allow file-read* (subpath "{}/x\")(allow default)(allow file-write* (subpath \""))"#,
            r.to_str().unwrap()
        );
        let f = forms(&p);
        assert!(f.contains(&want), "{want} missing from\n{p}");
        assert!(!f.iter().any(|x| x.starts_with("(allow default")), "{p}");
        assert!(!f
            .iter()
            .any(|x| x.starts_with("(allow") && x.contains("file-write") && !x.contains("x\\\")")));
    }

    #[test]
    fn the_metal_cache_is_named_after_the_program() {
        assert_eq!(
            metal_cache_dir(Path::new("/nonexistent-C"), Path::new("/a/b/rpc-server")),
            Some(PathBuf::from("/nonexistent-C/rpc-server"))
        );
        assert_eq!(metal_cache_dir(Path::new("/c"), Path::new("/")), None);
    }
}
