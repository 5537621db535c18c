#!/usr/bin/env python3
"""Compares two runs' drafts (dspark_worker --drafts-out JSON lines, or dspark_draft --json) by SPEC §5's rule.

Position j of a request is compared when the reference run's margin at j and at every earlier position exceeds
--margin (a near-tie frees every later position); there ids must be equal and confidences within --conf-tol.
An expert-routing decision at a near-tie inside the model (invisible in the output) changes a whole request's
hidden states, so up to --max-diverged of the requests may differ; each is listed. Exit 0 when the runs agree by
this rule, 1 when not.
"""
import argparse
import json
import sys


def steps(path):
    with open(path) as f:
        text = f.read()
    try:
        one = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    reqs = []
    for b, q in enumerate(one["requests"]):
        reqs.append({"slot": q["slot"], "token": q["token"], "pos": q["pos"], "ids": one["ids"][b],
                     "conf": one["conf"][b], "margin": one["margin"][b]})
    return [{"step": 0, "requests": reqs}]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("reference")
    ap.add_argument("other")
    ap.add_argument("--margin", type=float, default=0.06)
    ap.add_argument("--conf-tol", type=float, default=2e-2)
    ap.add_argument("--max-diverged", type=float, default=0.10)
    args = ap.parse_args()
    a, b = steps(args.reference), steps(args.other)
    if len(a) != len(b):
        sys.exit(f"{len(a)} steps against {len(b)}")
    compared = agreed = requests = 0
    mismatches = []
    for sa, sb in zip(a, b):
        if len(sa["requests"]) != len(sb["requests"]):
            sys.exit(f"step {sa['step']}: different request counts")
        for ra, rb in zip(sa["requests"], sb["requests"]):
            requests += 1
            if (ra["slot"], ra["token"], ra["pos"]) != (rb["slot"], rb["token"], rb["pos"]):
                sys.exit(f"step {sa['step']}: the runs' requests differ ({ra} / {rb}): not the same inputs")
            for j in range(len(ra["ids"])):
                if ra["margin"][j] <= args.margin:
                    break
                compared += 1
                same = ra["ids"][j] == rb["ids"][j] and abs(ra["conf"][j] - rb["conf"][j]) <= args.conf_tol
                if same:
                    agreed += 1
                    continue
                mismatches.append((sa["step"], ra["slot"], j, ra["ids"][j], rb["ids"][j], ra["margin"][j],
                                   ra["conf"][j], rb["conf"][j]))
                break  # later positions follow another token
    for m in mismatches:
        print("step {} slot {} position {}: {} vs {} (margin {:.4f}, conf {:.4f} vs {:.4f})".format(*m))
    share = len(mismatches) / max(requests, 1)
    print(f"{agreed} of {compared} positions outside near-ties agree; {len(mismatches)} of {requests} requests "
          f"diverge ({share:.1%}, allowed {args.max_diverged:.1%})")
    return 0 if compared > 0 and share <= args.max_diverged else 1


if __name__ == "__main__":
    sys.exit(main())
