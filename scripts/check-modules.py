#!/usr/bin/env python3
"""Fails when the modules of a crate listed below refer to each other in a circle.

A module depends on another when its code names it (`use crate::recovery::…`,
`crate::stats::OsdStats`, `use crate::{a, b}`); comments do not count, the crate root
(`lib.rs`, which declares and re-exports every module) is left out, and a module's unit tests
count as part of it. docs/ARCHITECTURE.md draws the graph this keeps acyclic (for kelp-osd:
`service` → `recovery`/`scrub` → `host`, never back); `--print` prints each module's
dependencies.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Crates whose module graph must stay acyclic.
CRATES = ["kelp-osd"]

PATH = re.compile(r"\bcrate::(?:\{([^}]*)\}|([a-z_][a-z0-9_]*))")


def strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        out.append(line.split("//", 1)[0])
    return "\n".join(out)


def module_graph(crate: str) -> dict[str, set[str]]:
    src = ROOT / "crates" / crate / "src"
    modules = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        if rel.as_posix() in ("lib.rs", "main.rs"):
            continue
        # `a.rs` and `a/…` (its submodules) are module `a`.
        name = rel.parts[0].removesuffix(".rs")
        modules.setdefault(name, set())
        code = strip_comments(path.read_text(encoding="utf-8"))
        for group, single in PATH.findall(code):
            names = [single] if single else [
                p.strip().split("::")[0] for p in group.split(",") if p.strip()
            ]
            for n in names:
                if n and n != "self" and n != name:
                    modules[name].add(n)
    return {m: {d for d in deps if d in modules} for m, deps in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def main() -> int:
    bad = False
    for crate in CRATES:
        graph = module_graph(crate)
        if "--print" in sys.argv[1:]:
            print(f"{crate}:")
            for m in sorted(graph):
                print(f"  {m} -> {', '.join(sorted(graph[m])) or '(none)'}")
        cycle = find_cycle(graph)
        if cycle:
            bad = True
            print(f"{crate}: modules refer to each other in a circle: {' -> '.join(cycle)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
