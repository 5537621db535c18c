#!/usr/bin/env python3
"""scripts/scaling_report.py end to end on the CPU backend: the tiny model at tp 1 and 2, bf16 and fp8. The CSV
holds one row per measurement, the plots are PNG files, the report's speed-up table equals tp 1's median over
tp 2's recomputed from the CSV, its exchange table the draft's median less the draft's with local exchanges,
over the tiny config's 3 stages x 2 sums + 5 positions, its time table the draft less its floor and
exchanges, its whole-step table the CSV's step, insert + draft and ring rows, and the sanity check refuses
hand-made bad rows.
Usage: scaling_report_cpu.py BUILD_DIR SOURCE_DIR"""
import csv
import importlib.util
import math
import os
import re
import subprocess
import sys
import tempfile

build, src = sys.argv[1], sys.argv[2]
script = os.path.join(src, "scripts", "scaling_report.py")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


# The sanity rule on hand-made rows (bytes 1e6 at 1e9 B/s: a 1000 us floor).
spec = importlib.util.spec_from_file_location("scaling_report", script)
sr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sr)
good = {"median_us": 2000.0, "p99_us": 2500.0, "floor_us": 1000.0, "bandwidth_bytes_per_s": 1e9,
        "weight_bytes": 1_000_000}
check(sr.insane(good) is None, "a sane row is accepted")
check("floor" in (sr.insane({**good, "floor_us": 900.0}) or ""), "a floor other than bytes / bandwidth is refused")
check("p99" in (sr.insane({**good, "p99_us": 1500.0}) or ""), "a p99 below the median is refused")
check("median_us" in (sr.insane({**good, "median_us": math.nan}) or ""), "a NaN median is refused")
check("median_us" in (sr.insane({**good, "median_us": 0.0}) or ""), "a zero median is refused")

# The CPU backend runs the tiny preset only, and says so.
bench = os.path.join(build, "apps", "dspark_bench")
r = subprocess.run([bench, "--backend", "cpu", "--preset", "v41-flash"], capture_output=True, text=True)
check(r.returncode != 0 and "tiny preset only" in r.stdout + r.stderr,
      f"--backend cpu --preset v41-flash is refused naming the tiny preset (exit {r.returncode})")

with tempfile.TemporaryDirectory() as out:
    cmd = [sys.executable, script, "--build", build, "--out", out, "--backend", "cpu", "--tp", "1,2",
           "--formats", "bf16,fp8", "--batch", "1,2", "--iters", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout, r.stderr)
    check(r.returncode == 0, f"the report runs (exit {r.returncode})")
    if r.returncode == 0:
        with open(os.path.join(out, "scaling.csv")) as f:
            rows = list(csv.DictReader(f))
        # 2 tp x 2 formats x (2 batches x (the draft, the draft with local exchanges, the step, insert + draft,
        # the step through the ring) + 3 insert sizes: the bench's default 1, 16, 128)
        check(len(rows) == 52, f"52 rows in the CSV (got {len(rows)})")
        check(all(x["backend"] == "cpu" and x["preset"] == "tiny" for x in rows), "every row cpu / tiny")
        for name in ("latency.png", "speedup.png"):
            with open(os.path.join(out, name), "rb") as f:
                data = f.read()
            check(data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, f"{name} is a PNG image")
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        check("mpirun -np 2" in report and "--backend cpu" in report, "the report names the commands")
        median = {(x["format"], int(x["size"]), int(x["tp"])): float(x["median_us"]) for x in rows
                  if x["kind"] == "draft"}
        for fmt in ("bf16", "fp8"):
            for b in (1, 2):
                want = median[(fmt, b, 1)] / median[(fmt, b, 2)]
                m = re.search(rf"^\| {re.escape(fmt)} \| {b} \| ([0-9.]+) \|$", report, re.M)
                check(m is not None and abs(float(m.group(1)) - want) <= 0.005 + 1e-9,
                      f"speed-up of {fmt} B={b}: {want:.3f} (report: {m.group(1) if m else 'missing'})")
                for tp in (1, 2):
                    local = {x["kind"]: float(x["median_us"]) for x in rows
                             if x["format"] == fmt and int(x["size"]) == b and int(x["tp"]) == tp}
                    cost = local["draft"] - local["draft_local"]  # whole calls: the CPU backend records no graphs
                    exchanges = 3 * 2 + 5
                    m = re.search(rf"^\| {re.escape(fmt)} \| {tp} \| {b} \| [0-9.]+ \| [0-9.]+ \| (-?[0-9.]+) "
                                  rf"\(11\) \| (-?[0-9.]+) \| call \|$", report, re.M)
                    check(m is not None and abs(float(m.group(1)) - cost) <= 0.05 + 1e-9 and
                          abs(float(m.group(2)) - cost / exchanges) <= 0.005 + 1e-9,
                          f"exchanges of {fmt} tp {tp} B={b}: {cost:.1f} us, {cost / exchanges:.2f} each "
                          f"(report: {m.groups() if m else 'missing'})")
                    floor = next(float(x["floor_us"]) for x in rows if x["kind"] == "draft" and
                                 x["format"] == fmt and int(x["size"]) == b and int(x["tp"]) == tp)
                    rest = local["draft"] - floor - cost
                    m = re.search(rf"^\| {re.escape(fmt)} \| {tp} \| {b} \| [0-9.]+ \| ([0-9.]+) \| -?[0-9.]+ \| "
                                  rf"(-?[0-9.]+) \| call \|$", report, re.M)
                    check(m is not None and abs(float(m.group(1)) - floor) <= 0.05 + 1e-9 and
                          abs(float(m.group(2)) - rest) <= 0.15 + 1e-9,
                          f"the rest of {fmt} tp {tp} B={b}: {rest:.1f} us over the floor {floor:.1f} "
                          f"(report: {m.groups() if m else 'missing'})")
                    step = {x["kind"]: x for x in rows
                            if x["format"] == fmt and int(x["size"]) == b and int(x["tp"]) == tp}
                    want = [float(step["step"]["median_us"]), float(step["step"]["floor_us"]),
                            float(step["step2"]["median_us"]), float(step["step_ring"]["median_us"]),
                            float(step["step_ring"]["median_us"]) / float(step["step"]["median_us"])]
                    m = re.search(rf"^\| {re.escape(fmt)} \| {tp} \| {b} \| ([0-9.]+) \| [0-9.]+ \| ([0-9.]+) \| "
                                  rf"[0-9.]+ \| ([0-9.]+) \| ([0-9.]+) \| [0-9.]+ \| ([0-9.]+) \|$", report, re.M)
                    got = [float(g) for g in m.groups()] if m else []
                    check(len(got) == 5 and all(abs(g - w) <= 0.05 + 1e-9 for g, w in zip(got[:4], want[:4]))
                          and abs(got[4] - want[4]) <= 0.005 + 1e-9,
                          f"whole steps of {fmt} tp {tp} B={b}: {want} (report: {got or 'missing'})")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("scaling report: every check passed")
