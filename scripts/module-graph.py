#!/usr/bin/env python3
"""The import graph of the modules of rpc-server, rpc-session and rpc-contain (per crate:
`crate::x` uses between top-level modules, and `super::x` at the top of a top-level module's
file), and a check that it has no cycle: no two modules import each other, directly or through
others.

  python3 scripts/module-graph.py           print each module's imports, and any cycle
  python3 scripts/module-graph.py --check   exit 1 when there is a cycle

The crate root (lib.rs) is no node: in rpc-session it is the `Session` every module extends.
"""
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CRATES = ["rpc-proto", "rpc-ggml", "rpc-weights", "rpc-session", "rpc-contain", "rpc-transport", "rpc-server",
          "rpc-client", "rpc-shim", "rpc-bench", "link-emu", "bench-report", "rdma-verbs", "tests"]
USE = re.compile(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)")
# In a top-level module's own file, `super::` at the start of a line is the crate root (inside
# an inline `mod tests`, indented, it is the module itself).
SUPER = re.compile(r"^(?:pub(?:\([a-z]+\))? )?use super::(\{[^}]*\}|[a-z_][a-z0-9_]*)", re.M)


def module_of(src: Path, path: Path) -> str:
    rel = path.relative_to(src)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return rel.stem


def imports(text: str, top_level: bool) -> set:
    out = set()
    found = list(USE.finditer(text)) + (list(SUPER.finditer(text)) if top_level else [])
    for m in found:
        g = m.group(1)
        if g.startswith("{"):
            for part in g[1:-1].split(","):
                name = part.strip().split("::")[0].strip()
                if name:
                    out.add(name)
        else:
            out.add(g)
    return out


def graph(src: Path) -> dict:
    g = {}
    for f in sorted(src.rglob("*.rs")):
        mod = module_of(src, f)
        if mod in ("main", "lib", "bin"):
            continue
        # Comments name modules without importing them.
        text = "\n".join(l.split("//")[0] for l in f.read_text().splitlines())
        top = len(f.relative_to(src).parts) == 1
        g.setdefault(mod, set()).update(m for m in imports(text, top) if m != mod)
    for deps in g.values():
        deps.intersection_update(g.keys())
    return g


def cycles(g: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    failed = False
    for crate in CRATES:
        g = graph(REPO / crate / "src")
        found = cycles(g)
        if "--check" not in sys.argv:
            print(f"# {crate}")
            for m in sorted(g):
                print(f"{m}: {' '.join(sorted(g[m])) or '-'}")
        for c in found:
            print(f"{crate}: cycle: " + " <-> ".join(c))
        failed |= bool(found)
        if not found and "--check" in sys.argv:
            print(f"{crate}: {len(g)} modules, no import cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
