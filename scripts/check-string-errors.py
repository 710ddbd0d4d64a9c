#!/usr/bin/env python3
"""Fails when a library crate returns `Result<_, String>` outside the known list.

Library crates (everything under crates/*/src except the `kelp` binary, which may use anyhow)
keep one typed error enum each, so callers can tell a retryable failure from a fatal one
(docs/ARCHITECTURE.md, "Errors"). `String` errors lose that distinction. The occurrences
listed in ALLOWED predate the rule and are still to be converted; the list may only shrink:
a new occurrence fails the test run, and so does a listed one that no longer exists (remove
it from the list).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULT = re.compile(r"\bResult<")


def string_errors(code: str) -> int:
    """How many `Result<T, String>` (any path to `Result`) the line holds."""
    n = 0
    for m in RESULT.finditer(code):
        depth, args, cur = 1, [], ""
        for ch in code[m.end():]:
            if ch in "<([":
                depth += 1
            elif ch in ">)]":
                depth -= 1
                if depth == 0:
                    break
            if ch == "," and depth == 1:
                args.append(cur)
                cur = ""
            else:
                cur += ch
        else:
            continue  # the type goes on past the line: not checked
        args.append(cur)
        if len(args) == 2 and args[1].strip() in ("String", "std::string::String"):
            n += 1
    return n

# (file, number of occurrences) still to convert.
ALLOWED = {
    "crates/kelp-client/src/ops.rs": 2,
    "crates/kelp-client/src/rados.rs": 1,
    "crates/kelp-crush/src/map.rs": 1,
    "crates/kelp-mon/src/network.rs": 1,
    "crates/kelp-rgw/src/layout.rs": 1,
    "crates/kelp-rgw/src/lifecycle.rs": 2,
    "crates/kelp-store/src/kelpstore/mod.rs": 3,
}


def main() -> int:
    found = {}
    lines = {}
    for path in sorted(ROOT.glob("crates/*/src/**/*.rs")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("crates/kelp/"):
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("//", 1)[0]
            n = string_errors(code)
            if n:
                found[rel] = found.get(rel, 0) + n
                lines.setdefault(rel, []).append(f"{rel}:{no}: {line.strip()}")
    bad = False
    for rel, n in sorted(found.items()):
        allowed = ALLOWED.get(rel, 0)
        if n > allowed:
            bad = True
            print(f"{rel}: {n} `Result<_, String>` (allowed {allowed}); use the crate's error enum:")
            for l in lines[rel]:
                print(f"  {l}")
    for rel, allowed in sorted(ALLOWED.items()):
        if found.get(rel, 0) < allowed:
            bad = True
            print(f"{rel}: now {found.get(rel, 0)} `Result<_, String>`, listed as {allowed}: "
                  "lower the count in scripts/check-string-errors.py")
    if bad:
        return 1
    print(f"string errors: {sum(found.values())} left, all listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
