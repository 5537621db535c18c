#!/usr/bin/env python3
"""Compares two runs' drafts by SPEC §5's rule and prints PASS or FAIL (exit 0 or 1; 2 for unreadable input).

Each input is dspark_worker --drafts-out JSON lines, dspark_draft --json output, or a golden case's expected.json
(ids / conf / margin, its requests in the requests.json beside it).

Position j of a request is compared when the reference run's margin at j and at every earlier position exceeds
--margin (a near-tie frees every later position); there ids must be equal and confidences within --conf-tol.
An expert-routing decision at a near-tie inside the model (invisible in the output) changes a whole request's
hidden states, so up to --max-diverged of the requests may differ; each is listed.

A golden expected.json as the reference selects the golden rule (its README): margin 1e-3 and no request may
diverge, unless --margin / --max-diverged say otherwise.
"""
import argparse
import json
import os
import sys

# SPEC §5's rule for two runs of this implementation (tp = N against tp = 1), and the golden case's rule.
RUN_RULE = {"margin": 0.06, "max_diverged": 0.10}
GOLDEN_RULE = {"margin": 1e-3, "max_diverged": 0.0}


class BadInput(Exception):
    pass


def golden_requests(path, batch):
    """The requests of a golden expected.json: the requests.json beside it, or placeholders when absent."""
    req_path = os.path.join(os.path.dirname(os.path.abspath(path)), "requests.json")
    if not os.path.exists(req_path):
        return [None] * batch
    with open(req_path) as f:
        reqs = json.load(f)
    if len(reqs) != batch:
        raise BadInput(f"{req_path} has {len(reqs)} requests, {path} has {batch}")
    return reqs


def load(path):
    """(steps, golden): every step's requests with ids / conf / margin, and whether path is a golden case."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise BadInput(f"cannot read {path}: {e.strerror}")
    try:
        try:
            one = json.loads(text)
        except json.JSONDecodeError:
            return [json.loads(line) for line in text.splitlines() if line.strip()], False
        if not isinstance(one, dict) or "ids" not in one:
            raise BadInput(f"{path}: neither drafts JSON lines nor a JSON object with ids / conf / margin")
        golden = "requests" not in one
        reqs = one["requests"] if not golden else golden_requests(path, len(one["ids"]))
        out = []
        for b, q in enumerate(reqs):
            key = {"slot": q["slot"], "token": q["token"], "pos": q["pos"]} if q else {}
            out.append({**key, "ids": one["ids"][b], "conf": one["conf"][b], "margin": one["margin"][b]})
        return [{"step": 0, "requests": out}], golden
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: invalid JSON: {e}")
    except (KeyError, IndexError, TypeError) as e:
        raise BadInput(f"{path}: missing or malformed field {e}")


def compare(a, b, margin, conf_tol):
    """(compared positions, agreeing positions, requests, mismatches), or a reason the runs cannot be compared."""
    if len(a) != len(b):
        return f"{len(a)} steps against {len(b)}"
    compared = agreed = requests = 0
    mismatches = []
    for sa, sb in zip(a, b):
        if len(sa["requests"]) != len(sb["requests"]):
            return f"step {sa['step']}: {len(sa['requests'])} requests against {len(sb['requests'])}"
        for ra, rb in zip(sa["requests"], sb["requests"]):
            requests += 1
            keys = [k for k in ("slot", "token", "pos") if k in ra and k in rb]
            if any(ra[k] != rb[k] for k in keys):
                who = lambda r: " ".join(f"{k} {r[k]}" for k in keys)
                return f"step {sa['step']}: the requests differ ({who(ra)} / {who(rb)}): not the same inputs"
            for j in range(len(ra["ids"])):
                if ra["margin"][j] <= margin:
                    break
                compared += 1
                same = ra["ids"][j] == rb["ids"][j] and abs(ra["conf"][j] - rb["conf"][j]) <= conf_tol
                if same:
                    agreed += 1
                    continue
                mismatches.append((sa["step"], ra.get("slot", requests - 1), j, ra["ids"][j], rb["ids"][j],
                                   ra["margin"][j], ra["conf"][j], rb["conf"][j]))
                break  # later positions follow another token
    return compared, agreed, requests, mismatches


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference", help="the reference run (its margins select the compared positions)")
    ap.add_argument("other")
    ap.add_argument("--margin", type=float, help=f"near-tie threshold (default {RUN_RULE['margin']}; golden "
                    f"{GOLDEN_RULE['margin']})")
    ap.add_argument("--conf-tol", type=float, default=2e-2, help="confidence tolerance (default 0.02)")
    ap.add_argument("--max-diverged", type=float, help="share of requests allowed to differ (default "
                    f"{RUN_RULE['max_diverged']}; golden {GOLDEN_RULE['max_diverged']})")
    args = ap.parse_args()
    try:
        a, golden = load(args.reference)
        b, _ = load(args.other)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rule = GOLDEN_RULE if golden else RUN_RULE
    margin = rule["margin"] if args.margin is None else args.margin
    max_diverged = rule["max_diverged"] if args.max_diverged is None else args.max_diverged
    result = compare(a, b, margin, args.conf_tol)
    if isinstance(result, str):
        print(f"FAIL: {result}")
        return 1
    compared, agreed, requests, mismatches = result
    for m in mismatches:
        print("step {} slot {} position {}: {} vs {} (margin {:.4f}, conf {:.4f} vs {:.4f})".format(*m))
    share = len(mismatches) / max(requests, 1)
    ok = compared > 0 and share <= max_diverged
    print(f"{'PASS' if ok else 'FAIL'}: {agreed} of {compared} positions outside near-ties (margin > {margin:g}) "
          f"agree; {len(mismatches)} of {requests} requests diverge ({share:.1%}, allowed {max_diverged:.1%})"
          + ("" if compared > 0 else "; nothing to compare"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
