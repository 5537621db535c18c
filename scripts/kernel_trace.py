#!/usr/bin/env python3
"""The critical path of one draft step from a kernel start trace (kernels/cuda/kernel_trace.hpp).

Build with -DDSPARK_KERNEL_TRACE=ON and run dspark_bench --kernel-trace PATH (or the worker with
debug.kernel_trace_file: PATH): each rank appends its records to PATH.gpu<device>. This prints one call's kernels in the order their dependencies were met, with the time
from the previous one's (on the main stream, the previous kernel's duration, boundary included) and the wait
each spent launched but waiting (programmatic dependent launch). Kernels are named by their grid only.

usage: kernel_trace.py PATH.gpu0 [--call N]   (default: the call with the median span among the last half of
the calls that have the most common kernel count)
"""
import argparse
import collections
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--call", type=int, default=None)
    a = ap.parse_args()
    calls = collections.defaultdict(list)
    with open(a.trace) as f:
        for line in f:
            c, _, launched, ready, gx, gy, gz, bx = (int(v) for v in line.split(","))
            calls[c].append((ready, launched, f"{gx}x{gy}x{gz} b{bx}"))
    if not calls:
        raise SystemExit(f"{a.trace}: no records")
    if a.call is None:
        common = collections.Counter(len(v) for v in calls.values()).most_common(1)[0][0]
        same = [c for c in sorted(calls) if len(calls[c]) == common]
        same = same[len(same) // 2:]
        span = {c: max(r for r, _, _ in calls[c]) - min(r for r, _, _ in calls[c]) for c in same}
        a.call = sorted(same, key=lambda c: span[c])[len(same) // 2]
    ks = sorted(calls[a.call])
    t0 = ks[0][0]
    print(f"call {a.call}: {len(ks)} kernels, span {(ks[-1][0] - t0) / 1e3:.1f} us (first to last ready)")
    print(f"{'#':>3} {'ready_us':>9} {'since_prev':>10} {'waited':>7}  grid")
    prev = t0
    for i, (ready, launched, grid) in enumerate(ks):
        print(f"{i:3d} {(ready - t0) / 1e3:9.1f} {(ready - prev) / 1e3:10.1f} {(ready - launched) / 1e3:7.1f}  {grid}")
        prev = ready
    gaps = [(ks[i][0] - ks[i - 1][0]) / 1e3 for i in range(1, len(ks))]
    print(f"median since_prev {statistics.median(gaps):.1f} us")


if __name__ == "__main__":
    main()
