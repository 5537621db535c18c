#!/usr/bin/env python3
"""The scaling report: runs dspark_bench at every tp the machine has for every weight format asked, collects its
JSON into one CSV, draws the plots (draft latency against batch per tp and format with the floor drawn; the tp
speed-up) and writes a markdown report with the tables and the exact commands that made them. The bench also
times the whole steps (--iteration: the step, insert + draft, the step through the ring) and each draft with its
exchanges replaced by local copies of their results (--exchange-cost): the report's exchange table is the
difference, per step and per exchange (at tp 1, where nothing crosses ranks, the copies' own cost).

  scripts/scaling_report.py --build build --out out/scaling               # GPUs: tp 1, 2, 4, 8 up to the GPUs
  scripts/scaling_report.py --build build --out out/scaling --backend cpu # the tiny model on the CPU backend

On the CPU backend (no GPU, e.g. CI) it runs the tiny preset at tp 1 and 2. The run fails (exit 1) when a
bench run fails or a figure is not sane: a median or floor that is not a positive finite number, a floor that
is not the weight bytes over the measured bandwidth, a p99 below its median.
"""
import argparse
import csv
import datetime
import json
import math
import os
import shlex
import shutil
import subprocess
import sys

CSV_FIELDS = ["backend", "preset", "device", "tp", "format", "kind", "size", "median_us", "p99_us", "floor_us",
              "ratio_to_floor", "replay_median_us", "weight_bytes", "bandwidth_bytes_per_s", "exchanges_us",
              "per_exchange_us"]
FLOOR_TOLERANCE = 1e-6  # relative: the floor is recomputed from the JSON's bytes and bandwidth
EXCHANGE_TARGET_US = 3.0  # what one exchange (a sum or an argmax exchange) should cost the step


def gpu_count():
    if not shutil.which("nvidia-smi"):
        return 0
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="build directory holding apps/dspark_bench")
    p.add_argument("--out", default="out/scaling", help="directory for the JSON, CSV, plots and report")
    p.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto",
                   help="auto: cuda when nvidia-smi lists a GPU, else cpu")
    p.add_argument("--tp", default="", help="comma-separated tp values (default: cuda 1, 2, 4, 8 up to the "
                   "GPUs; cpu 1 and 2)")
    p.add_argument("--formats", default="bf16,fp8", help="dspark_bench --format values, one run per tp")
    p.add_argument("--batch", default="", help="dspark_bench --batch (default: its own)")
    p.add_argument("--iters", type=int, default=0, help="dspark_bench --iters (default: its own)")
    p.add_argument("--no-iteration", action="store_true",
                   help="skip the whole steps (dspark_bench --iteration: the step, insert + draft, through the ring)")
    p.add_argument("--mpirun", default="mpirun", help="the MPI launcher")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
    return p.parse_args()


def bench_command(args, backend, tp, json_path):
    cmd = [args.mpirun, "-np", str(tp)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if tp > os.cpu_count():
        cmd.append("--oversubscribe")
    if backend == "cuda":
        cmd += ["-x", "NCCL_NVLS_ENABLE=0"]
    cmd += [os.path.join(args.build, "apps", "dspark_bench"), "--backend", backend, "--format", args.formats,
            "--json", json_path]
    cmd.append("--exchange-cost")
    if not args.no_iteration:
        cmd.append("--iteration")
    if args.batch:
        cmd += ["--batch", args.batch]
    if args.iters:
        cmd += ["--iters", str(args.iters)]
    return cmd


def rows_of(doc):
    for run in doc["runs"]:
        for m in run["measurements"]:
            yield {
                "backend": run.get("backend", "cuda"), "preset": run["preset"], "device": run["device"],
                "tp": run["tp"], "format": run["format"], "kind": m["kind"],
                "size": m.get("batch", m.get("rows")), "median_us": m["median_us"], "p99_us": m["p99_us"],
                "floor_us": m["floor_us"], "ratio_to_floor": m["ratio_to_floor"],
                "replay_median_us": m["replay_median_us"], "weight_bytes": m["weight_bytes"],
                "bandwidth_bytes_per_s": run["bandwidth_bytes_per_s"],
                "exchanges_us": m.get("exchanges_us", ""), "per_exchange_us": m.get("per_exchange_us", ""),
                "exchanges_per_step": m.get("exchanges_per_step"), "exchanges_timed_by": m.get("exchanges_timed_by"),
                "drafts_match_real": m.get("drafts_match_real")}


def insane(row):
    """What is wrong with a row's figures, or None."""
    for key in ("median_us", "p99_us", "floor_us", "bandwidth_bytes_per_s"):
        v = row[key]
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            return f"{key} = {v!r} is not a positive finite number"
    if row["p99_us"] < row["median_us"]:
        return f"p99 {row['p99_us']} us below the median {row['median_us']} us"
    floor = row["weight_bytes"] / row["bandwidth_bytes_per_s"] * 1e6
    if abs(floor - row["floor_us"]) > FLOOR_TOLERANCE * floor:
        return f"floor {row['floor_us']} us is not weight bytes / bandwidth ({floor} us)"
    return None


def speedups(rows):
    """(format, batch) -> {tp: median tp 1 / median tp} for the draft rows."""
    draft = {(r["format"], r["size"], r["tp"]): r["median_us"] for r in rows if r["kind"] == "draft"}
    out = {}
    for (fmt, size, tp), us in draft.items():
        base = draft.get((fmt, size, 1))
        if base:
            out.setdefault((fmt, size), {})[tp] = base / us
    return out


def finish_axes(ax, xlabel, ylabel, title):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def save(fig, plt, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot(rows, out_dir, tps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    formats = sorted({r["format"] for r in rows})
    fig, axes = plt.subplots(1, len(formats), figsize=(6 * len(formats), 4.5), squeeze=False)
    for ax, fmt in zip(axes[0], formats):
        for tp in tps:
            d = sorted((r["size"], r["median_us"], r["floor_us"]) for r in rows
                       if r["kind"] == "draft" and r["format"] == fmt and r["tp"] == tp)
            if not d:
                continue
            line, = ax.plot([x[0] for x in d], [x[1] for x in d], marker="o", label=f"tp {tp}")
            ax.plot([x[0] for x in d], [x[2] for x in d], linestyle="--", color=line.get_color(),
                    label=f"tp {tp} floor")
        finish_axes(ax, "batch B (draft requests per step)", "draft step, median (us)",
                    f"{fmt}: latency against batch")
    files.append(save(fig, plt, os.path.join(out_dir, "latency.png")))

    sp = speedups(rows)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for fmt in formats:
        for tp in tps[1:]:
            d = sorted((size, v[tp]) for (f, size), v in sp.items() if f == fmt and tp in v)
            if d:
                ax.plot([x[0] for x in d], [x[1] for x in d], marker="o", label=f"{fmt} tp {tp}")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    finish_axes(ax, "batch B", "speed-up over tp 1 (median)", "tp speed-up of the draft step")
    files.append(save(fig, plt, os.path.join(out_dir, "speedup.png")))
    return files


def commit_of(root):
    r = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def report(rows, commands, plots, out_dir, tps, backend):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = rows[0]
    lines = [f"# dspark scaling report ({backend} backend, preset {first['preset']})", "",
             f"Commit {commit_of(root)}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"device {first['device']}, tp {', '.join(map(str, tps))}. Medians (p99) in microseconds; the floor "
             "is the weight bytes a call reads on a rank over that rank's measured bandwidth.", "",
             "## Commands", "", "```sh"] + [shlex.join(c) for c in commands] + ["```", "", "## Draft steps", "",
             "| format | tp | B | median | p99 | floor | x floor |", "|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["kind"] == "draft"), key=lambda r: (r["format"], r["tp"], r["size"])):
        lines.append(f"| {r['format']} | {r['tp']} | {r['size']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | "
                     f"{r['floor_us']:.1f} | {r['ratio_to_floor']:.2f} |")
    lines += ["", "## Inserts", "", "| format | tp | rows | median | p99 | floor |", "|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["kind"] == "insert"), key=lambda r: (r["format"], r["tp"], r["size"])):
        lines.append(f"| {r['format']} | {r['tp']} | {r['size']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | "
                     f"{r['floor_us']:.1f} |")
    local = sorted((r for r in rows if r["kind"] == "draft_local"), key=lambda r: (r["format"], r["tp"], r["size"]))
    if local:
        lines += ["", "## Exchanges in the draft step", "",
                  "The draft less the same draft with its exchanges (two sums per stage, one argmax exchange per "
                  "position) replaced by local copies of their results: medians of the recordings' replays where "
                  "the run has them, else of the whole calls. At tp 1 nothing crosses ranks: the difference is "
                  f"the copies' own cost. Target: {EXCHANGE_TARGET_US:g} us per exchange.", "",
                  "| format | tp | B | draft | local exchanges | exchanges | per exchange | timed by |",
                  "|---|---|---|---|---|---|---|---|"]
        parts = []
        for r in local:
            by = r["exchanges_timed_by"]
            key = "replay_median_us" if by == "replay" else "median_us"
            real = next(x for x in rows if x["kind"] == "draft" and x["format"] == r["format"] and
                        x["tp"] == r["tp"] and x["size"] == r["size"])
            note = "" if r["drafts_match_real"] else " (drafts differ: sums rounded otherwise)"
            lines.append(f"| {r['format']} | {r['tp']} | {r['size']} | {real[key]:.1f} | {r[key]:.1f} | "
                         f"{r['exchanges_us']:.1f} ({r['exchanges_per_step']}) | {r['per_exchange_us']:.2f} | "
                         f"{by}{note} |")
            rest = real[key] - real["floor_us"] - r["exchanges_us"]
            parts.append(f"| {r['format']} | {r['tp']} | {r['size']} | {real[key]:.1f} | {real['floor_us']:.1f} | "
                         f"{r['exchanges_us']:.1f} | {rest:.1f} | {by} |")
        lines += ["", "## Where the draft step's time goes", "",
                  "The draft (as timed above) as its floor (weight bytes over bandwidth), its exchanges (above) and "
                  "the rest: launches, waits between kernels, kernels above their floor.", "",
                  "| format | tp | B | draft | floor | exchanges | rest | timed by |", "|---|---|---|---|---|---|---|---|"]
        lines += parts
    steps = sorted((r for r in rows if r["kind"] == "step"), key=lambda r: (r["format"], r["tp"], r["size"]))
    if steps:
        lines += ["", "## Whole steps", "",
                  "The step an engine sends (dspark_bench --iteration: new rows for each of B sequences, then their "
                  "draft): through the step loop as one replay (`step`), as an insert and a draft (`ins+draft`), "
                  "and through the host ring (`ring`); the floor is the insert's and the draft's weight bytes.", "",
                  "| format | tp | B | step | p99 | floor | x floor | ins+draft | ring | ring p99 | ring / step |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in steps:
            same = {x["kind"]: x for x in rows
                    if x["format"] == r["format"] and x["tp"] == r["tp"] and x["size"] == r["size"]}
            two, ring = same.get("step2"), same.get("step_ring")
            lines.append(
                f"| {r['format']} | {r['tp']} | {r['size']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | "
                f"{r['floor_us']:.1f} | {r['ratio_to_floor']:.2f} | "
                + (f"{two['median_us']:.1f}" if two else "-") + " | "
                + (f"{ring['median_us']:.1f} | {ring['p99_us']:.1f} | {ring['median_us'] / r['median_us']:.2f}"
                   if ring else "- | - | -") + " |")
    sp = speedups(rows)
    if len(tps) > 1:
        lines += ["", "## Speed-up over tp 1 (draft step medians)", "",
                  "| format | B | " + " | ".join(f"tp {t}" for t in tps[1:]) + " |",
                  "|---|---|" + "---|" * (len(tps) - 1)]
        for (fmt, size), v in sorted(sp.items()):
            lines.append(f"| {fmt} | {size} | " + " | ".join(f"{v[t]:.2f}" if t in v else "-" for t in tps[1:])
                         + " |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main():
    args = parse_args()
    gpus = gpu_count()
    backend = args.backend if args.backend != "auto" else ("cuda" if gpus else "cpu")
    if args.tp:
        tps = sorted({int(t) for t in args.tp.split(",")})
    elif backend == "cuda":
        tps = [t for t in (1, 2, 4, 8) if t <= gpus]
    else:
        tps = [1, 2]
    if not tps:
        sys.exit("scaling_report: no GPU found for --backend cuda (nvidia-smi -L lists none)")
    bench = os.path.join(args.build, "apps", "dspark_bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"scaling_report: {bench} not found: build it first (or pass --build)")
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("scaling_report: matplotlib is missing (scripts/install_deps.sh installs python3-matplotlib; "
                     "--no-plots skips the plots)")
    os.makedirs(args.out, exist_ok=True)

    rows, commands = [], []
    for tp in tps:
        json_path = os.path.join(args.out, f"bench-{backend}-tp{tp}.json")
        cmd = bench_command(args, backend, tp, json_path)
        commands.append(cmd)
        print(f"scaling_report: tp {tp}: {shlex.join(cmd)}", flush=True)
        log = os.path.join(args.out, f"bench-{backend}-tp{tp}.log")
        with open(log, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            sys.exit(f"scaling_report: dspark_bench at tp {tp} exited {r.returncode} (its output: {log})")
        with open(json_path) as f:
            rows += list(rows_of(json.load(f)))

    bad = [(r, why) for r in rows for why in [insane(r)] if why]
    for r, why in bad:
        print(f"scaling_report: {r['format']} tp {r['tp']} {r['kind']} {r['size']}: {why}", file=sys.stderr)
    csv_path = os.path.join(args.out, "scaling.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plots = [] if args.no_plots else plot(rows, args.out, tps)
    path = report(rows, commands, plots, args.out, tps, backend)
    print(f"scaling_report: {len(rows)} rows in {csv_path}; report {path}" +
          (f"; plots {', '.join(plots)}" if plots else ""))
    if bad:
        sys.exit(f"scaling_report: {len(bad)} row(s) with figures that are not sane")


if __name__ == "__main__":
    main()
