#!/usr/bin/env python3
"""The import graph of rpc-server's modules (`crate::x` uses between top-level modules), and a
check that it has no cycle: no two modules import each other, directly or through others.

  python3 scripts/module-graph.py           print each module's imports, and any cycle
  python3 scripts/module-graph.py --check   exit 1 when there is a cycle
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "rpc-server" / "src"
USE = re.compile(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)")


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return rel.stem


def imports(text: str) -> set:
    out = set()
    for m in USE.finditer(text):
        g = m.group(1)
        if g.startswith("{"):
            for part in g[1:-1].split(","):
                name = part.strip().split("::")[0].strip()
                if name:
                    out.add(name)
        else:
            out.add(g)
    return out


def graph() -> dict:
    g = {}
    for f in sorted(SRC.rglob("*.rs")):
        mod = module_of(f)
        if mod in ("main", "lib", "bin"):
            continue
        # Comments name modules without importing them.
        text = "\n".join(l.split("//")[0] for l in f.read_text().splitlines())
        g.setdefault(mod, set()).update(m for m in imports(text) if m != mod)
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
    g = graph()
    found = cycles(g)
    if "--check" not in sys.argv:
        for m in sorted(g):
            print(f"{m}: {' '.join(sorted(g[m])) or '-'}")
    for c in found:
        print("cycle: " + " <-> ".join(c))
    if found:
        return 1
    if "--check" in sys.argv:
        print(f"{len(g)} modules, no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
