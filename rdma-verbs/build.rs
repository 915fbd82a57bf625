//! Compiles the C shim (csrc/shim.c) against the platform's own
//! `<infiniband/verbs.h>` when it is available, else a stub (csrc/stub.c)
//! that reports "library missing" at run time.  Never links libibverbs:
//! the shim dlopen()s it.
//!
//! Environment:
//! * `RDMA_VERBS_INCLUDE=<dir>`      extra include directory for the header
//! * `RDMA_VERBS_FORCE_STUB=1`       build the stub even if the header exists
//! * `RDMA_VERBS_REQUIRE_HEADER=1`   fail the build instead of falling back to the stub
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    for f in [
        "csrc/shim.c",
        "csrc/stub.c",
        "csrc/shim.h",
        "csrc/platform_linux.h",
        "csrc/platform_apple.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    for v in [
        "RDMA_VERBS_INCLUDE",
        "RDMA_VERBS_FORCE_STUB",
        "RDMA_VERBS_REQUIRE_HEADER",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rustc-check-cfg=cfg(rdma_verbs_stub)");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let target_env = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let include = env::var_os("RDMA_VERBS_INCLUDE").map(PathBuf::from);
    let force_stub = env::var("RDMA_VERBS_FORCE_STUB")
        .map(|v| v == "1")
        .unwrap_or(false);
    let require = env::var("RDMA_VERBS_REQUIRE_HEADER")
        .map(|v| v == "1")
        .unwrap_or(false);
    let os_ok = target_os == "linux" || target_os == "macos";

    let have_header = os_ok && !force_stub && header_present(include.as_ref());
    if require && !have_header {
        panic!(
            "RDMA_VERBS_REQUIRE_HEADER=1 but <infiniband/verbs.h> was not usable \
             (target_os={target_os}, force_stub={force_stub}); install libibverbs-dev"
        );
    }

    let mut b = cc::Build::new();
    b.include("csrc").warnings(true).extra_warnings(true);
    if let Some(dir) = &include {
        b.include(dir);
    }
    if have_header {
        b.file("csrc/shim.c");
        b.compile("rdma_verbs_shim");
        // dlopen/dlsym live in libc from glibc 2.34 on; -ldl keeps older
        // glibc working (libdl is a stub there now).
        if target_os == "linux" && target_env == "gnu" {
            println!("cargo:rustc-link-lib=dl");
        }
    } else {
        if os_ok && !force_stub {
            // Never a silent stub: say why RDMA is off and how to get it.
            let how = if target_os == "macos" {
                "it ships with the macOS 26.2 SDK: update the Command Line Tools \
                 (softwareupdate --list, or xcode-select --install) and rebuild"
            } else {
                "install the verbs headers (Debian/Ubuntu: apt-get install libibverbs-dev) and rebuild"
            };
            println!(
                "cargo:warning=rdma-verbs: no usable <infiniband/verbs.h>: building WITHOUT RDMA (TCP only); {how}"
            );
        }
        b.file("csrc/stub.c");
        b.compile("rdma_verbs_shim");
        println!("cargo:rustc-cfg=rdma_verbs_stub");
    }
}

/// Preprocesses `#include <infiniband/verbs.h>` with the target C compiler
/// (respects cross sysroots and the macOS SDK).
fn header_present(include: Option<&PathBuf>) -> bool {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let probe = out.join("verbs_probe.c");
    if std::fs::write(&probe, "#include <infiniband/verbs.h>\nint rv_probe;\n").is_err() {
        return false;
    }
    let compiler = match cc::Build::new().cargo_metadata(false).try_get_compiler() {
        Ok(c) => c,
        Err(_) => return false,
    };
    let mut cmd: Command = compiler.to_command();
    if let Some(dir) = include {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg("-E")
        .arg(&probe)
        .arg("-o")
        .arg(out.join("verbs_probe.i"));
    matches!(cmd.output(), Ok(o) if o.status.success())
}
