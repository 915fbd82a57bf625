#!/usr/bin/env python3
"""The OS branching of scripts/build-deps.sh under a faked OS (no Mac is available here).

Each case runs the script with PATH holding only stub commands (`uname`, `xcode-select`, `xcrun`,
`brew`, `apt-get`, `dpkg`, `cmake`, `cargo`, ... as the case needs) that record how they were
called, and checks what the script installed, printed and returned. Prints 'N passed, N failed'.

  python3 tests/scripts/test_build_deps.py
"""

import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "build-deps.sh")
# Real tools the script itself runs (from /usr/bin or /bin), linked into the stub directory.
REAL = ["bash", "id", "env", "dirname", "mkdir", "chmod", "date"]


def stub_dir(stubs):
    """A directory with each stub as an executable logging '<name> <args>' to $STUB_LOG."""
    d = tempfile.mkdtemp(prefix="build-deps-test-")
    for tool in REAL:
        path = shutil.which(tool)
        if path:
            os.symlink(path, os.path.join(d, tool))
    for name, body in stubs.items():
        with open(os.path.join(d, name), "w") as f:
            f.write("#!%s\necho \"%s $*\" >> \"$STUB_LOG\"\n%s\n" % (shutil.which("bash"), name, body or "exit 0"))
        os.chmod(os.path.join(d, name), 0o755)
    return d


def run_case(stubs, env=None, script=SCRIPT, args=(), out=None):
    d = stub_dir(stubs)
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    e = {"PATH": d, "STUB_LOG": log, "HOME": d}
    e.update(env or {})
    r = subprocess.run([shutil.which("bash"), script] + list(args), env=e, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    with open(log) as f:
        calls = f.read().splitlines()
    shutil.rmtree(d, ignore_errors=True)
    if out is not None:
        out.append(r.stdout)
    return r.returncode, r.stderr, calls


# scripts/run-server.sh in a scratch copy of scripts/ (it builds and runs ./target/... relative to
# the checkout): a stub cargo records the build's RUSTFLAGS and target dir and leaves a stub server
# that prints its arguments.
CARGO_BUILDS = ('echo "build RUSTFLAGS=[${RUSTFLAGS-unset}] TARGET=[${CARGO_TARGET_DIR-unset}]" >> "$STUB_LOG"\n'
                'mkdir -p "${CARGO_TARGET_DIR:-target}/release"\n'
                'printf \'#!/bin/sh\\necho "served $*"\\n\' > "${CARGO_TARGET_DIR:-target}/release/rpc-server"\n'
                'chmod +x "${CARGO_TARGET_DIR:-target}/release/rpc-server"')


def run_server_case(stubs, env=None, args=("-p", "50052")):
    repo = tempfile.mkdtemp(prefix="run-server-test-")
    os.mkdir(os.path.join(repo, "scripts"))
    for f in ("run-server.sh", "build-deps.sh", "portable-rustflags.sh"):
        shutil.copy(os.path.join(REPO, "scripts", f), os.path.join(repo, "scripts", f))
    out = []
    rc, err, calls = run_case(stubs, env=env, script=os.path.join(repo, "scripts", "run-server.sh"), args=args,
                              out=out)
    shutil.rmtree(repo, ignore_errors=True)
    return rc, err, calls, out[0]


MAC_OK = {
    "uname": "echo Darwin",
    "xcode-select": "echo /Library/Developer/CommandLineTools",
    "xcrun": "echo 26.2",
    "cmake": None,
    "cargo": None,
}
LINUX_OK = {
    "uname": "echo Linux", "cc": None, "c++": None, "cmake": None, "pkg-config": None, "cargo": None,
    "dpkg": None, "apt-get": None,
}


def with_(base, **changes):
    d = dict(base)
    for k, v in changes.items():
        k = k.replace("_", "-")
        if v is False:
            d.pop(k, None)
        else:
            d[k] = v
    return d


CASES = []


def case(fn):
    CASES.append(fn)
    return fn


@case
def mac_complete_installs_nothing():
    rc, err, calls = run_case(MAC_OK)
    assert rc == 0, err
    assert "RDMA over Thunderbolt available" in err, err
    assert not [c for c in calls if c.startswith(("brew", "python3", "apt-get"))], calls


@case
def mac_without_command_line_tools_says_how_and_fails():
    rc, err, calls = run_case(with_(MAC_OK, xcode_select="exit 2"))
    assert rc == 1, (rc, err)
    assert "xcode-select --install" in err, err


@case
def mac_old_sdk_builds_without_rdma_in_one_line():
    rc, err, _ = run_case(with_(MAC_OK, xcrun="echo 15.4"))
    assert rc == 0, err
    lines = [l for l in err.splitlines() if "RDMA" in l]
    assert len(lines) == 1 and "older than 26.2" in lines[0] and "without RDMA" in lines[0], err


@case
def mac_sdk_27_counts_as_new():
    rc, err, _ = run_case(with_(MAC_OK, xcrun="echo 27.0"))
    assert rc == 0 and "RDMA over Thunderbolt available" in err, err


@case
def mac_without_cmake_uses_homebrew():
    rc, err, calls = run_case(with_(MAC_OK, cmake=False, brew=None))
    assert rc == 0, err
    assert "brew install cmake" in calls, calls


@case
def mac_without_cmake_or_homebrew_uses_pip():
    rc, err, calls = run_case(with_(MAC_OK, cmake=False, python3=None))
    assert rc == 0, err
    assert any(c.startswith("python3 -m pip install --user") and "cmake" in c for c in calls), calls


@case
def mac_without_any_way_to_get_cmake_fails_with_instructions():
    rc, err, _ = run_case(with_(MAC_OK, cmake=False))
    assert rc == 1 and "brew install cmake" in err and "brew.sh" in err, err


@case
def mac_without_cargo_prints_rustup():
    rc, err, _ = run_case(with_(MAC_OK, cargo=False))
    assert rc == 1 and "sh.rustup.rs" in err, err


@case
def mac_never_calls_apt_or_dpkg():
    _, _, calls = run_case(with_(MAC_OK, cmake=False, brew=None, apt_get=None, dpkg=None))
    assert not [c for c in calls if c.startswith(("apt-get", "dpkg"))], calls


@case
def linux_complete_installs_nothing():
    rc, err, calls = run_case(LINUX_OK)
    assert rc == 0, err
    assert not [c for c in calls if c.startswith("apt-get")], calls


@case
def linux_installs_only_build_packages():
    rc, err, calls = run_case(with_(LINUX_OK, cmake=False, dpkg="exit 1"))
    assert rc == 0, err
    installs = [c for c in calls if c.startswith("apt-get install")]
    assert len(installs) == 1, calls
    pkgs = set(installs[0].split()) - {"apt-get", "install", "-y", "-qq"}
    assert pkgs == {"cmake", "libclang-dev", "libibverbs-dev"}, pkgs
    for test_only in ("qemu-system-x86", "busybox-static", "cpio", "rdma-core"):
        assert test_only not in installs[0], installs


@case
def linux_without_apt_names_what_is_missing():
    rc, err, _ = run_case(with_(LINUX_OK, cmake=False, apt_get=False, dpkg=False))
    assert rc == 1 and "cmake" in err, err


@case
def linux_without_cargo_prints_rustup():
    rc, err, _ = run_case(with_(LINUX_OK, cargo=False))
    assert rc == 1 and "sh.rustup.rs" in err, err


@case
def unknown_os_fails_clearly():
    rc, err, _ = run_case({"uname": "echo Plan9"})
    assert rc == 1 and "unsupported OS 'Plan9'" in err, err


def uname(s, m):
    return 'case "$1" in -m) echo %s ;; *) echo %s ;; esac' % (m, s)


@case
def run_server_builds_native_by_default():
    rc, err, calls, out = run_server_case(with_(LINUX_OK, uname=uname("Linux", "x86_64"), cargo=CARGO_BUILDS))
    assert rc == 0, err
    assert "build RUSTFLAGS=[unset] TARGET=[unset]" in calls, calls
    assert out.strip() == "served -p 50052", out


@case
def run_server_portable_on_x86_64_uses_x86_64_v3_in_its_own_target_dir():
    rc, err, calls, out = run_server_case(with_(LINUX_OK, uname=uname("Linux", "x86_64"), cargo=CARGO_BUILDS),
                                          env={"PORTABLE": "1"})
    assert rc == 0, err
    assert "build RUSTFLAGS=[-C target-cpu=x86-64-v3] TARGET=[target/portable]" in calls, calls
    assert out.strip() == "served -p 50052", out


@case
def run_server_portable_on_a_mac_uses_the_targets_baseline():
    rc, err, calls, out = run_server_case(with_(MAC_OK, uname=uname("Darwin", "arm64"), cargo=CARGO_BUILDS),
                                          env={"PORTABLE": "1"}, args=("-H", "10.0.0.2"))
    assert rc == 0, err
    # Empty RUSTFLAGS (set, so .cargo/config.toml's target-cpu=native is not used): apple-m1.
    assert "build RUSTFLAGS=[] TARGET=[target/portable]" in calls, calls
    assert out.strip() == "served -H 10.0.0.2", out


def test_plan(os_name):
    out = []
    rc, err, _ = run_case({"uname": "echo %s" % os_name}, env={"TEST_PLAN": "1"},
                          script=os.path.join(REPO, "scripts", "test.sh"), out=out)
    assert rc == 0, err
    lines = out[0].splitlines()
    return [l for l in lines if l.startswith("run: ")], [l for l in lines if l.startswith("skip: ")]


@case
def test_command_on_linux_runs_every_suite():
    runs, skips = test_plan("Linux")
    assert not skips, skips
    assert any("tests/vm/test-rdma.sh" in r for r in runs) and any("tests/vm/test-lean.sh" in r for r in runs), runs
    assert not any("--no-netns" in r for r in runs), runs


@case
def test_command_on_a_mac_skips_only_the_linux_suites_with_a_reason_each():
    runs, skips = test_plan("Darwin")
    assert len(skips) == 4, skips
    assert all("Linux-only:" in s for s in skips), skips
    assert sum("soft-RoCE VM" in s for s in skips) == 2 and any("dead-peer" in s for s in skips), skips
    assert any("compromised session" in s for s in skips), skips
    assert not any("tests/vm/" in r for r in runs), runs
    for must in ("cargo test --release --workspace", "tests/e2e/run_e2e.py", "tests/e2e/shim_e2e.py",
                 "tests/e2e/metrics_e2e.py", "hostile", "test-backend-ops.sh", "fuzz/smoke.sh"):
        assert any(must in r for r in runs), (must, runs)
    assert any("idle_e2e.py" in r and "--no-netns" in r for r in runs), runs


def main():
    passed = failed = 0
    for fn in CASES:
        try:
            fn()
            passed += 1
            print("ok   %s" % fn.__name__)
        except AssertionError as e:
            failed += 1
            print("FAIL %s: %s" % (fn.__name__, e))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
