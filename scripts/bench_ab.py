#!/usr/bin/env python3
"""dspark_bench for two or more variants in one run, the variants alternating (A B B A for --rounds 2, A B C C B
A for three variants), so that a change is judged against the old code on the same machine in the same minutes
(docs/performance.md, "Reading the tables"). A variant is NAME=BUILD (its apps/dspark_bench); --args NAME=ARGS
adds bench arguments to one variant (a tuning switch of one binary, say; not one that every run has too).
Arguments after -- go to every run.

  scripts/bench_ab.py old=/tmp/build-base new=build-gpu --rounds 3 -- --format fp8 --batch 1,4,16
  scripts/bench_ab.py plain=build-gpu tiles=build-gpu --args "plain=--weight-tiles false" -- --batch 1

Prints a row per measurement (format, kind, size): each variant's medians in run order, and each variant's
median of them over the first variant's. --json writes the runs' measurements and that summary. Exit 1 when a
run fails (its output is printed).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s NAME=BUILD NAME=BUILD... [options] [-- dspark_bench arguments]")
    p.add_argument("variant", nargs="+", help="NAME=BUILD: a build directory holding apps/dspark_bench")
    p.add_argument("--args", action="append", default=[], metavar="NAME=ARGS",
                   help="extra dspark_bench arguments of one variant (shell-quoted)")
    p.add_argument("--rounds", type=int, default=2, help="passes over the variants, every other one reversed")
    p.add_argument("--np", type=int, default=1, help="ranks (tp) of every run")
    p.add_argument("--mpirun", default="mpirun", help="the MPI launcher and its options")
    p.add_argument("--json", help="also write the runs and the summary here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.bench_args = argv[cut + 1:]  # every run's dspark_bench arguments
    variants = []
    for v in a.variant:
        name, sep, build = v.partition("=")
        if not sep or not name or not build:
            p.error(f"variant '{v}': expected NAME=BUILD")
        if not os.access(os.path.join(build, "apps", "dspark_bench"), os.X_OK):
            p.error(f"variant '{name}': {build}/apps/dspark_bench is not an executable")
        if name in (x["name"] for x in variants):
            p.error(f"variant '{name}' given twice")
        variants.append({"name": name, "build": build, "args": []})
    for extra in a.args:
        name, sep, args = extra.partition("=")
        match = [x for x in variants if x["name"] == name]
        if not sep or not match:
            p.error(f"--args '{extra}': expected NAME=ARGS with NAME one of the variants")
        match[0]["args"] += shlex.split(args)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    return a, variants


def run_order(variants, rounds):
    """(round, variant) in run order: every other round reversed."""
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            yield r, v


def measurement_key(fmt, m):
    size = m.get("batch", m.get("rows"))
    return (fmt, m["kind"], size)


def key_text(key):
    fmt, kind, size = key
    return f"{fmt} {kind} {'B' if kind != 'insert' else 'rows'}={size}"


def main():
    a, variants = parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, v in run_order(variants, a.rounds):
            path = os.path.join(tmp, f"run-{len(runs)}.json")
            cmd = shlex.split(a.mpirun) + ["-np", str(a.np), os.path.join(v["build"], "apps", "dspark_bench")]
            cmd += a.bench_args + v["args"] + ["--json", path]
            print(f"round {r} {v['name']}: {' '.join(shlex.quote(c) for c in cmd)}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if done.returncode != 0 or not os.path.exists(path):
                print(done.stdout, file=sys.stderr)
                print(f"FAIL: round {r}, variant {v['name']}: dspark_bench exited {done.returncode}",
                      file=sys.stderr)
                return 1
            with open(path) as f:
                report = json.load(f)
            rows = [dict(m, format=run["format"]) for run in report["runs"] for m in run["measurements"]]
            info = {k: x for k, x in report["runs"][0].items() if k not in ("measurements", "format")}
            runs.append({"round": r, "variant": v["name"], "command": cmd, "info": info, "measurements": rows})

    keys = []
    medians = {}  # key -> variant -> medians in run order
    for run in runs:
        for m in run["measurements"]:
            key = measurement_key(m["format"], m)
            if key not in medians:
                keys.append(key)
                medians[key] = {v["name"]: [] for v in variants}
            medians[key][run["variant"]].append(m["median_us"])
    base = variants[0]["name"]
    summary = []
    for key in keys:
        mid = {name: statistics.median(vals) for name, vals in medians[key].items() if vals}
        ratio = {name: mid[name] / mid[base] for name in mid if base in mid and mid[base] > 0}
        summary.append({"format": key[0], "kind": key[1], "size": key[2], "medians_us": medians[key],
                        "median_us": mid, "ratio_to_first": ratio})

    width = max(len(key_text(k)) for k in keys) if keys else 10
    head = f"{'measurement':<{width}}" + "".join(f"  {v['name'] + ' (us)':<{8 * a.rounds}}" for v in variants)
    head += "".join(f"  {v['name'] + '/' + base:>12}" for v in variants[1:])
    print(head)
    for s in summary:
        line = f"{key_text((s['format'], s['kind'], s['size'])):<{width}}"
        for v in variants:
            vals = " ".join(f"{x:7.1f}" for x in s["medians_us"][v["name"]])
            line += f"  {vals:<{8 * a.rounds}}"
        for v in variants[1:]:
            r = s["ratio_to_first"].get(v["name"])
            line += f"  {r:>12.3f}" if r is not None else f"  {'-':>12}"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"variants": variants, "rounds": a.rounds, "bench_args": a.bench_args, "runs": runs,
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
