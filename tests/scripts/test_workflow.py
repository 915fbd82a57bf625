#!/usr/bin/env python3
"""The GitHub Actions workflows in .github/workflows/ (they cannot run here: no Mac).

Each workflow must validate against the GitHub workflow JSON schema (`check-jsonschema
--builtin-schema vendor.github-workflows`, from PyPI; a copy with a misspelt `runs-on` is shown to
fail it, so the check is real), and every repository path its `run:` steps name (scripts/...,
tests/...) must exist and scripts must be executable. Prints 'N passed, N failed'.

  python3 tests/scripts/test_workflow.py
"""

import glob
import os
import re
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
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
