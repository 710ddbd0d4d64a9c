#!/usr/bin/env python3
"""Differential test of `kelp crush` against Ceph's `crushtool` on random maps.

Generates random CRUSH maps (random hierarchies, weights that are not exact in binary, device
classes, firstn/indep/choose/chooseleaf rules with set_* steps, non-default tunables), compiles
each with crushtool, and checks that
  * `kelp crush show` prints exactly what `crushtool -d` prints, and
  * `kelp crush test` prints exactly what `crushtool --test --show-mappings` prints,
    for every rule, several num_rep values, random --weight overrides and --pool-id.
Needs crushtool (Debian: apt-get install ceph-base). Usage:
  scripts/crush-diff.py [--kelp target/release/kelp] [--maps 50] [--seed 1]
Exits non-zero on the first difference, leaving the inputs in a temp dir for inspection.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile

TYPES = ["osd", "host", "chassis", "rack", "row", "pdu", "pod", "room", "datacenter", "zone", "region", "root"]


def gen_map(rng):
    lines = ["# begin crush map"]
    profile = rng.choice(["optimal", "optimal", "optimal", "vary0", "nostable", "nodescend", "local"])
    tun = {"choose_local_tries": 0, "choose_local_fallback_tries": 0, "choose_total_tries": 50,
           "chooseleaf_descend_once": 1, "chooseleaf_vary_r": 1, "chooseleaf_stable": 1,
           "straw_calc_version": 1, "allowed_bucket_algs": 54}
    if profile == "vary0":
        tun["chooseleaf_vary_r"] = 0
    elif profile == "nostable":
        tun["chooseleaf_stable"] = 0
        tun["chooseleaf_vary_r"] = rng.choice([1, 2, 3])
    elif profile == "nodescend":
        tun["chooseleaf_descend_once"] = 0
        tun["choose_total_tries"] = rng.choice([19, 50])
    elif profile == "local":
        tun["choose_local_tries"] = 2
    for k, v in tun.items():
        lines.append(f"tunable {k} {v}")
    classes = rng.choice([[], [], ["ssd", "hdd"], ["hdd", "ssd", "nvme"]])
    # hierarchy: root -> [racks ->] hosts -> osds
    use_racks = rng.random() < 0.4
    n_racks = rng.randint(2, 4) if use_racks else 1
    hosts_per = rng.randint(1, 5)
    osd = 0
    devices = []
    buckets = []  # (type, name, id, items[(name, weight_str or None)], class_ids)
    bid = -1
    next_shadow = -100
    rack_items = []
    for r in range(n_racks):
        host_items = []
        for h in range(hosts_per):
            items = []
            for _ in range(rng.randint(1, 4)):
                cls = rng.choice(classes) if classes else None
                devices.append((osd, cls))
                w = rng.choice(["1.000", "0.500", "2.000", "1.819", "0.300", "4.097", "3.638", "0.010", "0.000", None])
                items.append((f"osd.{osd}", w))
                osd += 1
            bid -= 1
            name = f"host{r}_{h}"
            cids = []
            if classes and rng.random() < 0.8:
                for c in classes:
                    cids.append((next_shadow, c))
                    next_shadow -= 1
            buckets.append(("host", name, bid, items, cids))
            host_items.append((name, rng.choice([None, None, "7.250", "1.819"])))
        if use_racks:
            bid -= 1
            name = f"rack{r}"
            buckets.append(("rack", name, bid, host_items, []))
            rack_items.append((name, None))
        else:
            rack_items = host_items
    cids = [(next_shadow - i, c) for i, c in enumerate(classes)] if classes and rng.random() < 0.8 else []
    buckets.append(("root", "default", -1, rack_items, cids))
    lines.append("")
    lines.append("# devices")
    for d, c in devices:
        lines.append(f"device {d} osd.{d}" + (f" class {c}" if c else ""))
    lines.append("")
    lines.append("# types")
    for i, t in enumerate(TYPES):
        lines.append(f"type {i} {t}")
    lines.append("")
    lines.append("# buckets")
    for t, name, b, items, cids in buckets:
        lines.append(f"{t} {name} {{")
        lines.append(f"\tid {b}")
        for sid, c in cids:
            lines.append(f"\tid {sid} class {c}")
        lines.append("\talg straw2")
        lines.append("\thash 0")
        for it, w in items:
            lines.append(f"\titem {it}" + (f" weight {w}" if w is not None else ""))
        lines.append("}")
    lines.append("")
    lines.append("# rules")
    nrules = rng.randint(1, 4)
    for rid in range(nrules):
        indep = rng.random() < 0.4
        mode = "indep" if indep else "firstn"
        take = "default" + (f" class {rng.choice(classes)}" if classes and rng.random() < 0.6 else "")
        leaf_type = rng.choice(["host", "host", "osd"] + (["rack"] if use_racks else []))
        lines.append(f"rule r{rid} {{")
        lines.append(f"\tid {rid}")
        lines.append(f"\ttype {'erasure' if indep else 'replicated'}")
        lines.append("\tmin_size 1")
        lines.append("\tmax_size 20")
        if rng.random() < 0.4:
            lines.append(f"\tstep set_chooseleaf_tries {rng.choice([1, 5])}")
        if rng.random() < 0.4:
            lines.append(f"\tstep set_choose_tries {rng.choice([3, 100])}")
        if rng.random() < 0.1:
            lines.append(f"\tstep set_chooseleaf_vary_r {rng.choice([0, 1])}")
        if rng.random() < 0.1:
            lines.append(f"\tstep set_chooseleaf_stable {rng.choice([0, 1])}")
        lines.append(f"\tstep take {take}")
        shape = rng.random()
        if shape < 0.5:
            lines.append(f"\tstep chooseleaf {mode} {rng.choice([0, 0, -1, 2])} type {leaf_type}")
        elif shape < 0.75:
            lines.append(f"\tstep choose {mode} {rng.choice([0, 0, 2, -1])} type {leaf_type}")
            if leaf_type != "osd":
                lines.append(f"\tstep choose {mode} {rng.choice([1, 2])} type osd")
        else:
            outer = "rack" if use_racks else "host"
            lines.append(f"\tstep choose {mode} {rng.choice([2, 3])} type {outer}")
            lines.append(f"\tstep chooseleaf {mode} {rng.choice([1, 2])} type {'host' if use_racks else 'osd'}")
        lines.append("\tstep emit")
        lines.append("}")
    lines.append("")
    lines.append("# end crush map")
    return "\n".join(lines) + "\n", osd, nrules


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kelp", default="target/release/kelp")
    ap.add_argument("--maps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--xs", type=int, default=500)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="crush-diff-")
    checks = 0
    for m in range(a.maps):
        text, ndev, nrules = gen_map(rng)
        src = os.path.join(tmp, f"m{m}.src.txt")
        binf = os.path.join(tmp, f"m{m}.bin")
        txt = os.path.join(tmp, f"m{m}.txt")
        open(src, "w").write(text)
        c = run(["crushtool", "-c", src, "-o", binf])
        if c.returncode != 0:
            print(f"map {m}: crushtool refused it: {c.stderr.strip()} (skipped)")
            continue
        d = run(["crushtool", "-d", binf, "-o", txt])
        assert d.returncode == 0, d.stderr
        # Kelp must print exactly what crushtool prints for the same source text …
        k = run([a.kelp, "crush", "show", "--map", src])
        want = open(txt).read()
        if k.stdout != want:
            open(txt + ".kelp", "w").write(k.stdout + k.stderr)
            sys.exit(f"map {m}: `kelp crush show` differs from crushtool -d: diff {txt} {txt}.kelp")
        checks += 1
        # … and map exactly as crushtool does from the same text. (Decompiling rounds weights
        # to 3 decimals, so the decompiled text is a slightly different map: compile it again.)
        c = run(["crushtool", "-c", txt, "-o", binf])
        assert c.returncode == 0, c.stderr
        for rule in range(nrules):
            for n in rng.sample([1, 2, 3, 4, 6, 9], 3):
                args = ["--rule", str(rule), "--num-rep", str(n), "--min-x", "0", "--max-x", str(a.xs)]
                if rng.random() < 0.3:
                    args += ["--pool-id", str(rng.randint(0, 50))]
                for _ in range(rng.choice([0, 1, 3])):
                    args += ["--weight", str(rng.randrange(ndev)), rng.choice(["0", "0.5", "0.25", "0.9", "0.3", "1"])]
                want = run(["crushtool", "-i", binf, "--test", "--show-mappings"] + args).stdout
                got = run([a.kelp, "crush", "test", "--map", txt] + args)
                if got.stdout != want:
                    wl, gl = want.splitlines(), got.stdout.splitlines()
                    first = next((i for i in range(min(len(wl), len(gl))) if wl[i] != gl[i]), min(len(wl), len(gl)))
                    sys.exit(f"map {m} ({txt}) args {' '.join(args)}: first difference at line {first}:\n"
                             f"  crushtool: {wl[first] if first < len(wl) else '<none>'}\n"
                             f"  kelp:      {gl[first] if first < len(gl) else '<none>'}\n{got.stderr}")
                checks += 1
    print(f"crush-diff: {a.maps} random maps, {checks} comparisons, all identical to crushtool (seed {a.seed})")


if __name__ == "__main__":
    main()
