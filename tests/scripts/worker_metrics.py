#!/usr/bin/env python3
"""The worker's Prometheus endpoint (metrics.port, docs/operations.md "Metrics") read by a real HTTP client
(urllib) while a 2-rank CPU worker serves:
  after start-up: every counter at 0, the load series of ranks 0 and 1 within what the checkpoint holds;
  after `dspark_client bench`: the steps, drafts and context rows the bench reports sending, one step, draft
  and ring-wait observation per step, one host attached, no slot in use once it detached;
  through the Python client: exact inserts, draft batches, slots in use while attached, a reset, a rejected
  message, then a clean stop.
Usage: worker_metrics.py BUILD_DIR SOURCE_DIR (ctest sets DSPARK_CLIENT_LIB and PYTHONPATH); exits 77 without numpy.
"""

import os
import pathlib
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping the metrics scrape test")
    sys.exit(77)
import dspark_client as dc  # noqa: E402

build, src = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
work = pathlib.Path(tempfile.mkdtemp())
ring = f"/dspark-test-metrics-{os.getpid()}"
client = str(build / "apps" / "dspark_client")
worker = None


def fail(why):
    print(f"FAIL: {why}", file=sys.stderr)
    log = work / "worker.log"
    if log.exists():
        print("--- worker log\n" + log.read_text(errors="replace"), file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$')


def scrape(port):
    """The endpoint's samples as {(name, ((label, value), ...)): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        if r.status != 200:
            fail(f"GET /metrics answered {r.status}")
        kind = r.headers.get("Content-Type", "")
        if not kind.startswith("text/plain"):
            fail(f"GET /metrics: Content-Type {kind}, not the text format")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            fail(f"not a sample line of the text format: {line!r}")
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    if key not in samples:
        fail(f"no sample {name}{labels or ''}")
    return samples[key]


def expect(samples, name, want, **labels):
    got = value(samples, name, **labels)
    if got != want:
        fail(f"{name}{labels or ''} is {got}, expected {want}")


def settled(port, name, want, seconds=10):
    """The samples once `name` reads `want` (a detach reaches the worker after the client has returned)."""
    deadline = time.monotonic() + seconds
    while True:
        s = scrape(port)
        if value(s, name) == want or time.monotonic() > deadline:
            expect(s, name, want)
            return s
        time.sleep(0.05)


def checkpoint_data_bytes(ckpt):
    """Tensor bytes of the checkpoint's safetensors files (each file less its header)."""
    total = 0
    for f in ckpt.glob("*.safetensors"):
        with open(f, "rb") as fh:
            header = struct.unpack("<Q", fh.read(8))[0]
        total += f.stat().st_size - 8 - header
    return total


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def main():
    global worker
    ckpt = work / "ckpt"
    run(str(build / "apps" / "dspark_make_ckpt"), "--preset", "tiny", "--seed", "0", "--out", str(ckpt))
    port = free_port()
    cfg = (src / "configs" / "tiny-cpu.yaml").read_text()
    cfg = re.sub(r"(?m)^checkpoint:.*$", f"checkpoint: {ckpt}", cfg)
    cfg = re.sub(r"(?m)^ring:$", f"ring:\n  name: {ring}", cfg)
    cfg += f"metrics:\n  port: {port}\n"
    # The Markov bias cache holds anchors 5 and 9 (not 7), and writes the tokens it saw at shutdown.
    (work / "cache_tokens.txt").write_text("# the client's anchors\n5\n9\n")
    cfg += (f"markov_cache:\n  rows: 16\n  tokens_file: {work / 'cache_tokens.txt'}\n"
            f"  hot_tokens_file: {work / 'seen_tokens.txt'}\n")
    (work / "worker.yaml").write_text(cfg)

    log = open(work / "worker.log", "w")
    worker = subprocess.Popen(["mpirun", "-np", "2", str(build / "apps" / "dspark_worker"), str(work / "worker.yaml")],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if subprocess.run([client, "--ring", ring, "--worker-pid", str(worker.pid), "--timeout-ms", "60000", "health"],
                      capture_output=True).returncode != 0:
        fail("the worker did not serve")

    # Start-up: nothing counted yet; each rank's load.
    s = scrape(port)
    for name in ("dspark_drafts_total", "dspark_context_rows_total", "dspark_resets_total",
                 "dspark_rejected_messages_total", "dspark_hosts_attached_total", "dspark_slots_in_use"):
        expect(s, name, 0)
    expect(s, "dspark_steps_total", 0, status="OK")
    expect(s, "dspark_steps_total", 0, status="INTERNAL")
    expect(s, "dspark_step_duration_seconds_count", 0)
    expect(s, "dspark_slots", 8)  # configs/tiny-cpu.yaml
    data = checkpoint_data_bytes(ckpt)
    read = [value(s, "dspark_rank_load_read_bytes", rank=str(r)) for r in (0, 1)]
    # Each rank reads its shard: a part of the tensors, and together all of them (replicated ones twice).
    if not (0 < max(read) < data <= sum(read) < 2 * data):
        fail(f"ranks read {read} bytes of a checkpoint holding {data}")
    for r in ("0", "1"):
        if not 0 < value(s, "dspark_rank_load_seconds", rank=r) < 60:
            fail(f"rank {r}: load time {value(s, 'dspark_rank_load_seconds', rank=r)} s")
        if not 0 < value(s, "dspark_rank_weight_bytes", rank=r) <= data:
            fail(f"rank {r}: {value(s, 'dspark_rank_weight_bytes', rank=r)} weight bytes")
        if not value(s, "dspark_rank_peak_resident_bytes", rank=r) > value(s, "dspark_rank_weight_bytes", rank=r):
            fail(f"rank {r}: peak resident memory below its weights")
    if ("dspark_rank_load_seconds", (("rank", "2"),)) in s:
        fail("a load series for rank 2 of a 2-rank worker")
    # The CPU backend has no device: no device memory series (a GPU rank's is its device's memory in use).
    if any(name == "dspark_rank_device_memory_used_bytes" for name, _ in s):
        fail("a device memory series from CPU ranks")
    print(f"ok: start-up: counters at 0; ranks read {read[0]:.0f} + {read[1]:.0f} of {data} checkpoint bytes")

    # The bench: its own count of what it sent.
    steps = 30
    out = run(client, "--ring", ring, "bench", "--steps", str(steps), "--sequences", "3", "--prefill", "8")
    m = re.search(r"done: (\d+) steps in .*, (\d+) draft requests, (\d+) context rows sent", out)
    if not m or int(m.group(1)) != steps:
        fail(f"the bench did not report its {steps} steps:\n{out}")
    drafts, rows = int(m.group(2)), int(m.group(3))
    s = settled(port, "dspark_slots_in_use", 0)  # the bench detached: its slots were reset
    expect(s, "dspark_steps_total", steps, status="OK")
    expect(s, "dspark_steps_total", 0, status="INTERNAL")
    expect(s, "dspark_drafts_total", drafts)
    expect(s, "dspark_context_rows_total", rows)
    expect(s, "dspark_resets_total", 0)
    expect(s, "dspark_rejected_messages_total", 0)
    for h in ("dspark_step_duration_seconds", "dspark_draft_duration_seconds", "dspark_ring_wait_seconds"):
        expect(s, h + "_count", steps)  # every bench step drafts (3 sequences)
        expect(s, h + "_bucket", steps, le="+Inf")
    if not 0 < value(s, "dspark_draft_duration_seconds_sum") < value(s, "dspark_step_duration_seconds_sum"):
        fail("the draft time is not within the step time")
    expect(s, "dspark_hosts_attached_total", 1)
    print(f"ok: bench: {steps} steps, {drafts} drafts, {rows} context rows counted as sent")

    # The Python client: exact inserts and draft batches, slot use while attached.
    base = s
    rng = np.random.default_rng(0)
    with dc.Client(ring, timeout_ms=30000) as c:
        rv = c.model().row_values
        blocks = [(slot, 0, rng.standard_normal((4, rv), dtype=np.float32)) for slot in (0, 1, 2)]
        c.step(contexts=blocks, requests=[(0, 5, 4), (1, 7, 4)])
        c.step(requests=[(2, 9, 4)])
        s = scrape(port)
        expect(s, "dspark_slots_in_use", 3)
        expect(s, "dspark_steps_total", steps + 2, status="OK")
        expect(s, "dspark_drafts_total", drafts + 3)
        expect(s, "dspark_context_rows_total", rows + 12)
        # The first step's inserts run with its draft: observed as the draft.
        for h, more in (("dspark_insert_duration_seconds", 0), ("dspark_draft_duration_seconds", 2),
                        ("dspark_step_duration_seconds", 2), ("dspark_ring_wait_seconds", 2)):
            expect(s, h + "_count", value(base, h + "_count") + more)
        c.reset([1])
        try:
            c.draft([(99, 5, 4)])  # no slot 99 of 8: refused before any rank sees it
            fail("a draft for slot 99 was answered")
        except dc.DSparkError as e:
            if e.status_name != "INVALID_ARGUMENT":
                fail(f"a draft for slot 99: {e.status_name}, expected INVALID_ARGUMENT")
        s = scrape(port)
        expect(s, "dspark_slots_in_use", 2)
        expect(s, "dspark_resets_total", 1)
        expect(s, "dspark_steps_total", steps + 3, status="OK")
        expect(s, "dspark_rejected_messages_total", 1)
        # Acceptance reports on the drafts just answered (slots 0 and 2 drafted k' = k; slot 1 was reset, so its
        # report matches no draft), then a report above the k' = 3 of slot 0's new draft.
        k = c.model().block_size
        before = scrape(port)
        reqs = [(0, 5, 4, -1, 3, 2), (2, 9, 4, -1, 0, k), (1, 7, 4, -1, 0, 1)]
        r = c.draft(reqs)
        # Markov cache look-ups by hand: position j of request i looks up its anchor (j = 0) or output j - 1.
        lookups = hits = 0
        for i, req in enumerate(reqs):
            out = list(r.drafts(i))
            for j in range(len(out)):
                prev = req[1] if j == 0 else out[j - 1]
                lookups += 1
                hits += prev in (5, 9)
        if lookups != 3 + 2 * k:
            fail(f"{lookups} Markov positions drafted, expected {3 + 2 * k}")
        s = scrape(port)
        expect(s, "dspark_markov_cache_lookups_total", value(before, "dspark_markov_cache_lookups_total") + lookups)
        expect(s, "dspark_markov_cache_hits_total", value(before, "dspark_markov_cache_hits_total") + hits)
        # The stats answer (protocol version 6) says the same, and lists the hottest uncached tokens.
        st = c.stats()
        if (st["markov_lookups"], st["markov_hits"]) != (value(s, "dspark_markov_cache_lookups_total"),
                                                         value(s, "dspark_markov_cache_hits_total")):
            fail(f"stats say {st['markov_lookups']} look-ups and {st['markov_hits']} hits, the metrics differ")
        hot = st["hot_uncached"]
        counts = [n for _, n in hot]
        if not hot or any(t in (5, 9) for t, _ in hot) or counts != sorted(counts, reverse=True):
            fail(f"hottest uncached tokens {hot}: expected some, none of the cached 5 and 9, most seen first")
        c.draft([(0, 5, 4, -1, 0, 4)])
        s = scrape(port)
        expect(s, "dspark_acceptance_reports_total", 2, k=str(k), temperature="0")
        expect(s, "dspark_accepted_tokens_total", 2 + k, k=str(k), temperature="0")
        expect(s, "dspark_acceptance_reports_unmatched_total", 2)
        st = c.stats()
        if (st["acceptance_reports"], st["accepted_tokens"]) != (2, 2 + k):
            fail(f"stats say {st['acceptance_reports']} reports of {st['accepted_tokens']} tokens, "
                 f"expected 2 of {2 + k}")
        for j in range(k):  # by hand: report 2 reaches positions 0..2 and takes 0, 1; report k takes all
            reached = (1 if j <= 2 else 0) + 1
            taken = (1 if j < 2 else 0) + 1
            expect(s, "dspark_draft_position_reached_total", reached, k=str(k), temperature="0", position=str(j))
            expect(s, "dspark_draft_position_accepted_total", taken, k=str(k), temperature="0", position=str(j))
        # A sampled draft's report counts in its temperature class: slot 2 drafts k' = 2 at 0.8, then reports 1.
        c.draft([(2, 9, 4, -1, 2)], sampling=[dc.Sampling(0.8, seed=3)])
        c.draft([(2, 9, 4, -1, 0, 1)])
        s = scrape(port)
        expect(s, "dspark_acceptance_reports_total", 1, k="2", temperature="(0.5,1]")
        expect(s, "dspark_accepted_tokens_total", 1, k="2", temperature="(0.5,1]")
        for j in range(2):
            expect(s, "dspark_draft_position_reached_total", 1, k="2", temperature="(0.5,1]", position=str(j))
        expect(s, "dspark_draft_position_accepted_total", 1, k="2", temperature="(0.5,1]", position="0")
        expect(s, "dspark_acceptance_reports_total", 2, k=str(k), temperature="0")
    s = settled(port, "dspark_slots_in_use", 0)
    expect(s, "dspark_hosts_attached_total", 2)
    print("ok: python client: 3 inserts, 2 draft batches, 3 slots in use, a reset, a rejected message, "
          "acceptance by position and temperature class")

    observed = run(client, "--ring", ring, "stats")
    if "acceptance_reports 3\n" not in observed or "markov_cache_lookups " not in observed:
        fail(f"dspark_client stats (an observer) does not show acceptance and the cache:\n{observed}")
    run(client, "--ring", ring, "stop")
    if worker.wait(timeout=60) != 0:
        fail(f"mpirun exited {worker.returncode} after the stop")
    worker = None
    seen = [line.split() for line in (work / "seen_tokens.txt").read_text().splitlines() if not line.startswith("#")]
    ids = [int(t[0]) for t in seen]
    counts = [int(t[1]) for t in seen]
    if not {5, 7, 9} <= set(ids) or counts != sorted(counts, reverse=True):
        fail(f"the seen-tokens file lists {seen[:5]}...: expected 5, 7 and 9 among them, most seen first")
    if "Markov bias cache: 2 tokens of" not in (work / "worker.log").read_text():
        fail("the worker did not log its Markov bias cache")
    print("ok: Markov cache: look-ups and hits by hand, the seen-tokens file written at shutdown")
    print("PASS: metrics scraped over HTTP while the worker served")


try:
    main()
finally:
    if worker is not None and worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(work)])
