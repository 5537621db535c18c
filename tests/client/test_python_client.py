"""Tests of python/dspark_client.py against the tests' fake worker process (tests/client/fake_worker_main.cpp).

Run by ctest with DSPARK_CLIENT_LIB and DSPARK_FAKE_WORKER set; exits 77 (skipped) without numpy or those.
"""

import ctypes
import math
import os
import pathlib
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping the Python client tests")
    sys.exit(77)

if not os.environ.get("DSPARK_FAKE_WORKER") or not os.environ.get("DSPARK_CLIENT_LIB"):
    print("DSPARK_FAKE_WORKER / DSPARK_CLIENT_LIB not set: skipping the Python client tests")
    sys.exit(77)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import dspark_client as dc  # noqa: E402

# The fake worker's model (tests/client/fake_worker.cpp: fake_model).
VOCAB, ROW_VALUES, K, SLOTS, MAX_BATCH, MAX_ROWS, MAX_LEN = 1000, 24, 5, 8, 4, 16, 512


def fake_draft(slot, token, pos, outputs, margins):
    """The fake worker's answer for one request (fake_draft in fake_worker.cpp), as [k] lists."""
    kk = outputs or K
    ids, conf, logit, margin = [], [], [], []
    for j in range(K):
        if j >= kk:
            ids.append(0), conf.append(0.0), logit.append(0.0), margin.append(0.0)
            continue
        ids.append((token * 31 + pos * 7 + slot * 3 + j) % VOCAB)
        lg = np.float32(0.5) * np.float32(slot + 1) - np.float32(0.25) * np.float32(j)
        logit.append(float(lg))
        conf.append(1.0 / (1.0 + math.exp(-float(lg))))
        margin.append(0.125 * (pos % 8) + j if margins else 0.0)
    return ids, conf, logit, margin


def bf16_reference(x):
    """Round-to-nearest-even float32 -> bf16 bits, one value at a time with struct (the test's oracle)."""
    (u,) = struct.unpack("<I", struct.pack("<f", x))
    if (u & 0x7F800000) == 0x7F800000 and (u & 0x007FFFFF):
        return (u >> 16) | 0x40
    lower, rest = u >> 16, u & 0xFFFF
    if rest > 0x8000 or (rest == 0x8000 and (lower & 1)):
        lower += 1
    return lower & 0xFFFF


def socket_path(name):
    """Where a worker serves ring name `name` (lib/host/socket_path.hpp, the default directory)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    directory = xdg + "/dspark" if xdg.startswith("/") else f"/tmp/dspark-{os.geteuid()}"
    return f"{directory}/{name.lstrip('/')}.sock"


class FakeWorker:
    """The fake worker process on a fresh segment name; stop() returns the context blocks it received."""

    def __init__(self, *args):
        self.name = f"/dspark-pytest-{os.getpid()}-{id(self)}"
        self.dump = tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name
        self.proc = subprocess.Popen([os.environ["DSPARK_FAKE_WORKER"], self.name, "--dump", self.dump, *args],
                                     stdout=subprocess.PIPE, text=True)
        for line in self.proc.stdout:  # log lines come first
            if line.strip() == "ready":
                break
        else:
            self.proc.kill()
            raise RuntimeError("the fake worker did not start")

    def stop(self):
        """Ends the process; returns [(slot, first_pos, rows, bits uint16 [rows, ROW_VALUES])]."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc.stdout.close()
        if not hasattr(self, "blocks"):
            self.blocks = []
            with open(self.dump) as f:
                for line in f:
                    v = [int(t) for t in line.split()]
                    self.blocks.append((v[0], v[1], v[2],
                                        np.array(v[3:], dtype=np.uint16).reshape(v[2], ROW_VALUES)))
            os.unlink(self.dump)
            try:
                os.unlink(socket_path(self.name))  # only left behind by a killed worker
            except FileNotFoundError:
                pass
        return self.blocks


class Bf16Test(unittest.TestCase):
    def test_round_to_nearest_even(self):
        specials = [0.0, -0.0, 1.0, -1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.0e38, -3.4e38,
                    float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45, 65504.0, 0.1]
        rng = np.random.default_rng(0)
        values = np.concatenate([np.array(specials, dtype=np.float32),
                                 rng.standard_normal(2000).astype(np.float32) * 10,
                                 rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
        got = dc.to_bf16(values)
        self.assertEqual(got.dtype, np.uint16)
        want = np.array([bf16_reference(float(x)) for x in values], dtype=np.uint16)
        np.testing.assert_array_equal(got, want)
        # Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        self.assertEqual(int(dc.to_bf16(np.float32(1 + 2**-8))), 0x3F80)
        self.assertEqual(int(dc.to_bf16(np.float32(1 + 3 * 2**-8))), 0x3F82)
        self.assertEqual(int(dc.to_bf16(np.float32(3.4e38))), 0x7F80)  # past the largest bf16: infinity
        self.assertEqual(int(dc.to_bf16(np.float32("nan"))) & 0x7FC0, 0x7FC0)

    def test_from_bf16_round_trip(self):
        bits = np.arange(0, 2**16, dtype=np.uint32).astype(np.uint16)
        f = dc.from_bf16(bits)
        self.assertEqual(f.dtype, np.float32)
        finite = ~np.isnan(f)
        np.testing.assert_array_equal(dc.to_bf16(f[finite]), bits[finite])


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.worker = FakeWorker()

    def tearDown(self):
        self.worker.stop()

    def test_model_health_stats(self):
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            m = c.model()
            self.assertEqual((m.vocab_size, m.row_values, m.block_size, m.max_context_rows, m.max_model_len),
                             (VOCAB, ROW_VALUES, K, MAX_ROWS, MAX_LEN))
            # The fake worker's formats (tests/client/fake_worker.cpp): dense and fp4 linears, an fp8 head.
            self.assertEqual(m.format_names, ["dense", "fp4"])
            self.assertEqual(dc.FORMAT_NAMES[m.head_format], "fp8_block")
            # Its taps (fake_taps): layers 7, 9, 8 in row order, noise token 998.
            self.assertEqual((m.tapped_layers, m.noise_token), ((7, 9, 8), 998))
            self.assertEqual(m.as_dict()["tapped_layers"], [7, 9, 8])
            h = c.health()
            self.assertEqual(h["state_name"], "serving")
            self.assertEqual(c.stats()["steps"], 0)
            c.set_max_model_len(100)
            self.assertEqual(c.model().max_model_len, 100)

    def test_draft_round_trip(self):
        reqs = [(0, 17, 40), (3, 999, 7, 2, 2), (7, 0, 0, -1, 1)]
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            for margins in (True, False):
                d = c.draft(reqs, margins=margins)
                self.assertEqual(d.ids.shape, (3, K))
                self.assertEqual(d.ids.dtype, np.int32)
                self.assertEqual(d.conf.dtype, np.float32)
                for i, r in enumerate(reqs):
                    ids, conf, logit, margin = fake_draft(r[0], r[1], r[2], r[4] if len(r) > 4 else 0, margins)
                    self.assertEqual(d.ids[i].tolist(), ids)
                    np.testing.assert_allclose(d.conf[i], conf, rtol=1e-6)
                    np.testing.assert_array_equal(d.conf_logit[i], np.array(logit, dtype=np.float32))
                    np.testing.assert_array_equal(d.margin[i], np.array(margin, dtype=np.float32))
                # Each request's k' (0 and a missing field mean k), and its drafts alone.
                self.assertEqual(d.outputs.tolist(), [K, 2, 1])
                self.assertEqual(d.drafts(1).tolist(), fake_draft(3, 999, 7, 2, margins)[0][:2])
                self.assertEqual(len(d.drafts(2)), 1)
            # An int array of requests works as well.
            d = c.draft(np.array([[1, 2, 3]], dtype=np.int64))
            self.assertEqual(d.ids[0].tolist(), fake_draft(1, 2, 3, 0, True)[0])
            self.assertEqual(c.step(requests=[(1, 2, 3, -1, 4)]).outputs.tolist(), [4])

    def test_sampled_drafts_carry_q_and_the_asked_distributions(self):
        """The fake's q: 1 greedy, 1 / (j + 2) sampled, 0 past k'; its distribution holds q at the drafted id and
        spreads the rest evenly (fake_q, fake_distribution in fake_worker.cpp)."""
        reqs = [(0, 17, 40), (3, 999, 7, 2, 2), (7, 0, 0)]
        sampling = [None, dc.Sampling(0.7, seed=11, distribution=True), dc.Sampling(1.5, seed=2**64 - 1)]
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            self.assertEqual(c.sampling_limits(), {"max_distributions": 2, "max_temperature": 100.0})
            d = c.draft(reqs, sampling=sampling)
            self.assertEqual(d.q.dtype, np.float32)
            np.testing.assert_array_equal(d.q[0], np.ones(K, dtype=np.float32))
            np.testing.assert_array_equal(d.q[1], np.array([1 / 2, 1 / 3, 0, 0, 0], dtype=np.float32))
            np.testing.assert_array_equal(d.q[2], np.array([1 / (j + 2) for j in range(K)], dtype=np.float32))
            self.assertEqual(d.distribution.shape, (2, VOCAB))
            self.assertEqual(d.distribution_rows.tolist(), [K, K + 1])  # request 1, positions 0 and 1
            ids = fake_draft(3, 999, 7, 2, True)[0]
            for j in range(2):
                q = np.float32(1 / (j + 2))
                want = np.full(VOCAB, (np.float32(1) - q) / np.float32(VOCAB - 1), dtype=np.float32)
                want[ids[j]] = q
                np.testing.assert_array_equal(d.distribution_at(1, j), want)
            self.assertIsNone(d.distribution_at(1, 2))
            self.assertIsNone(d.distribution_at(2, 0))
            # Greedy without sampling: q is 1 up to k', no distributions.
            g = c.step(requests=reqs)
            self.assertEqual(g.q[1].tolist(), [1, 1, 0, 0, 0])
            self.assertEqual(g.distribution.shape, (0, 0))
            # Refused with the reason: a wrong count, a distribution of a greedy draft, a temperature past the
            # limit, too many distributions, a seed that does not fit 64 bits.
            with self.assertRaises(dc.DSparkError) as e:
                c.draft(reqs, sampling=[None])
            self.assertIn("1 sampling entries for 3 draft requests", e.exception.message)
            with self.assertRaises(dc.DSparkError) as e:
                c.draft(reqs, sampling=[dc.Sampling(0, distribution=True), None, None])
            self.assertIn("needs a temperature > 0", e.exception.message)
            with self.assertRaises(dc.DSparkError) as e:
                c.draft(reqs, sampling=[dc.Sampling(float("nan")), None, None])
            self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
            self.assertIn("temperature is NaN", e.exception.message)
            with self.assertRaises(dc.DSparkError) as e:
                c.draft(reqs, sampling=[dc.Sampling(1, distribution=True)] * 3)
            self.assertEqual(e.exception.status, dc.RESOURCE_EXHAUSTED)
            with self.assertRaises(dc.DSparkError) as e:
                dc.Sampling(1, seed=2**64)
            self.assertIn("seed", e.exception.message)

    def test_row_shapes_are_checked_not_only_their_count(self):
        # The fake model's rows: taps 3 x H 8 = 24 values. [n, 24], [n, 3, 8] and flat whole rows are rows;
        # [6, 8] (the same 48 values) and [4, 12] are not.
        bits = np.arange(2 * ROW_VALUES, dtype=np.uint16).reshape(2, ROW_VALUES)
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            c.context(0, 0, bits)
            c.context(1, 0, bits.reshape(2, 3, 8))
            c.context(2, 0, bits.reshape(-1))
            for shape in [(6, 8), (4, 12), (2, 8, 3), (1, 2, 24)]:
                with self.assertRaises(dc.DSparkError) as e:
                    c.context(3, 0, bits.reshape(shape))
                self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
                self.assertIn(f"rows of shape {list(shape)}: expected [n, 24]", e.exception.message)
            with self.assertRaises(dc.DSparkError) as e:
                c.step(contexts=[(0, 2, bits.reshape(6, 8))])
            self.assertIn("context 0: rows of shape [6, 8]", e.exception.message)
            with self.assertRaises(dc.DSparkError) as e:
                c.context(3, 0, bits.astype(np.int32))
            self.assertIn("rows of dtype int32", e.exception.message)
        blocks = self.worker.stop()
        self.assertEqual(len(blocks), 3)
        for slot, first, rows, data in blocks:
            np.testing.assert_array_equal(data, bits, err_msg=f"slot {slot}")

    def test_ml_dtypes_bfloat16_rows_keep_their_bits(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed")
        values = np.array([[1.0, -2.5, 3.140625] * 8] * 2, dtype=np.float32)
        rows = values.astype(ml_dtypes.bfloat16)
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            c.context(0, 0, rows)
        ((_, _, _, data),) = self.worker.stop()
        np.testing.assert_array_equal(data, rows.view(np.uint16))
        np.testing.assert_array_equal(data, dc.to_bf16(values))

    def test_step_rows_arrive_as_bf16(self):
        rng = np.random.default_rng(1)
        f32 = rng.standard_normal((40, ROW_VALUES)).astype(np.float32)  # 40 rows: split into 16 + 16 + 8
        bits = rng.integers(0, 2**16, (3, ROW_VALUES), dtype=np.uint32).astype(np.uint16)
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            d = c.step(resets=[5], contexts=[(0, 0, f32), (1, 10, bits)], requests=[(0, 3, 40), (1, 4, 13)])
            self.assertEqual(d.ids.shape, (2, K))
            self.assertEqual(d.ids[1].tolist(), fake_draft(1, 4, 13, 0, True)[0])
            c.context(2, 0, bits.reshape(-1))  # flat input of whole rows
            s = c.stats()
            self.assertEqual(s["steps"], 4)
            # Version 6's part, as the fake worker fills it.
            self.assertEqual((s["acceptance_reports"], s["accepted_tokens"]), (3, 7))
            self.assertEqual((s["markov_lookups"], s["markov_hits"]), (20, 11))
            self.assertEqual(s["hot_uncached"], [(42, 9), (7, 4)])
            self.assertEqual(s["context_rows"], 46)
            self.assertEqual(s["resets"], 1)
        blocks = self.worker.stop()
        got = {}
        for slot, first, rows, data in blocks:
            got.setdefault(slot, []).append((first, data))
        slot0 = np.concatenate([d for _, d in sorted(got[0], key=lambda t: t[0])])
        np.testing.assert_array_equal(slot0, dc.to_bf16(f32))
        np.testing.assert_array_equal(got[1][0][1], bits)
        self.assertEqual([first for first, _ in got[0]], [0, 16, 32])

    def test_errors_raise_with_status(self):
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            with self.assertRaises(dc.DSparkError) as e:
                c.set_max_model_len(10**9)
            self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
            with self.assertRaises(dc.DSparkError) as e:
                c.draft([(0, 1, 2)] * (MAX_BATCH + 1))
            self.assertEqual(e.exception.status, dc.RESOURCE_EXHAUSTED)
            with self.assertRaises(dc.DSparkError) as e:
                c.context(0, 0, np.zeros(ROW_VALUES + 1, dtype=np.float32))
            self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
        with self.assertRaises(dc.DSparkError) as e:
            c.health()  # detached
        # The context manager detached: the next host attaches at once.
        with dc.Client(self.worker.name, timeout_ms=1000) as c2:
            self.assertTrue(c2.attached)

    def test_integers_that_do_not_fit_are_refused_naming_the_field(self):
        big = 2**32
        cases = [  # (call, the message's start); each value wraps to a valid one as int32 (2**32 + 1 -> 1)
            (lambda c: c.draft([(big, big + 17, big + 24)]), f"draft request 0: slot {big} outside"),
            (lambda c: c.draft([(0, big + 17, 24)]), f"draft request 0: token {big + 17} outside"),
            (lambda c: c.draft([(0, 1, big + 24)]), f"draft request 0: pos {big + 24} outside"),
            (lambda c: c.draft([(0, 1, 24), (0, 1, 24, big - 1)]), f"draft request 1: low {big - 1} outside"),
            (lambda c: c.draft([(0, 1, 24, -1, big + 1)]), f"draft request 0: outputs {big + 1} outside"),
            (lambda c: c.draft([(0, 1, -2**31 - 1)]), f"draft request 0: pos {-2**31 - 1} outside"),
            (lambda c: c.draft(np.array([[0, 1, 2**40]], dtype=np.int64)), "draft request 0: pos 1099511627776"),
            (lambda c: c.draft([(0, 1.5, 24)]), "draft request 0: token 1.5 is not an integer"),
            (lambda c: c.reset([1, big + 2]), f"slots[1] {big + 2} outside"),
            (lambda c: c.reset(np.array([2**63 - 1], dtype=np.int64)), f"slots[0] {2**63 - 1} outside"),
            (lambda c: c.reset([True]), "slots[0] True is not an integer"),
            (lambda c: c.context(big, 0, np.zeros(ROW_VALUES)), f"context: slot {big} outside"),
            (lambda c: c.context(0, big + 3, np.zeros(ROW_VALUES)), f"context: first_pos {big + 3} outside"),
            (lambda c: c.step(contexts=[(0, 0, np.zeros(ROW_VALUES)), (big + 1, 0, np.zeros(ROW_VALUES))]),
             f"context 1: slot {big + 1} outside"),
            (lambda c: c.step(contexts=[(0, -big, np.zeros(ROW_VALUES))]), f"context 0: first_pos {-big} outside"),
            (lambda c: c.step(resets=[big], requests=[(0, 1, 2)]), f"resets[0] {big} outside"),
            (lambda c: c.set_max_model_len(2**63), f"max_model_len {2**63} outside"),
            (lambda c: c.set_timeout(big + 100), f"timeout_ms {big + 100} outside [0, 2147483647]"),
            (lambda c: c.set_timeout(-1), "timeout_ms -1 outside [0, 2147483647]"),
        ]
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            for call, message in cases:
                with self.assertRaises(dc.DSparkError, msg=message) as e:
                    call(c)
                self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
                self.assertTrue(e.exception.message.startswith(message), (e.exception.message, message))
            self.assertEqual(c.stats()["steps"], 0)  # none of them reached the worker
            self.assertEqual(c.draft([(1, 2, 3)]).ids[0].tolist(), fake_draft(1, 2, 3, 0, True)[0])
        for t in (-5, 2**31):
            with self.assertRaises(dc.DSparkError) as e:
                dc.Client(self.worker.name, timeout_ms=t)
            self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
            self.assertIn(f"timeout_ms {t} outside", e.exception.message)

    def test_negative_timeout_is_refused_by_the_c_library(self):
        # The C API itself (what the binding's own check guards): dspark_set_timeout returns a status now.
        lib = dc.load_library()
        with dc.Client(self.worker.name, timeout_ms=5000) as c:
            self.assertEqual(lib.dspark_set_timeout(c._h, -1), dc.INVALID_ARGUMENT)
            self.assertIn("timeout_ms -1 is negative", lib.dspark_last_error(c._h).decode())
            self.assertEqual(lib.dspark_set_timeout(c._h, 100), dc.OK)
        handle = ctypes.c_void_p()
        self.assertEqual(lib.dspark_attach(self.worker.name.encode(), -1, ctypes.byref(handle)), dc.INVALID_ARGUMENT)
        self.assertIn("timeout_ms -1 is negative", lib.dspark_last_error(None).decode())

    def test_unavailable_instead_of_hanging(self):
        with self.assertRaises(dc.DSparkError) as e:
            dc.Client("/dspark-pytest-no-such-ring", timeout_ms=100)
        self.assertEqual(e.exception.status, dc.UNAVAILABLE)
        self.assertIn("no-such-ring", e.exception.message)

    def test_the_attach_wait_and_the_call_limit_are_separate(self):
        # A 300 ms attach wait ends the attach, whatever the per-call limit.
        t0 = time.monotonic()
        with self.assertRaises(dc.DSparkError) as e:
            dc.Client("/dspark-pytest-no-such-ring", timeout_ms=60000, attach_timeout_ms=300)
        self.assertEqual(e.exception.status, dc.UNAVAILABLE)
        self.assertLess(time.monotonic() - t0, 10)
        with self.assertRaises(dc.DSparkError) as e:
            dc.Client(self.worker.name, attach_timeout_ms=-1)
        self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
        self.assertIn("attach_timeout_ms -1", e.exception.message)
        # A long attach wait, then a 200 ms limit per call against a worker that never answers.
        w = FakeWorker("--no-answer")
        try:
            with dc.Client(w.name, timeout_ms=200, attach_timeout_ms=30000) as c:
                t0 = time.monotonic()
                with self.assertRaises(dc.DSparkError) as e:
                    c.draft([(0, 1, 2)])
                self.assertEqual(e.exception.status, dc.UNAVAILABLE)
                self.assertLess(time.monotonic() - t0, 10)
        finally:
            w.stop()

    def test_default_ring_name_is_per_user(self):
        # The worker's default ring.name: without a name the client attaches there (nothing serves it here).
        self.assertEqual(dc.default_ring_name(), f"/dspark-{os.getuid()}")
        if os.path.exists(socket_path(dc.default_ring_name())):
            self.skipTest("a worker serves the default ring on this host")
        with self.assertRaises(dc.DSparkError) as e:
            dc.Client(timeout_ms=100)
        self.assertEqual(e.exception.status, dc.UNAVAILABLE)
        self.assertIn(f"/dspark-{os.getuid()}", e.exception.message)


class WorkerOwnerTest(unittest.TestCase):
    def test_a_worker_of_another_uid_than_expected_is_refused(self):
        w = FakeWorker()
        try:
            with dc.Client(w.name, timeout_ms=5000, worker_uid=os.geteuid()) as c:
                self.assertEqual(c.draft([(0, 1, 2)]).ids.shape[0], 1)
            other = (os.geteuid() + 1) % 2**32
            with self.assertRaises(dc.DSparkError) as e:
                dc.Client(w.name, timeout_ms=1000, worker_uid=other)
            self.assertIn(f"runs as uid {os.geteuid()}, expected {other}", e.exception.message)
            for bad in (-1, 2**32, 1.5):
                with self.assertRaises(dc.DSparkError) as e:
                    dc.Client(w.name, timeout_ms=1000, worker_uid=bad)
                self.assertEqual(e.exception.status, dc.INVALID_ARGUMENT)
                self.assertIn("worker_uid", e.exception.message)
        finally:
            w.stop()


class HungWorkerTest(unittest.TestCase):
    def test_timeout_and_killed_worker(self):
        w = FakeWorker("--no-answer")
        try:
            c = dc.Client(w.name, timeout_ms=5000)
            c.set_timeout(200)
            with self.assertRaises(dc.DSparkError) as e:
                c.draft([(0, 1, 2)])
            self.assertEqual(e.exception.status, dc.UNAVAILABLE)
            c.set_timeout(30000)
            w.proc.kill()
            w.proc.wait()
            with self.assertRaises(dc.DSparkError) as e:
                c.draft([(0, 1, 2)])
            self.assertEqual(e.exception.status, dc.UNAVAILABLE)
            self.assertIn("gone", e.exception.message)
            c.detach()
        finally:
            w.stop()


class TypeHintsTest(unittest.TestCase):
    def test_every_public_call_is_annotated(self):
        """Every public function and method of the binding annotates its parameters and its return, and the
        annotations resolve (typing.get_type_hints)."""
        import inspect
        import typing
        calls = []
        for name in dc.__all__:
            obj = getattr(dc, name)
            if inspect.isclass(obj):
                calls += [(f"{name}.{m}", f) for m, f in vars(obj).items()
                          if inspect.isfunction(f) and (not m.startswith("_") or m == "__init__")]
            elif inspect.isfunction(obj):
                calls.append((name, obj))
        self.assertGreater(len(calls), 20)
        for name, f in calls:
            hints = typing.get_type_hints(f)
            params = [p for p in inspect.signature(f).parameters if p != "self"]
            missing = [p for p in params + ["return"] if p not in hints]
            self.assertEqual(missing, [], name)


class ProtocolVersionTest(unittest.TestCase):
    """docs/clients.md, "Protocol versions": the version this binding reports, and a worker of another one."""

    HEADER = pathlib.Path(__file__).resolve().parents[2] / "lib" / "host" / "protocol.hpp"

    def test_the_reported_version_is_the_headers(self):
        m = re.search(r"constexpr uint32_t kProtocolVersion = (\d+);", self.HEADER.read_text())
        self.assertIsNotNone(m)
        self.assertEqual(dc.protocol_version(), int(m.group(1)))
        self.assertEqual(dc.protocol_version(), 7)
        w = FakeWorker()
        try:
            with dc.Client(w.name, timeout_ms=5000) as c:
                self.assertEqual(c.protocol_version, 7)
        finally:
            w.stop()

    def test_a_worker_serving_another_version_refuses_naming_both(self):
        """A stand-in worker that serves only the next protocol version: it reads the hello and answers the
        frozen reply head (magic, version, admission, 256-byte reason) alone, as the rule says."""
        mine = dc.protocol_version()
        future = mine + 1
        name = f"/dspark-pytest-v{future}-{os.getpid()}"
        path = socket_path(name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        reason = f"the client speaks protocol version {mine}; this worker serves protocol version {future}"
        magic = 0x4B434F5353505344  # "DSPSSOCK"
        hellos = []
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as srv:
            srv.bind(path)
            srv.listen(1)

            def serve():
                conn, _ = srv.accept()
                with conn:
                    hellos.append(struct.unpack("<QII", conn.recv(64)))
                    conn.send(struct.pack("<QII256s", magic, future, 1, reason.encode()))

            t = threading.Thread(target=serve)
            t.start()
            try:
                with self.assertRaises(dc.DSparkError) as e:
                    dc.Client(name, timeout_ms=5000)
            finally:
                t.join(10)
                os.unlink(path)
        self.assertEqual(e.exception.status, dc.UNAVAILABLE)
        self.assertEqual(e.exception.message, f"attach {name}: {reason}")
        self.assertEqual(hellos, [(magic, mine, 1)])  # this client said its version, as a host


if __name__ == "__main__":
    unittest.main(verbosity=2)
