#!/usr/bin/env python3
"""scripts/service.sh and the service files in packaging/, under a faked OS (no Mac here).

The rendered launchd plist must load with plistlib and carry the exact arguments (XML special
characters included), KeepAlive, and an ExitTimeOut above rpc-server's shutdown grace; the
rendered systemd unit must pass `systemd-analyze verify` without a warning (a unit naming a
missing binary is shown to fail it) and quote its arguments so systemd reads them back. Install
and uninstall run against stub `launchctl`/`systemctl` that record their calls, with files in a
scratch HOME (macOS) or SERVICE_ROOT (Linux). Prints 'N passed, N failed'.

  python3 tests/scripts/test_service.py [--bin target/release/rpc-server]
"""

import argparse
import os
import plistlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "service.sh")
REAL = ["bash", "sed", "mkdir", "rm", "install", "dirname", "cat", "env"]
ODD = ["--host", "10.0.0.2", "-c", "--cache-dir", "/tmp/a&b <c> %d $e \"f\" \\g"]


def run(cmd_args, uname="Linux", uid="0", stubs=None, env=None):
    d = tempfile.mkdtemp(prefix="service-test-")
    bindir = os.path.join(d, "bin")
    os.mkdir(bindir)
    for tool in REAL:
        path = shutil.which(tool)
        if path:
            os.symlink(path, os.path.join(bindir, tool))
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    all_stubs = {"uname": "echo %s" % uname, "id": "echo %s" % uid}
    all_stubs.update(stubs or {})
    for name, body in all_stubs.items():
        with open(os.path.join(bindir, name), "w") as f:
            f.write("#!%s\necho \"%s $*\" >> \"$STUB_LOG\"\n%s\n" % (shutil.which("bash"), name, body or "exit 0"))
        os.chmod(os.path.join(bindir, name), 0o755)
    home = os.path.join(d, "home")
    os.mkdir(home)
    e = {"PATH": bindir, "STUB_LOG": log, "HOME": home, "SERVICE_ROOT": os.path.join(d, "root")}
    e.update(env or {})
    r = subprocess.run([shutil.which("bash"), SCRIPT] + cmd_args, env=e, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    with open(log) as f:
        calls = [c for c in f.read().splitlines() if not c.startswith(("uname", "id "))]
    return r, calls, d


def shutdown_grace(binary):
    """The server's default --shutdown-grace, from its --help."""
    out = subprocess.run([binary, "--help"], stdout=subprocess.PIPE, text=True, check=True).stdout
    m = re.search(r"--shutdown-grace <SECONDS>.*?\[default: (\d+)\]", out, re.S)
    assert m, "rpc-server --help has no --shutdown-grace default"
    return int(m.group(1))


CASES = []


def case(fn):
    CASES.append(fn)
    return fn


@case
def macos_plist_loads_with_exact_arguments(b):
    r, calls, d = run(["print", "--bin", b, "--"] + ODD, uname="Darwin")
    assert r.returncode == 0, r.stderr
    p = plistlib.loads(r.stdout.encode())
    assert p["ProgramArguments"] == [b] + ODD, p["ProgramArguments"]
    assert p["KeepAlive"] is True and p["RunAtLoad"] is True
    assert p["ExitTimeOut"] > shutdown_grace(b), (p["ExitTimeOut"], shutdown_grace(b))
    assert p["StandardErrorPath"] == os.path.join(d, "home", "Library/Logs/rpc-server.log")
    assert p["Label"] == "com.ggml-rpc-rs.rpc-server"


@case
def default_arguments_listen_on_all_addresses(b):
    r, _, _ = run(["print", "--bin", b], uname="Darwin")
    assert r.returncode == 0, r.stderr
    assert plistlib.loads(r.stdout.encode())["ProgramArguments"] == [b, "--host", "0.0.0.0", "--port", "50052"]


@case
def linux_unit_passes_systemd_analyze_verify(b):
    if not shutil.which("systemd-analyze"):
        print("    (systemd-analyze not installed: unit checked by parsing only)")
    r, _, d = run(["print", "--bin", b, "--"] + ODD)
    assert r.returncode == 0, r.stderr
    unit = r.stdout
    m = re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M)
    assert m and int(m.group(1)) > shutdown_grace(b), "TimeoutStopSec not above the shutdown grace"
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    # systemd's quoting: "..." with \\ and \" escapes, then % and $ specifiers doubled.
    words = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(exec_start)]
    assert words == [b] + ODD, words
    if shutil.which("systemd-analyze"):
        path = os.path.join(d, "rpc-server.service")
        with open(path, "w") as f:
            f.write(unit)
        v = subprocess.run(["systemd-analyze", "verify", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        assert v.returncode == 0 and not v.stderr.strip(), "verify: rc %d: %s" % (v.returncode, v.stderr)
        # The control: the same unit naming a binary that does not exist fails verification.
        with open(path, "w") as f:
            f.write(unit.replace('ExecStart="%s"' % b, 'ExecStart="/nonexistent/rpc-server"'))
        v = subprocess.run(["systemd-analyze", "verify", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        assert v.returncode != 0, "systemd-analyze verify accepted a missing binary: it checks nothing"


@case
def macos_install_and_uninstall_use_launchctl_in_the_login_session(b):
    stubs = {"launchctl": None, "id": "echo 501"}
    r, calls, d = run(["install", "--bin", b, "--", "--host", "10.0.0.2"], uname="Darwin", stubs=stubs)
    assert r.returncode == 0, r.stderr
    plist = os.path.join(d, "home", "Library/LaunchAgents/com.ggml-rpc-rs.rpc-server.plist")
    with open(plist, "rb") as f:
        assert plistlib.load(f)["ProgramArguments"] == [b, "--host", "10.0.0.2"]
    assert calls == ["launchctl bootout gui/501/com.ggml-rpc-rs.rpc-server",
                     "launchctl bootstrap gui/501 %s" % plist], calls
    assert os.path.isdir(os.path.join(d, "home", "Library/Logs"))


@case
def macos_uninstall_removes_the_agent(b):
    stubs = {"launchctl": None, "id": "echo 501"}
    r, calls, d = run(["uninstall"], uname="Darwin", stubs=stubs)
    assert r.returncode == 0, r.stderr
    assert calls == ["launchctl bootout gui/501/com.ggml-rpc-rs.rpc-server"], calls


@case
def linux_install_copies_the_binary_and_enables_the_unit(b):
    r, calls, d = run(["install", "--bin", b, "--", "--port", "50099"], stubs={"systemctl": None})
    assert r.returncode == 0, r.stderr
    root = os.path.join(d, "root")
    assert os.access(os.path.join(root, "usr/local/bin/rpc-server"), os.X_OK)
    with open(os.path.join(root, "etc/systemd/system/rpc-server.service")) as f:
        assert 'ExecStart="/usr/local/bin/rpc-server" "--port" "50099"' in f.read()
    assert calls == ["systemctl daemon-reload", "systemctl enable rpc-server.service",
                     "systemctl restart rpc-server.service"], calls
    r, calls, _ = run(["uninstall"], stubs={"systemctl": None}, env={"SERVICE_ROOT": root})
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(root, "etc/systemd/system/rpc-server.service"))
    assert calls == ["systemctl disable --now rpc-server.service", "systemctl daemon-reload"], calls


@case
def linux_install_needs_root_and_says_so(b):
    r, calls, _ = run(["install", "--bin", b], uid="1000", stubs={"systemctl": None})
    assert r.returncode != 0 and "needs root" in r.stderr, r.stderr
    assert calls == [], calls


@case
def other_systems_and_bad_usage_are_refused_clearly(b):
    r, _, _ = run(["print", "--bin", b], uname="FreeBSD")
    assert r.returncode != 0 and "unsupported OS FreeBSD" in r.stderr, r.stderr
    r, _, _ = run(["start", "--bin", b])
    assert r.returncode != 0 and "unknown command start" in r.stderr, r.stderr
    r, _, _ = run(["install", "--port", "1"])
    assert r.returncode != 0 and "server arguments go after --" in r.stderr, r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "rpc-server"))
    a = ap.parse_args()
    b = os.path.abspath(a.bin)
    passed = failed = 0
    for fn in CASES:
        try:
            fn(b)
            passed += 1
            print("ok   %s" % fn.__name__)
        except AssertionError as e:
            failed += 1
            print("FAIL %s: %s" % (fn.__name__, e))
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
