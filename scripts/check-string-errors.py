#!/usr/bin/env python3
"""Fails when a library crate returns `Result<_, String>` outside the known list, or when a
crate does not take the workspace lints (`[lints] workspace = true`, which deny `unwrap()`
outside tests).

Library crates (everything under crates/*/src except the `kelp` binary, which may use anyhow)
keep one typed error enum each, so callers can tell a retryable failure from a fatal one
(docs/ARCHITECTURE.md, "Errors"). `String` errors lose that distinction. ALLOWED lists
occurrences still to be converted (none now); the list may only shrink: a new occurrence
fails the test run, and so does a listed one that no longer exists (remove it from the list).
"""
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULT = re.compile(r"\bResult<")


def string_errors(code: str) -> list[int]:
    """Offsets in `code` (comments already removed) of each `Result<T, String>` (any path to
    `Result`), also when the type is spread over several lines."""
    found = []
    for m in RESULT.finditer(code):
        depth, args, cur = 1, [], ""
        for ch in code[m.end():]:
            if ch in "<([":
                depth += 1
            elif ch in ">)]":
                depth -= 1
                if depth == 0:
                    break
            elif ch in "{};" and depth == 1:
                break  # not a type after all (`Result<` in a string, say)
            if ch == "," and depth == 1:
                args.append(cur)
                cur = ""
            else:
                cur += ch
        else:
            continue
        if depth != 0:
            continue
        args.append(cur)
        if len(args) > 1 and not args[-1].strip():
            args.pop()  # a trailing comma, as rustfmt writes a type spread over lines
        if len(args) == 2 and args[1].strip() in ("String", "std::string::String"):
            found.append(m.start())
    return found


# (file, number of occurrences) still to convert. Empty since every library crate's errors
# are typed: any new `Result<_, String>` fails. Keep the mechanism for a transition that
# needs it (a listed file may only go down).
ALLOWED: dict[str, int] = {}


def without_workspace_lints() -> list[str]:
    """Crates whose Cargo.toml does not opt into the workspace lints."""
    return [
        manifest.relative_to(ROOT).as_posix()
        for manifest in sorted(ROOT.glob("crates/*/Cargo.toml"))
        if tomllib.loads(manifest.read_text(encoding="utf-8")).get("lints", {}).get("workspace")
        is not True
    ]


def main() -> int:
    found = {}
    lines = {}
    for path in sorted(ROOT.glob("crates/*/src/**/*.rs")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("crates/kelp/"):
            continue
        text = path.read_text(encoding="utf-8").splitlines()
        code = "\n".join(line.split("//", 1)[0] for line in text)
        for at in string_errors(code):
            no = code.count("\n", 0, at) + 1
            found[rel] = found.get(rel, 0) + 1
            lines.setdefault(rel, []).append(f"{rel}:{no}: {text[no - 1].strip()}")
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
    for manifest in without_workspace_lints():
        bad = True
        print(f"{manifest}: add `[lints] workspace = true` (the workspace lints of the root "
              "Cargo.toml deny unwrap() outside tests)")
    if bad:
        return 1
    print(f"string errors: {sum(found.values())} left, all listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
