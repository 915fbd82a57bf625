#!/usr/bin/env python3
"""The GitHub Actions workflows in .github/workflows/ (they cannot run here: no Mac).

Each workflow must validate against the GitHub workflow JSON schema (`check-jsonschema
--builtin-schema vendor.github-workflows`, from PyPI; a copy with a misspelt `runs-on` is shown to
fail it, so the check is real), and every repository path its `run:` steps name (scripts/...,
tests/...) must exist and scripts must be executable. The macOS workflow's jobs (read with
ruamel.yaml, which check-jsonschema brings): `worker-mac` installs Python packages only into a
venv (no `pip install --user`, which a Homebrew Python refuses), runs every script test of
tests/scripts/ under macOS's /bin/bash (3.2) and the test command's plan; `rdma-verbs-sdk` builds
rdma-verbs with RDMA_VERBS_REQUIRE_HEADER=1 and checks the build is not the stub, and its Xcode
selection step, run here against a scratch /Applications with stub `sudo`/`xcrun`, picks an Xcode
whose SDK has infiniband/verbs.h and, when none has, fails naming Xcode 26.2. Prints 'N passed,
N failed'.

  python3 tests/scripts/test_workflow.py
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def validate(path):
    r = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def main():
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        print("check-jsonschema not installed (scripts/deps.sh installs it: python3 -m pip install check-jsonschema)")
        return 1
    files = sorted(glob.glob(os.path.join(REPO, ".github", "workflows", "*.yml")))
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        if ok:
            passed += 1
            print("ok   %s" % name)
        else:
            failed += 1
            print("FAIL %s %s" % (name, detail))

    check("workflows exist", bool(files))
    for f in files:
        rel = os.path.relpath(f, REPO)
        rc, out = validate(f)
        check("%s matches the GitHub workflow schema" % rel, rc == 0, out)
        text = open(f).read()
        with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as t:
            t.write(text.replace("runs-on:", "runs-onn:"))
        rc, _ = validate(t.name)
        os.unlink(t.name)
        check("%s with a misspelt key fails the schema (the check is real)" % rel, rc != 0)
        missing = []
        for p in sorted(set(re.findall(r"\b((?:scripts|tests)/[\w./-]+\.(?:sh|py))\b", text))):
            full = os.path.join(REPO, p)
            if not os.path.isfile(full) or (p.endswith(".sh") and not os.access(full, os.X_OK)):
                missing.append(p)
        check("%s names only existing scripts" % rel, not missing, ", ".join(missing))
    mac = os.path.join(REPO, ".github", "workflows", "macos.yml")
    for name, fn in macos_checks(mac):
        try:
            fn()
            check(name, True)
        except AssertionError as e:
            check(name, False, str(e))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def steps(wf, job):
    return wf["jobs"][job]["steps"]


def step(wf, job, words):
    """The one step of `job` whose name contains `words`."""
    found = [s for s in steps(wf, job) if words in s.get("name", "")]
    assert len(found) == 1, "%s: no single step named '...%s...'" % (job, words)
    return found[0]


def xcode_step(script, xcodes):
    """Runs the Xcode selection step with /Applications replaced by a scratch directory holding
    `xcodes` (name: SDK has the header), stub `sudo` (records) and `xcrun` (answers for the
    selected Xcode). Returns (exit code, output, sudo calls)."""
    d = tempfile.mkdtemp(prefix="xcode-step-")
    apps = os.path.join(d, "Applications")
    for x, has in xcodes.items():
        inc = os.path.join(apps, x, "Contents/Developer/Platforms/MacOSX.platform/Developer/SDKs/MacOSX.sdk/usr/include")
        os.makedirs(os.path.join(inc, "infiniband"))
        if has:
            open(os.path.join(inc, "infiniband", "verbs.h"), "w").close()
    b = os.path.join(d, "bin")
    os.mkdir(b)
    for t in ("ls", "tr", "test", "cat", "dirname"):
        os.symlink(shutil.which(t), os.path.join(b, t))
    stubs = {
        "sudo": 'echo "sudo $*" >> "%s/sudo.log"; [ "$1 $2" = "xcode-select -s" ] && echo "$3" > "%s/selected"' % (d, d),
        "xcrun": 'x="$(cat %s/selected)"; case "$*" in *--show-sdk-version*) echo 26.2;; '
                 '*--show-sdk-path*) echo "$x/Contents/Developer/Platforms/MacOSX.platform/Developer/SDKs/MacOSX.sdk";; '
                 'esac' % d,
    }
    for n, body in stubs.items():
        with open(os.path.join(b, n), "w") as f:
            f.write("#!%s\n%s\n" % (shutil.which("bash"), body))
        os.chmod(os.path.join(b, n), 0o755)
    r = subprocess.run([shutil.which("bash"), "-e", "-c", script.replace("/Applications/", apps + "/")],
                       env={"PATH": b}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = os.path.join(d, "sudo.log")
    calls = open(log).read().splitlines() if os.path.exists(log) else []
    shutil.rmtree(d, ignore_errors=True)
    return r.returncode, r.stdout, calls


def macos_checks(path):
    from ruamel.yaml import YAML
    with open(path) as f:
        wf = YAML(typ="safe").load(f)
    text = open(path).read()
    checks = []

    def case(name):
        def add(fn):
            checks.append(("macos.yml: " + name, fn))
            return fn
        return add

    @case("both jobs on Apple-silicon macOS runners")
    def _():
        assert set(wf["jobs"]) == {"worker-mac", "rdma-verbs-sdk"}, wf["jobs"].keys()
        for j in wf["jobs"].values():
            assert j["runs-on"].startswith("macos-"), j["runs-on"]

    @case("worker-mac: Python packages only into a venv, never pip install --user (PEP 668)")
    def _():
        assert "--user" not in text and "--break-system-packages" not in text
        s = step(wf, "worker-mac", "Python packages")
        assert "python3 -m venv" in s["run"] and "$GITHUB_PATH" in s["run"], s["run"]
        first = [x.get("name", "") for x in steps(wf, "worker-mac")].index(s["name"])
        later = [x.get("run", "") for x in steps(wf, "worker-mac")[first + 1:]]
        assert any("tests/e2e/" in r for r in later), "the venv comes before the Python tests"

    @case("worker-mac: the first command's set-up, its tools dir on PATH for the later steps")
    def _():
        s = step(wf, "worker-mac", "Build dependencies")
        assert "scripts/build-deps.sh" in s["run"] and ".cache/ggml-rpc-rs/bin" in s["run"], s["run"]

    @case("worker-mac: every script test of tests/scripts/ under macOS's /bin/bash 3.2")
    def _():
        s = step(wf, "worker-mac", "Script tests")
        assert s["env"]["TEST_BASH"] == "/bin/bash" and s["env"]["RPC_BASH32"] == "/bin/bash", s.get("env")
        assert "3.2.*" in s["run"], "the step checks /bin/bash is 3.2"
        for t in sorted(glob.glob(os.path.join(REPO, "tests", "scripts", "test_*.py"))):
            t = os.path.relpath(t, REPO)
            if t.endswith("test_workflow.py"):
                continue  # this file: the workflow cannot check itself on a Mac
            assert t in s["run"], "%s not run on the Mac" % t
        plan = step(wf, "worker-mac", "plan")
        assert "TEST_PLAN=1 /bin/bash scripts/test.sh" in plan["run"], plan["run"]

    @case("rdma-verbs-sdk: the shim built with RDMA_VERBS_REQUIRE_HEADER=1, checked not to be the stub")
    def _():
        s = step(wf, "rdma-verbs-sdk", "Compile the verbs shim")
        assert str(s["env"]["RDMA_VERBS_REQUIRE_HEADER"]) == "1", s.get("env")
        assert "-p rdma-verbs" in s["run"] and "built_with_verbs=true" in s["run"], s["run"]
        with open(os.path.join(REPO, "rdma-verbs", "build.rs")) as f:
            assert "RDMA_VERBS_REQUIRE_HEADER" in f.read(), "build.rs no longer reads RDMA_VERBS_REQUIRE_HEADER"
        with open(os.path.join(REPO, "rdma-verbs", "examples", "devinfo.rs")) as f:
            assert "built_with_verbs={}" in f.read(), "devinfo no longer prints built_with_verbs="
        names = [x.get("name", "") for x in steps(wf, "rdma-verbs-sdk")]
        assert names.index(s["name"]) > names.index(step(wf, "rdma-verbs-sdk", "Select an Xcode")["name"])

    @case("rdma-verbs-sdk: the Xcode step selects one whose SDK has infiniband/verbs.h")
    def _():
        script = step(wf, "rdma-verbs-sdk", "Select an Xcode")["run"]
        rc, out, calls = xcode_step(script, {"Xcode_16.4.app": False, "Xcode_26.2.app": True, "Xcode_26.0.app": False})
        assert rc == 0, out
        assert len(calls) == 1 and calls[0].startswith("sudo xcode-select -s ") and calls[0].endswith(
            "/Xcode_26.2.app"), calls

    @case("rdma-verbs-sdk: without such an Xcode the step fails naming Xcode 26.2")
    def _():
        script = step(wf, "rdma-verbs-sdk", "Select an Xcode")["run"]
        rc, out, calls = xcode_step(script, {"Xcode_16.4.app": False, "Xcode_26.1.app": False})
        assert rc != 0 and "::error::" in out and "Xcode 26.2 or later is needed" in out, out
        assert "Xcode_26.1.app" in out, "the error lists what is installed: " + out
        assert calls == [], calls

    return checks


if __name__ == "__main__":
    sys.exit(main())
