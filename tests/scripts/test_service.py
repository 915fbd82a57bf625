#!/usr/bin/env python3
"""scripts/service.sh and the service files in packaging/, under a faked OS (no Mac here).

The rendered launchd plists (the daemon, macOS's default, and the per-user agent) must load with
plistlib and carry the exact arguments (XML special characters included), KeepAlive, and an
ExitTimeOut above rpc-server's shutdown grace; the daemon runs as the unprivileged account that
ran sudo (or --user NAME, never root), with HOME and its log in that account's home, bootstrapped
into the `system` domain from a root-owned 0644 file in /Library/LaunchDaemons. The rendered
systemd unit must pass `systemd-analyze verify` without a warning (a unit naming a missing binary
is shown to fail it) and quote its arguments so systemd reads them back. Install, restart and
uninstall run against stub `launchctl`/`systemctl`/`chown`/`dscl`/`id` that record their calls
(or answer as macOS's do for the accounts `alice`, uid 501, and root), with files in a scratch
HOME or SERVICE_ROOT. Prints 'N passed, N failed'.

TEST_BASH=/path/to/bash runs the script under that bash (tests/scripts/test_portable.py passes a
real bash 3.2, macOS's, when it has one).

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
# Only tools macOS has too.
REAL = ["sed", "mkdir", "rm", "mv", "chmod", "install", "dirname", "cat", "env"]
BASH = os.environ.get("TEST_BASH") or shutil.which("bash")
ODD = ["--host", "10.0.0.2", "-c", "--cache-dir", "/tmp/a&b <c> %d $e \"f\" \\g"]
LABEL = "com.ggml-rpc-rs.rpc-server"
# macOS's accounts as `id` and `dscl` answer: alice (501, home /Users/alice) and root.
ID = ('case "$*" in\n'
      '  -u) echo "$FAKE_UID";;\n'
      '  -un) if [ "$FAKE_UID" = 0 ]; then echo root; else echo alice; fi;;\n'
      '  "-u alice") echo 501;;\n'
      '  "-u root") echo 0;;\n'
      '  *) echo "id: $2: no such user" >&2; exit 1;;\n'
      'esac')
DSCL = ('case "$3" in\n'
        '  /Users/alice) echo "NFSHomeDirectory: /Users/alice";;\n'
        '  /Users/root) echo "NFSHomeDirectory: /var/root";;\n'
        '  *) echo "<dscl_cmd> DS Error: -14136 (eDSRecordNotFound)" >&2; exit 56;;\n'
        'esac')


def run(cmd_args, uname="Linux", uid="0", stubs=None, env=None, alice_home=True):
    """service.sh under a faked OS; SERVICE_ROOT is <d>/root (with /Users/alice in it unless
    alice_home is False)."""
    d = tempfile.mkdtemp(prefix="service-test-")
    bindir = os.path.join(d, "bin")
    os.mkdir(bindir)
    os.symlink(BASH, os.path.join(bindir, "bash"))
    for tool in REAL:
        path = shutil.which(tool)
        if path:
            os.symlink(path, os.path.join(bindir, tool))
    if alice_home:
        os.makedirs(os.path.join(d, "root", "Users", "alice"))
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    all_stubs = {"uname": "echo %s" % uname, "id": ID, "dscl": DSCL, "chown": None}
    all_stubs.update(stubs or {})
    for name, body in all_stubs.items():
        with open(os.path.join(bindir, name), "w") as f:
            f.write("#!%s\necho \"%s $*\" >> \"$STUB_LOG\"\n%s\n" % (shutil.which("bash"), name, body or "exit 0"))
        os.chmod(os.path.join(bindir, name), 0o755)
    home = os.path.join(d, "home")
    os.mkdir(home)
    e = {"PATH": bindir, "STUB_LOG": log, "HOME": home, "SERVICE_ROOT": os.path.join(d, "root"), "FAKE_UID": uid}
    e.update(env or {})
    r = subprocess.run([BASH, SCRIPT] + cmd_args, env=e, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    with open(log) as f:
        calls = [c for c in f.read().splitlines() if not c.startswith(("uname", "id ", "dscl "))]
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
def macos_daemon_plist_runs_as_the_account_that_ran_sudo_with_exact_arguments(b):
    r, calls, d = run(["print", "--bin", b, "--"] + ODD, uname="Darwin", env={"SUDO_USER": "alice"})
    assert r.returncode == 0, r.stderr
    p = plistlib.loads(r.stdout.encode())
    assert p["ProgramArguments"] == [b] + ODD, p["ProgramArguments"]
    assert p["UserName"] == "alice", p
    assert p["EnvironmentVariables"]["HOME"] == "/Users/alice" and p["WorkingDirectory"] == "/Users/alice", p
    assert p["StandardErrorPath"] == p["StandardOutPath"] == "/Users/alice/Library/Logs/rpc-server.log", p
    assert p["KeepAlive"] is True and p["RunAtLoad"] is True
    assert p["ExitTimeOut"] > shutdown_grace(b), (p["ExitTimeOut"], shutdown_grace(b))
    assert p["Label"] == LABEL
    assert "LimitLoadToSessionType" not in p and "GroupName" not in p, p


@case
def macos_agent_plist_loads_with_exact_arguments(b):
    r, calls, d = run(["print", "--agent", "--bin", b, "--"] + ODD, uname="Darwin", uid="501")
    assert r.returncode == 0, r.stderr
    p = plistlib.loads(r.stdout.encode())
    assert p["ProgramArguments"] == [b] + ODD, p["ProgramArguments"]
    assert p["KeepAlive"] is True and p["RunAtLoad"] is True
    assert p["ExitTimeOut"] > shutdown_grace(b), (p["ExitTimeOut"], shutdown_grace(b))
    assert p["StandardErrorPath"] == os.path.join(d, "home", "Library/Logs/rpc-server.log")
    assert p["Label"] == LABEL and "UserName" not in p


@case
def default_arguments_listen_on_all_addresses(b):
    for extra, uid in (([], "501"), (["--agent"], "501")):
        r, _, _ = run(["print", "--bin", b] + extra, uname="Darwin", uid=uid)
        assert r.returncode == 0, r.stderr
        assert plistlib.loads(r.stdout.encode())["ProgramArguments"] == [b, "--host", "0.0.0.0", "--port", "50052"]


@case
def macos_daemon_install_bootstraps_into_the_system_domain(b):
    stubs = {"launchctl": None}
    r, calls, d = run(["install", "--bin", b, "--", "--host", "10.0.0.2"], uname="Darwin", stubs=stubs,
                      env={"SUDO_USER": "alice"})
    assert r.returncode == 0, r.stderr
    root = os.path.join(d, "root")
    plist = os.path.join(root, "Library/LaunchDaemons/%s.plist" % LABEL)
    with open(plist, "rb") as f:
        p = plistlib.load(f)
    assert p["ProgramArguments"] == [b, "--host", "10.0.0.2"] and p["UserName"] == "alice", p
    # launchd refuses a daemon plist that is not root's or that others can write.
    assert os.stat(plist).st_mode & 0o777 == 0o644, oct(os.stat(plist).st_mode)
    logs = os.path.join(root, "Users/alice/Library/Logs")
    assert os.path.isfile(os.path.join(logs, "rpc-server.log"))
    assert calls == ["chown alice %s/Users/alice/Library" % root, "chown alice %s" % logs,
                     "chown alice %s/rpc-server.log" % logs,
                     "chown root:wheel %s.tmp" % plist,
                     "launchctl bootout system/%s" % LABEL,
                     "launchctl bootstrap system %s" % plist], calls
    assert "kickstart -k system/%s" % LABEL in r.stdout, r.stdout


@case
def macos_daemon_install_replaces_the_accounts_agent(b):
    d0 = tempfile.mkdtemp()
    agents = os.path.join(d0, "Library/LaunchAgents")
    os.makedirs(os.path.join(d0, "Library/Logs"))
    os.makedirs(agents)
    open(os.path.join(agents, LABEL + ".plist"), "w").close()
    # /Users/alice as that scratch home: SERVICE_ROOT's Users/alice is a link to it.
    r, calls, d = run(["install", "--bin", b], uname="Darwin", stubs={"launchctl": None},
                      env={"SUDO_USER": "alice"}, alice_home=False)
    assert r.returncode != 0 and "createhomedir -c -u alice" in r.stderr, r.stderr
    assert calls == [], calls
    os.makedirs(os.path.join(d, "root", "Users"))
    os.symlink(d0, os.path.join(d, "root", "Users", "alice"))
    r, calls, _ = run(["install", "--bin", b], uname="Darwin", stubs={"launchctl": None},
                      env={"SUDO_USER": "alice", "SERVICE_ROOT": os.path.join(d, "root")}, alice_home=False)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(agents, LABEL + ".plist"))
    lc = [c for c in calls if c.startswith("launchctl")]
    assert lc == ["launchctl bootout gui/501/%s" % LABEL, "launchctl bootout system/%s" % LABEL,
                  "launchctl bootstrap system %s/root/Library/LaunchDaemons/%s.plist" % (d, LABEL)], lc
    shutil.rmtree(d0, ignore_errors=True)


@case
def macos_daemon_needs_root_and_names_the_agent_option(b):
    for cmd in (["install", "--bin", b], ["uninstall"], ["restart"]):
        r, calls, _ = run(cmd, uname="Darwin", uid="501", stubs={"launchctl": None})
        assert r.returncode != 0 and "needs root: sudo" in r.stderr, r.stderr
        assert calls == [], calls
    r, _, _ = run(["install", "--bin", b], uname="Darwin", uid="501", stubs={"launchctl": None})
    assert "--agent" in r.stderr, r.stderr


@case
def macos_daemon_never_runs_as_root_or_a_missing_account(b):
    for env, extra, says in (({}, [], "--user NAME"), ({"SUDO_USER": "root"}, [], "--user NAME"),
                             ({}, ["--user", "root"], "does not run as root"),
                             ({"SUDO_USER": "alice"}, ["--user", "bob"], "no account 'bob'"),
                             ({}, ["--user", "a b"], "not an account name")):
        r, calls, _ = run(["install"] + extra + ["--bin", b], uname="Darwin", stubs={"launchctl": None}, env=env)
        assert r.returncode != 0 and says in r.stderr, (env, extra, r.stderr)
        assert calls == [], calls


@case
def macos_daemon_restart_status_and_uninstall(b):
    r, calls, d = run(["restart"], uname="Darwin", stubs={"launchctl": None})
    assert r.returncode == 0, r.stderr
    assert calls == ["launchctl kickstart -k system/%s" % LABEL], calls
    r, calls, _ = run(["status"], uname="Darwin", uid="501", stubs={"launchctl": None})
    assert r.returncode == 0 and calls == ["launchctl print system/%s" % LABEL], calls
    plist = os.path.join(d, "root", "Library/LaunchDaemons", LABEL + ".plist")
    os.makedirs(os.path.dirname(plist))
    open(plist, "w").close()
    r, calls, _ = run(["uninstall"], uname="Darwin", stubs={"launchctl": None},
                      env={"SERVICE_ROOT": os.path.join(d, "root")})
    assert r.returncode == 0, r.stderr
    assert calls == ["launchctl bootout system/%s" % LABEL], calls
    assert not os.path.exists(plist)


@case
def macos_warns_about_a_binary_where_background_services_cannot_read(b):
    r, _, d = run(["print", "--bin", b], uname="Darwin", uid="501")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    docs = os.path.join(d, "Documents")
    os.mkdir(docs)
    os.symlink(b, os.path.join(docs, "rpc-server"))
    r, calls, _ = run(["install", "--bin", os.path.join(docs, "rpc-server")], uname="Darwin",
                      stubs={"launchctl": None}, env={"SUDO_USER": "alice"})
    assert r.returncode == 0 and "Full Disk Access" in r.stderr, r.stderr


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
def macos_agent_install_restart_and_uninstall_use_the_login_session(b):
    stubs = {"launchctl": None}
    r, calls, d = run(["install", "--agent", "--bin", b, "--", "--host", "10.0.0.2"], uname="Darwin", uid="501",
                      stubs=stubs)
    assert r.returncode == 0, r.stderr
    plist = os.path.join(d, "home", "Library/LaunchAgents/%s.plist" % LABEL)
    with open(plist, "rb") as f:
        assert plistlib.load(f)["ProgramArguments"] == [b, "--host", "10.0.0.2"]
    assert calls == ["launchctl bootout gui/501/%s" % LABEL,
                     "launchctl bootstrap gui/501 %s" % plist], calls
    assert os.path.isdir(os.path.join(d, "home", "Library/Logs"))
    r, calls, _ = run(["restart", "--agent"], uname="Darwin", uid="501", stubs=stubs)
    assert r.returncode == 0 and calls == ["launchctl kickstart -k gui/501/%s" % LABEL], calls
    r, calls, _ = run(["uninstall", "--agent"], uname="Darwin", uid="501", stubs=stubs)
    assert r.returncode == 0, r.stderr
    assert calls == ["launchctl bootout gui/501/%s" % LABEL], calls


@case
def macos_agent_is_not_installed_as_root(b):
    r, calls, _ = run(["install", "--agent", "--bin", b], uname="Darwin", stubs={"launchctl": None},
                      env={"SUDO_USER": "alice"})
    assert r.returncode != 0 and "without sudo" in r.stderr, r.stderr
    assert calls == [], calls


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
    r, calls, _ = run(["restart"], stubs={"systemctl": None})
    assert r.returncode == 0 and calls == ["systemctl restart rpc-server.service"], calls


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
    r, _, _ = run(["install", "--agent", "--bin", b])
    assert r.returncode != 0 and "--agent is for macOS" in r.stderr, r.stderr


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
