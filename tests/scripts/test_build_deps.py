#!/usr/bin/env python3
"""The OS branching of scripts/build-deps.sh, run-server.sh and deps.sh under a faked OS (no Mac
is available here).

Each case runs the script with PATH holding only stub commands (`uname`, `xcode-select`, `xcrun`,
`brew`, `apt-get`, `dpkg`, `cmake`, `cargo`, `python3`, ... as the case needs) that record how they
were called, beside links to the few real tools a Mac has too (no `nproc`, no `sha256sum`), and
checks what the script installed, printed and returned. The stubs fail the way the real tools do:
cargo fails unless a working `cmake` is on PATH (the cmake crate's error), a Homebrew Python
refuses `pip install --user` with pip's "externally-managed-environment" error (PEP 668), the
Command Line Tools' Python puts a `pip install --user` into ~/Library/Python/3.9/bin (off PATH),
`brew install cmake` puts cmake into Homebrew's bin. First commands on a fresh Mac are run end to
end (run-server.sh to a running stub server): Command Line Tools only, Homebrew (on PATH, and off
PATH as in a non-login SSH shell), a Homebrew Python, no Command Line Tools. Prints 'N passed, N
failed'.

TEST_BASH=/path/to/bash runs every script under that bash (tests/scripts/test_portable.py passes a
real bash 3.2, macOS's, when it has one).

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
# Only tools macOS has too (and no GNU-only ones such as nproc or sha256sum).
REAL = ["id", "env", "dirname", "basename", "mkdir", "chmod", "date", "ln", "cat", "cp", "rm"]
BASH = os.environ.get("TEST_BASH") or shutil.which("bash")


def stub_dir(stubs):
    """A directory with each stub as an executable logging '<name> <args>' to $STUB_LOG. A name
    with a '/' (e.g. 'homebrew/bin/brew') is made in that subdirectory, off PATH."""
    d = tempfile.mkdtemp(prefix="build-deps-test-")
    os.symlink(BASH, os.path.join(d, "bash"))
    for tool in REAL:
        path = shutil.which(tool)
        if path:
            os.symlink(path, os.path.join(d, tool))
    for name, body in stubs.items():
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("#!%s\necho \"%s $*\" >> \"$STUB_LOG\"\n%s\n" % (shutil.which("bash"), os.path.basename(name),
                                                                     body or "exit 0"))
        os.chmod(path, 0o755)
    return d


def run_case(stubs, env=None, script=SCRIPT, args=(), out=None):
    """Runs `script` with PATH the stub directory, HOME in it; '{d}' in an env value is the
    directory."""
    d = stub_dir(stubs)
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    e = {"PATH": d, "STUB_LOG": log, "HOME": d}
    e.update({k: v.replace("{d}", d) for k, v in (env or {}).items()})
    r = subprocess.run([BASH, script] + list(args), env=e, stdin=subprocess.DEVNULL,
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


# cargo as the build fails without cmake: llama-cpp-sys-2's build script runs `cmake` (the cmake
# crate), and cargo reports its error and exits 101.
CARGO_NEEDS_CMAKE = (
    'if ! command -v cmake >/dev/null || ! cmake --version >/dev/null; then\n'
    '  echo "error: failed to run custom build command for \\`llama-cpp-sys-2 v0.1.161\\`" >&2\n'
    '  echo "  failed to execute command: No such file or directory (os error 2)" >&2\n'
    '  echo "  is \\`cmake\\` not installed?" >&2\n'
    '  exit 101\n'
    'fi\n' + CARGO_BUILDS)

# A cmake stub as pip's wheel or Homebrew installs it: `cmake --version` works.
CMAKE_BODY = 'case "$1" in --version) echo "cmake version 4.1.2";; esac; exit 0'


def python3_stub(pep668):
    """python3 as on a Mac: the Command Line Tools' 3.9 (pep668=False: `pip install` falls back to
    --user, into ~/Library/Python/3.9/bin, which is not on PATH) or Homebrew's (pep668=True:
    refuses any install outside a venv unless --break-system-packages). `-m venv DIR` makes a venv
    whose python3 installs cmake into DIR/bin with pip."""
    refuse = ('cat >&2 <<"E"\nerror: externally-managed-environment\n\n'
              '\u00d7 This environment is externally managed\n'
              '\u2570\u2500> To install Python packages system-wide, try brew install\n'
              '    xyz, where xyz is the package you are trying to\n    install.\n\n'
              '    If you wish to install a Python library that isn\'t in Homebrew,\n'
              '    use a virtual environment:\n\n    python3 -m venv path/to/venv\n'
              '    source path/to/venv/bin/activate\n    python3 -m pip install xyz\n\n'
              'note: If you believe this is a mistake, please contact your Python installation or OS '
              'distribution provider. You can override this, at the risk of breaking your Python '
              'installation or OS, by passing --break-system-packages.\n'
              'hint: See PEP 668 for the detailed specification.\nE\nexit 1\n')
    venv_python = ('#!' + shutil.which("bash") + '\n'
                   'echo "venv-python3 $*" >> "$STUB_LOG"\n'
                   'case "$*" in *"-m pip install"*cmake*)\n'
                   '  printf \'#!/bin/sh\\n%s\\n\' \'' + CMAKE_BODY + '\' > "$(dirname "$0")/cmake"\n'
                   '  chmod +x "$(dirname "$0")/cmake";; esac\n')
    user_base = '$HOME/Library/Python/3.9'
    return (
        'case "$*" in\n'
        '  "-m venv "*) mkdir -p "$3/bin"; cat > "$3/bin/python3" <<"V"\n' + venv_python + 'V\n'
        '    chmod +x "$3/bin/python3"; ln -s python3 "$3/bin/pip";;\n'
        '  "-m site --user-base") echo "' + user_base + '";;\n'
        '  *"-m pip install"*"--break-system-packages"*) ;;\n'
        '  *"-m pip install"*) ' + (refuse if pep668 else
                                   'echo "Defaulting to user installation because normal site-packages is not writeable"\n'
                                   '    case "$*" in *cmake*) mkdir -p "' + user_base + '/bin"\n'
                                   '      printf \'#!/bin/sh\\n%s\\n\' \'' + CMAKE_BODY + '\' > "' + user_base + '/bin/cmake"\n'
                                   '      chmod +x "' + user_base + '/bin/cmake";; esac') + ';;\n'
        '  "-c "*) exit 1;;\n'
        'esac\n')


# brew as Homebrew's: `install cmake` puts cmake into its prefix's bin (beside brew itself).
BREW = ('here="$(cd "$(dirname "$0")" && pwd)"\n'
        'case "$1" in\n'
        '  install) printf \'#!/bin/sh\\n%s\\n\' \'' + CMAKE_BODY + '\' > "$here/cmake"; chmod +x "$here/cmake";;\n'
        '  --prefix) dirname "$here";;\n'
        'esac\n')


def run_server_case(stubs, env=None, args=("-p", "50052")):
    repo = tempfile.mkdtemp(prefix="run-server-test-")
    os.mkdir(os.path.join(repo, "scripts"))
    for f in ("run-server.sh", "build-deps.sh", "portable-rustflags.sh", "deps.sh"):
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


def with_(base, paths=None, **changes):
    """`base` with the stubs in `changes` (keyword: '_' for '-') and `paths` (name: body) added,
    or removed where the body is False."""
    d = dict(base)
    items = [(k.replace("_", "-"), v) for k, v in changes.items()] + list((paths or {}).items())
    for k, v in items:
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
    rc, err, calls = run_case(with_(MAC_OK, cmake=False, brew=BREW))
    assert rc == 0, err
    assert "brew install cmake" in calls, calls


@case
def mac_without_cmake_or_homebrew_uses_pip_in_a_private_venv():
    rc, err, calls = run_case(with_(MAC_OK, cmake=False, python3=python3_stub(pep668=False)))
    assert rc == 0, err
    assert any(c.startswith("python3 -m venv ") and c.endswith("/.cache/ggml-rpc-rs/cmake-venv") for c in calls), calls
    assert any(c.startswith("venv-python3 -m pip install") and "cmake" in c for c in calls), calls
    assert not any("--user" in c for c in calls), calls


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


def served(rc, err, out, args="-p 50052"):
    assert rc == 0, err
    assert out.strip() == "served %s" % args, (out, err)


MAC_FRESH = with_(MAC_OK, uname=uname("Darwin", "arm64"), cmake=False, cargo=CARGO_NEEDS_CMAKE)


@case
def the_stub_cargo_fails_without_cmake_as_the_real_build_does():
    """The control of the cases below: without cmake on PATH the build stops, with cmake's error."""
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, python3=False))
    assert rc == 1 and "brew.sh" in err, err
    assert not any(c.startswith("build") for c in calls), calls
    d = tempfile.mkdtemp()
    try:
        r = subprocess.run([BASH, "-c", "cargo build"], env={"PATH": stub_dir({"cargo": CARGO_NEEDS_CMAKE}),
                                                             "STUB_LOG": os.devnull}, cwd=d,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 101 and "is `cmake` not installed?" in r.stderr, r.stderr


@case
def first_command_on_a_mac_with_only_the_command_line_tools():
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, python3=python3_stub(pep668=False)))
    served(rc, err, out)
    assert any(c.startswith("python3 -m venv ") for c in calls), calls
    assert not any("--user" in c for c in calls), calls
    assert any(c.startswith("build ") for c in calls), calls


@case
def first_command_on_a_mac_with_homebrew():
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, brew=BREW))
    served(rc, err, out)
    assert "brew install cmake" in calls, calls


@case
def first_command_over_ssh_with_homebrew_off_path():
    """A non-login SSH shell has no `brew shellenv`: brew and its cmake are not on PATH."""
    env = {"RPC_BREW_PREFIXES": "{d}/nowhere {d}/homebrew"}
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, {"homebrew/bin/brew": BREW}), env=env)
    served(rc, err, out)
    assert "brew install cmake" in calls, calls
    # Installed once; the next run finds Homebrew's cmake, off PATH, and installs nothing.
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, {"homebrew/bin/brew": BREW,
                                                            "homebrew/bin/cmake": CMAKE_BODY}), env=env)
    served(rc, err, out)
    assert "brew install cmake" not in calls, calls


@case
def first_command_on_a_mac_with_a_homebrew_python_that_refuses_pip_user():
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, python3=python3_stub(pep668=True)))
    served(rc, err, out)
    assert any(c.startswith("python3 -m venv ") for c in calls), calls
    assert "externally-managed-environment" not in err, err


@case
def the_homebrew_python_stub_refuses_pip_user_as_pip_does():
    """The control of the case above: the stub refuses what the old script ran."""
    d = stub_dir({"python3": python3_stub(pep668=True)})
    try:
        r = subprocess.run([os.path.join(d, "python3"), "-m", "pip", "install", "--user", "-q", "cmake"],
                           env={"PATH": d, "STUB_LOG": os.devnull, "HOME": d}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 1 and "error: externally-managed-environment" in r.stderr, r.stderr


@case
def first_command_on_a_mac_without_the_command_line_tools():
    # Without them xcode-select -p fails, and /usr/bin/python3 and cc only offer the install.
    shim = 'echo "xcode-select: note: No developer tools were found, requesting install." >&2; exit 1'
    xs = ('echo "xcode-select: error: unable to get active developer directory, use \\`sudo xcode-select '
          '--switch path/to/Xcode.app\\` to set it (or see \\`man xcode-select\\`)" >&2; exit 2')
    rc, err, calls, out = run_server_case(with_(MAC_FRESH, xcode_select=xs, python3=shim, cc=shim))
    assert rc == 1, err
    assert "xcode-select --install" in err and "softwareupdate --install" in err, err
    assert not [c for c in calls if c.startswith(("python3", "cc", "cargo", "build", "brew"))], calls
    assert out == "", out


@case
def deps_on_a_mac_with_a_homebrew_python_installs_the_test_packages_for_the_user():
    rc, err, calls = run_case(with_(MAC_OK, python3=python3_stub(pep668=True)),
                              script=os.path.join(REPO, "scripts", "deps.sh"))
    assert rc == 0, err
    installs = [c for c in calls if c.startswith("python3 -m pip install")]
    assert any("gguf==0.19.0" in c and "--break-system-packages" in c and "--user" in c for c in installs), calls
    assert "externally managed (PEP 668)" in err, err


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
    assert len(skips) == 5, skips
    assert all("Linux-only:" in s for s in skips), skips
    assert sum("soft-RoCE VM" in s for s in skips) == 3 and any("dead-peer" in s for s in skips), skips
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
