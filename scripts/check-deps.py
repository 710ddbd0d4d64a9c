#!/usr/bin/env python3
"""Fails when a workspace crate depends on a crate its layer may not use.

The allowed edges are the table between the `deps:begin` and `deps:end` markers in
docs/ARCHITECTURE.md, so the document and the check cannot drift apart. Normal and build
dependencies are checked (dev-dependencies may reach higher layers: tests drive real daemons).
Every workspace crate must appear in the table.
"""
import json
import pathlib
import re
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
doc = (root / "docs" / "ARCHITECTURE.md").read_text()
m = re.search(r"<!-- deps:begin -->(.*?)<!-- deps:end -->", doc, re.S)
if not m:
    sys.exit("check-deps: docs/ARCHITECTURE.md has no deps:begin/deps:end table")
allowed = {}
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 3 or not cells[0].startswith("`"):
        continue
    crate = cells[0].strip("`")
    deps = set(re.findall(r"`([a-z0-9-]+)`", cells[2]))
    allowed[crate] = deps

meta = json.loads(subprocess.run(
    ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
    cwd=root, check=True, capture_output=True, text=True).stdout)
workspace = {p["name"] for p in meta["packages"]}
errors = []
for pkg in meta["packages"]:
    name = pkg["name"]
    if name not in allowed:
        errors.append(f"{name}: not in the dependency table of docs/ARCHITECTURE.md; add it with its layer")
        continue
    for dep in pkg["dependencies"]:
        if dep["name"] in workspace and dep["kind"] in (None, "build") and dep["name"] not in allowed[name]:
            errors.append(f"{name} depends on {dep['name']}, which its layer may not use "
                          f"(allowed: {', '.join(sorted(allowed[name])) or 'none'})")
if errors:
    print("check-deps: layering violations:\n  " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"check-deps: {len(workspace)} crates follow the layering in docs/ARCHITECTURE.md")
