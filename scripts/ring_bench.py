#!/usr/bin/env python3
"""Whole steps through the host ring, several builds in one run: for each build a worker serves the checkpoint
and `dspark_client bench` drives it at every batch size (each sequence sends --accepted-rows new rows a step,
the shape `dspark_bench --iteration` times without the ring); the client's round trip (p50, p99) is printed
beside the worker's own step (`step_us` p50, p99: from the decoded message to the answer). With two builds the
order alternates (A B B A for --rounds 2), so that a change is judged against the old code in the same run.

  scripts/ring_bench.py --build /tmp/build-base --build build-gpu --checkpoint /data/v41-fp8 --batches 1,2,4,8
  scripts/ring_bench.py --build build --checkpoint out/tiny-ckpt --backend cpu --batches 1,2 --steps 50

DSPARK_RING_SPIN_US (--spin-us, --client-spin-us) sets how long each side spins before its futex sleep;
DSPARK_RING_SPIN_AHEAD, when set in the environment, goes to both sides. Exit 1 when a worker does not serve or
a bench run fails.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

LATENCY = re.compile(r"step with context\s+n\s+(\d+)\s+p50\s+([\d.]+)\s+p99\s+([\d.]+)")
WORKER = re.compile(r"^step_us p50 ([\d.]+) p99 ([\d.]+)", re.M)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", action="append", required=True, help="a build directory (apps/dspark_worker, "
                   "apps/dspark_client); give it twice or more to compare builds")
    p.add_argument("--checkpoint", required=True, help="the checkpoint every worker serves")
    p.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batches", default="1,2,4,8", help="sequences drafted per step, comma-separated")
    p.add_argument("--steps", type=int, default=1024, help="timed steps per batch size (the worker's step_us "
                   "covers its last 1024 steps: fewer mix in the previous batch size's)")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first (the prefills among them)")
    p.add_argument("--prefill", type=int, default=128, help="context rows of each new sequence")
    p.add_argument("--accepted-rows", type=int, default=4, help="new rows per sequence and step")
    p.add_argument("--rounds", type=int, default=2, help="passes over the builds, every other one reversed")
    p.add_argument("--spin-us", type=int, default=30, help="the worker's DSPARK_RING_SPIN_US")
    p.add_argument("--client-spin-us", type=int, default=None, help="the client's (default: --spin-us)")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--max-context-rows", type=int, default=1024)
    p.add_argument("--max-model-len", type=int, default=65536)
    p.add_argument("--mpirun", default="mpirun",
                   help="the MPI launcher and its options (e.g. \"mpirun --bind-to none\")")
    p.add_argument("--json", help="also write the rows here")
    return p.parse_args()


def worker_config(args, path, ring):
    batches = [int(b) for b in args.batches.split(",")]
    text = f"""checkpoint: {os.path.abspath(args.checkpoint)}
backend: {args.backend}
slots: {max(args.slots, max(batches))}
max_batch: {max(batches)}
max_model_len: {args.max_model_len}
max_context_rows: {args.max_context_rows}
ring:
  name: {ring}
"""
    with open(path, "w") as f:
        f.write(text)


def run_build(args, build, config, ring, env):
    worker_env = dict(env, DSPARK_RING_SPIN_US=str(args.spin_us))
    cmd = shlex.split(args.mpirun) + ["-np", "1"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["-x", "DSPARK_RING_SPIN_US", "-x", "NCCL_NVLS_ENABLE=0"]
    if "DSPARK_RING_SPIN_AHEAD" in env:  # the worker's spin window too, where the caller sets it
        cmd += ["-x", "DSPARK_RING_SPIN_AHEAD"]
    cmd += [os.path.join(build, "apps", "dspark_worker"), config]
    log = tempfile.TemporaryFile(mode="w+")
    worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=worker_env)
    client = os.path.join(build, "apps", "dspark_client")
    client_env = dict(env, DSPARK_RING_SPIN_US=str(args.spin_us if args.client_spin_us is None
                                                   else args.client_spin_us))
    rows = []
    try:
        ready = subprocess.run([client, "--ring", ring, "--timeout-ms", "300000", "health"], env=client_env,
                               capture_output=True, text=True)
        if ready.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"the worker of {build} does not serve: {ready.stderr.strip()}\n{log.read()[-3000:]}")
        for b in args.batches.split(","):
            r = subprocess.run([client, "--ring", ring, "bench", "--steps", str(args.steps), "--warmup",
                                str(args.warmup), "--sequences", b, "--prefill", str(args.prefill),
                                "--accepted-rows", str(args.accepted_rows)], env=client_env,
                               capture_output=True, text=True)
            lat, wst = LATENCY.search(r.stdout), WORKER.search(r.stdout)
            if r.returncode != 0 or not lat or not wst:
                raise RuntimeError(f"dspark_client bench --sequences {b} ({build}) failed: {r.stderr.strip()}")
            rows.append({"build": build, "batch": int(b), "steps": int(lat.group(1)),
                         "ring_p50_us": float(lat.group(2)), "ring_p99_us": float(lat.group(3)),
                         "worker_p50_us": float(wst.group(1)), "worker_p99_us": float(wst.group(2))})
    finally:
        subprocess.run([client, "--ring", ring, "stop"], env=client_env, capture_output=True)
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return rows


def main():
    args = parse_args()
    env = dict(os.environ)
    ring = f"/dspark-ring-bench-{os.getpid()}"
    if args.steps < 1024 and len(args.batches.split(",")) > 1:
        print("ring_bench: note: --steps below 1024: the worker p50 of a later batch size also covers the "
              "previous one's steps (the worker's window is its last 1024)", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "worker.yaml")
        worker_config(args, config, ring)
        print(f"{'build':<28} {'B':>3} {'ring p50':>10} {'ring p99':>10} {'worker p50':>11} {'worker p99':>11} "
              f"{'ring/worker':>11}")
        for r in range(args.rounds):
            for build in (args.build if r % 2 == 0 else list(reversed(args.build))):
                t0 = time.monotonic()
                try:
                    got = run_build(args, build, config, ring, env)
                except RuntimeError as e:
                    print(f"ring_bench: {e}", file=sys.stderr)
                    return 1
                for row in got:
                    row["round"] = r
                    print(f"{build:<28} {row['batch']:>3} {row['ring_p50_us']:>10.1f} {row['ring_p99_us']:>10.1f} "
                          f"{row['worker_p50_us']:>11.1f} {row['worker_p99_us']:>11.1f} "
                          f"{row['ring_p50_us'] / row['worker_p50_us']:>11.2f}",
                          flush=True)
                rows.extend(got)
                print(f"  ({build}: {time.monotonic() - t0:.1f} s with the worker's start)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
