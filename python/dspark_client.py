"""Python binding of the dspark client (``client/dspark_client.h``), over ctypes: no compiled extension.

An inference engine (the *host*) attaches to a dspark worker (over its Unix socket) and sends steps: slot
resets, context rows (one token's tapped hidden states each, ``taps * H`` bf16 values) and a batch of draft
requests, answered with ``k`` draft tokens per request, their confidences and margins::

    from dspark_client import Client

    with Client(timeout_ms=5000) as c:              # the default ring.name, /dspark-<uid>
        m = c.model()
        c.context(0, 0, rows)                      # rows: [n, taps * H] float32 or uint16 bf16 bits
        d = c.draft([(0, token, n)])               # (slot, anchor token, anchor position[, low[, k']])
        print(d.ids, d.conf)                       # [1, k] int32 and float32 arrays
        s = c.draft([(0, token, n)], sampling=[Sampling(0.8, seed=7, distribution=True)])
        print(s.q, s.distribution_at(0, 0))        # q(tok) [1, k]; the whole q_0 over the vocabulary

The shared library is found through the environment variable ``DSPARK_CLIENT_LIB`` (a path to
``libdspark_client.so``), else in the repository's ``build/client/`` (this file in the source tree), else
where the dynamic loader finds ``libdspark_client.so`` (an installed client, ``ldconfig``). Needs python3 and
numpy only (``python/requirements.txt``); ``pip install ./python`` installs it as the package
``dspark-client``.

Threads: one thread at a time per Client (as the C handle). ctypes releases the GIL during each call, so other
Python threads run while a call waits for the worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import operator
import os
import pathlib
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

# What the calls take: a draft request (slot, token, pos[, low[, k'[, accepted]]]), a context send (slot,
# first_pos, rows), and context rows (floats, uint16 bf16 bits or ml_dtypes.bfloat16).
DraftRequestLike = Sequence[Optional[int]]
Rows = npt.ArrayLike
ContextSend = tuple[int, int, Rows]

__all__ = [
    "Client", "DSparkError", "DraftResult", "ModelInfo", "Sampling", "to_bf16", "from_bf16", "load_library",
    "default_ring_name", "protocol_version",
    "OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL",
]

# Status codes (dspark_status).
OK = 0
INVALID_ARGUMENT = 1
RESOURCE_EXHAUSTED = 2
UNAVAILABLE = 3
INTERNAL = 4
_STATUS_NAMES = {OK: "OK", INVALID_ARGUMENT: "INVALID_ARGUMENT", RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
                 UNAVAILABLE: "UNAVAILABLE", INTERNAL: "INTERNAL"}
_WORKER_STATES = {0: "starting", 1: "serving", 2: "draining", 3: "unhealthy", 4: "stopped"}


class DSparkError(Exception):
    """A call that did not return OK: ``status`` is the dspark status code, ``message`` the reason."""

    def __init__(self, status: int, message: str) -> None:
        """Keeps the status code and the reason; str() shows both."""
        self.status = int(status)
        self.message = message
        super().__init__(f"{self.status_name}: {message}")

    @property
    def status_name(self) -> str:
        """The status as text, e.g. ``"UNAVAILABLE"``."""
        return _STATUS_NAMES.get(self.status, f"status {self.status}")


# ---- bf16 conversion (raw bits in uint16, as the wire carries them)

def to_bf16(values: npt.ArrayLike) -> np.ndarray:
    """Float values (any shape; cast to float32 first) -> uint16 bf16 bits, rounding to nearest even.

    NaN stays a quiet NaN of the same sign; values past the bf16 range round to infinity. Matches the worker's
    ``float_to_bf16``.
    """
    f = np.asarray(values, dtype=np.float32)  # keeps the shape (0-d for a scalar); same-size view needs no copy
    u = f.view(np.uint32)
    nan = (u & 0x7F800000) == 0x7F800000
    nan &= (u & 0x007FFFFF) != 0
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16  # uint32 wraps only for NaN, handled below
    bits = np.where(nan, (u >> 16) | 0x40, rounded)
    return bits.astype(np.uint16)


def from_bf16(bits: npt.ArrayLike) -> np.ndarray:
    """uint16 bf16 bits (any shape) -> float32 values (exact)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).astype(np.uint32).view(np.float32)


# ---- the C structs

# The most target layers a model taps (the worker's config refuses more).
MAX_TAPPED_LAYERS = 16

# dspark_model_info's weight format codes (DSPARK_FORMAT_*).
FORMAT_NAMES = {0: "dense", 1: "fp8_block", 2: "fp4", 3: "exl3"}


class ModelInfo(ctypes.Structure):
    """What attach returned (dspark_model_info): vocab_size, hidden, taps, row_bytes, block_size (k), window (W),
    slots, max_batch, max_context_rows, tp, max_model_len, weight_formats (a bit per format code of the loaded
    linear weights), head_format (the head's code: 1, fp8_block, when re-quantised at load); and, from
    dspark_model_taps, tapped_layers (the target layers whose streams make a row's taps, in row order) and
    noise_token (the token that fills block positions 1..k-1)."""

    tapped_layers = ()
    noise_token = -1

    _fields_ = [("vocab_size", ctypes.c_uint32), ("hidden", ctypes.c_uint32), ("taps", ctypes.c_uint32),
                ("row_bytes", ctypes.c_uint32), ("block_size", ctypes.c_uint32), ("window", ctypes.c_uint32),
                ("slots", ctypes.c_uint32), ("max_batch", ctypes.c_uint32),
                ("max_context_rows", ctypes.c_uint32), ("tp", ctypes.c_uint32),
                ("max_model_len", ctypes.c_int64), ("weight_formats", ctypes.c_uint32),
                ("head_format", ctypes.c_uint32)]

    @property
    def format_names(self) -> list[str]:
        """The names of the formats in weight_formats."""
        return [name for code, name in FORMAT_NAMES.items() if self.weight_formats & (1 << code)]

    @property
    def row_values(self) -> int:
        """bf16 values per context row (taps * H)."""
        return self.row_bytes // 2

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        d = {name: getattr(self, name) for name, _ in self._fields_}
        d["tapped_layers"] = list(self.tapped_layers)
        d["noise_token"] = self.noise_token
        return d

    def __repr__(self) -> str:
        """All fields, for printing."""
        return "ModelInfo(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items()) + ")"


class _DraftRequest(ctypes.Structure):
    """dspark_draft_request."""

    _fields_ = [("slot", ctypes.c_int32), ("token", ctypes.c_int32), ("pos", ctypes.c_int32),
                ("low", ctypes.c_int32), ("outputs", ctypes.c_int32), ("has_accepted", ctypes.c_int32),
                ("accepted", ctypes.c_int32)]


SAMPLE_DISTRIBUTION = 1  # DSPARK_SAMPLE_DISTRIBUTION


class Sampling:
    """How one request drafts (SPEC §4, "Sampled drafts"): ``temperature`` 0 is the greedy draft; above 0 (up to
    the worker's max_temperature, 100) each token is drawn from the Markov-biased softmax over temperature with
    Gumbel noise of ``seed`` (the same seed and context draw the same tokens, at any tp). ``distribution``:
    the answer also carries the request's whole draft distribution at every position j < k' (for exact
    rejection sampling; at most ``Client.sampling_limits()["max_distributions"]`` requests per step)."""

    __slots__ = ("temperature", "seed", "distribution")

    def __init__(self, temperature: float = 0.0, seed: int = 0, distribution: bool = False) -> None:
        """See the class doc; seed is an unsigned 64-bit integer."""
        self.temperature = float(temperature)
        self.seed = _int(seed, "sampling: seed", 0, 2**64 - 1)
        self.distribution = bool(distribution)

    def __repr__(self) -> str:
        """The fields, for printing."""
        return f"Sampling(temperature={self.temperature}, seed={self.seed}, distribution={self.distribution})"


class _Sampling(ctypes.Structure):
    """dspark_sampling."""

    _fields_ = [("temperature", ctypes.c_float), ("flags", ctypes.c_uint32), ("seed", ctypes.c_uint64)]


class _SampledOutput(ctypes.Structure):
    """dspark_sampled_output."""

    _fields_ = [("q", ctypes.POINTER(ctypes.c_float)), ("distribution", ctypes.POINTER(ctypes.c_float)),
                ("distribution_rows", ctypes.POINTER(ctypes.c_int32)), ("distribution_capacity", ctypes.c_uint32),
                ("distributions", ctypes.POINTER(ctypes.c_uint32))]


class _ContextBlock(ctypes.Structure):
    """dspark_context_block."""

    _fields_ = [("slot", ctypes.c_int32), ("first_pos", ctypes.c_int32), ("rows", ctypes.c_int32),
                ("data", ctypes.c_void_p)]


class _DraftOutput(ctypes.Structure):
    """dspark_draft_output: NULL pointers skip an array."""

    _fields_ = [("ids", ctypes.POINTER(ctypes.c_int32)), ("conf", ctypes.POINTER(ctypes.c_float)),
                ("conf_logit", ctypes.POINTER(ctypes.c_float)), ("margin", ctypes.POINTER(ctypes.c_float))]


class _Stats(ctypes.Structure):
    """dspark_stats."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("steps", "failed_steps", "rejected_messages", "drafts",
                                                "context_rows", "resets", "hosts_attached", "hosts_lost")] + \
               [(n, ctypes.c_double) for n in ("step_us_p50", "step_us_p99", "step_us_max")] + \
               [("hosts_refused", ctypes.c_uint64)]


_HOT_UNCACHED_TOKENS = 8  # DSPARK_HOT_UNCACHED_TOKENS


class _ServingStats(ctypes.Structure):
    """dspark_serving_stats."""

    _fields_ = [(n, ctypes.c_uint64) for n in ("acceptance_reports", "accepted_tokens", "markov_lookups",
                                                "markov_hits")] + \
               [("hot_uncached", ctypes.c_uint32), ("hot_tokens", ctypes.c_int32 * _HOT_UNCACHED_TOKENS),
                ("hot_seen", ctypes.c_uint64 * _HOT_UNCACHED_TOKENS)]


class _Health(ctypes.Structure):
    """dspark_health."""

    _fields_ = [("state", ctypes.c_uint32), ("tp", ctypes.c_uint32), ("steps", ctypes.c_uint64),
                ("failed_in_a_row", ctypes.c_uint32)]


class DraftResult:
    """The answer of a draft batch of n requests: ``ids`` (int32), ``conf``, ``conf_logit``, ``margin`` and ``q``
    (float32), each an array [n, k], and ``outputs`` (int32 [n]): each request's k', the number of its
    leading positions that hold drafts. Positions past a request's k' are 0 (0 is also a token id: read
    ``ids[i, :outputs[i]]``); margins are 0 when not asked for. ``q`` is the drafted token's probability under
    the draft distribution (1 for a greedy request). The whole distributions asked for (Sampling's
    ``distribution``) are the rows of ``distribution`` (float32 [rows, vocab]): row r is request
    ``distribution_rows[r] // k`` at position ``distribution_rows[r] % k``; ``distribution_at(i, j)`` finds one."""

    __slots__ = ("ids", "conf", "conf_logit", "margin", "q", "outputs", "distribution", "distribution_rows")

    def __init__(self, n: int, k: int, outputs: Optional[npt.ArrayLike] = None, distribution_rows: int = 0,
                 vocab: int = 0) -> None:
        """Zeroed arrays for n requests of k outputs; `outputs`: each request's k' (None: k for all); room for
        `distribution_rows` whole distributions of `vocab` values."""
        self.outputs = np.full(n, k, dtype=np.int32) if outputs is None else np.asarray(outputs, dtype=np.int32)
        self.ids = np.zeros((n, k), dtype=np.int32)
        self.conf = np.zeros((n, k), dtype=np.float32)
        self.conf_logit = np.zeros((n, k), dtype=np.float32)
        self.margin = np.zeros((n, k), dtype=np.float32)
        self.q = np.zeros((n, k), dtype=np.float32)
        self.distribution = np.zeros((distribution_rows, vocab), dtype=np.float32)
        self.distribution_rows = np.zeros(distribution_rows, dtype=np.int32)

    def distribution_at(self, i: int, j: int) -> Optional[np.ndarray]:
        """Request i's whole draft distribution at position j ([vocab] float32), or None when not asked for."""
        cell = i * self.ids.shape[1] + j
        hit = np.flatnonzero(self.distribution_rows == cell)
        return self.distribution[hit[0]] if hit.size else None

    def _sampled(self, count):
        """The C sampled-output struct pointing into these arrays; `count` receives the rows answered."""
        return _SampledOutput(self.q.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                              self.distribution.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                              self.distribution_rows.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                              self.distribution_rows.size, ctypes.pointer(count))

    def _keep_rows(self, count):
        """Drops the room past the `count` rows answered."""
        self.distribution = self.distribution[:count]
        self.distribution_rows = self.distribution_rows[:count]

    def _out(self):
        """The C output struct pointing into these arrays."""
        def p(a, t):
            return a.ctypes.data_as(ctypes.POINTER(t))
        return _DraftOutput(p(self.ids, ctypes.c_int32), p(self.conf, ctypes.c_float),
                            p(self.conf_logit, ctypes.c_float), p(self.margin, ctypes.c_float))

    def __len__(self) -> int:
        """The number of requests."""
        return self.ids.shape[0]

    def drafts(self, i: int) -> np.ndarray:
        """Request i's drafted ids: the first outputs[i] of its row."""
        return self.ids[i, :self.outputs[i]]

    def __repr__(self) -> str:
        """The ids and confidences, for printing."""
        return (f"DraftResult(ids={self.ids.tolist()}, conf={np.round(self.conf, 4).tolist()}, "
                f"outputs={self.outputs.tolist()})")


# ---- the library

_lib = None


def _default_library_path():
    """build/client/libdspark_client.so of the repository this file lives in."""
    return pathlib.Path(__file__).resolve().parent.parent / "build" / "client" / "libdspark_client.so"


def load_library(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads libdspark_client.so once: `path`, else $DSPARK_CLIENT_LIB, else the repository's build/client/,
    else the dynamic loader's search path."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    path = path or os.environ.get("DSPARK_CLIENT_LIB")
    if not path and _default_library_path().exists():
        path = str(_default_library_path())
    if not path:
        path = ctypes.util.find_library("dspark_client")
        if not path:
            raise FileNotFoundError("dspark client library not found: set DSPARK_CLIENT_LIB to libdspark_client.so, "
                                    "build the dspark_client target in the repository's build/, or install the "
                                    "client (docs/clients.md)")
    elif not os.path.exists(path):
        raise FileNotFoundError(f"dspark client library not found at {path}: build the dspark_client target or "
                                "set DSPARK_CLIENT_LIB to libdspark_client.so")
    lib = ctypes.CDLL(path)
    S, P, u32, i32, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_int64
    sigs = {
        "dspark_attach": (S, [ctypes.c_char_p, i32, ctypes.POINTER(P)]),
        "dspark_attach_as": (S, [ctypes.c_char_p, u32, i32, ctypes.POINTER(P)]),
        "dspark_detach": (None, [P]),
        "dspark_last_error": (ctypes.c_char_p, [P]),
        "dspark_status_name": (ctypes.c_char_p, [S]),
        "dspark_set_timeout": (S, [P, i32]),
        "dspark_model": (S, [P, ctypes.POINTER(ModelInfo)]),
        "dspark_model_taps": (S, [P, ctypes.POINTER(i32), u32, ctypes.POINTER(u32), ctypes.POINTER(i32)]),
        "dspark_reset": (S, [P, ctypes.POINTER(i32), u32]),
        "dspark_context": (S, [P, i32, i32, P, i32]),
        "dspark_draft": (S, [P, ctypes.POINTER(_DraftRequest), u32, ctypes.c_int, _DraftOutput]),
        "dspark_step": (S, [P, ctypes.POINTER(i32), u32, ctypes.POINTER(_ContextBlock), u32,
                            ctypes.POINTER(_DraftRequest), u32, ctypes.c_int, _DraftOutput]),
        "dspark_step_sampled": (S, [P, ctypes.POINTER(i32), u32, ctypes.POINTER(_ContextBlock), u32,
                                    ctypes.POINTER(_DraftRequest), ctypes.POINTER(_Sampling), u32, ctypes.c_int,
                                    _DraftOutput, _SampledOutput]),
        "dspark_sampling_limits": (S, [P, ctypes.POINTER(u32), ctypes.POINTER(ctypes.c_float)]),
        "dspark_set_max_model_len": (S, [P, i64]),
        "dspark_stats_get": (S, [P, ctypes.POINTER(_Stats)]),
        "dspark_serving_stats_get": (S, [P, ctypes.POINTER(_Stats), ctypes.POINTER(_ServingStats)]),
        "dspark_health_get": (S, [P, ctypes.POINTER(_Health)]),
        "dspark_protocol_version": (u32, []),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    _lib = lib
    return lib


# Every integer crosses into C through a fixed-width field, which ctypes and numpy would wrap silently
# (2**32 + 5 becomes 5): each is checked to fit first, and refused naming the field.
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _int(value, what, lo=INT32_MIN, hi=INT32_MAX):
    """`value` as a Python int in [lo, hi]; DSparkError(INVALID_ARGUMENT) naming `what` otherwise. Integers
    only (Python or numpy ints): a float or a bool is refused rather than truncated."""
    if isinstance(value, (bool, np.bool_)):
        raise DSparkError(INVALID_ARGUMENT, f"{what} {value!r} is not an integer")
    try:
        v = operator.index(value)
    except TypeError:
        raise DSparkError(INVALID_ARGUMENT, f"{what} {value!r} is not an integer") from None
    if not lo <= v <= hi:
        raise DSparkError(INVALID_ARGUMENT, f"{what} {v} outside [{lo}, {hi}]")
    return v


def _int32_array(values, what):
    """A contiguous int32 array of `values` (1-D), each checked by _int (named `what[i]`)."""
    items = np.asarray(values, dtype=object).reshape(-1).tolist()
    _int(len(items), f"{what}: count", 0, UINT32_MAX)
    return np.array([_int(v, f"{what}[{i}]") for i, v in enumerate(items)], dtype=np.int32)


_REQUEST_FIELDS = ("slot", "token", "pos", "low", "outputs", "accepted")


def _requests(requests):
    """Draft requests -> a ctypes array. Each request is (slot, token, pos[, low[, outputs[, accepted]]]): low -1
    takes the default window, outputs (k') 0 means k, accepted reports how many tokens of the slot's previous
    draft the target accepted (None or -1: no report). Accepts a sequence of tuples or an int array [n, 3..6]."""
    rows = requests.tolist() if isinstance(requests, np.ndarray) else list(requests)
    _int(len(rows), "draft requests: count", 0, UINT32_MAX)
    arr = (_DraftRequest * len(rows))()
    for i, r in enumerate(rows):
        r = tuple(r)
        if not 3 <= len(r) <= 6:
            raise DSparkError(INVALID_ARGUMENT, f"draft request {i}: (slot, token, pos[, low[, outputs[, "
                                                f"accepted]]]), got {len(r)} values")
        if len(r) == 6 and r[5] is None:
            r = r[:5]
        v = [_int(x, f"draft request {i}: {name}") for name, x in zip(_REQUEST_FIELDS, r)]
        v += [-1, 0, -1][len(v) - 3:]  # low, outputs and accepted's defaults
        if v[5] < -1:
            raise DSparkError(INVALID_ARGUMENT, f"draft request {i}: accepted {v[5]} (-1 or None: no report)")
        arr[i] = _DraftRequest(*v[:5], 1 if v[5] >= 0 else 0, max(v[5], 0))
    return arr, len(rows)


def _sampling(sampling, n):
    """Per-request Sampling (or None: greedy) -> a ctypes array of n, or None when every request is greedy."""
    if sampling is None:
        return None
    items = list(sampling)
    if len(items) != n:
        raise DSparkError(INVALID_ARGUMENT, f"{len(items)} sampling entries for {n} draft requests")
    arr = (_Sampling * n)()
    for i, s in enumerate(items):
        if s is None:
            s = Sampling()
        elif not isinstance(s, Sampling):
            raise DSparkError(INVALID_ARGUMENT, f"sampling {i}: a Sampling or None, got {type(s).__name__}")
        arr[i] = _Sampling(s.temperature, SAMPLE_DISTRIBUTION if s.distribution else 0, s.seed)
    return arr


def _timeout(timeout_ms, what="timeout_ms"):
    """A wait limit in milliseconds: an int in [0, INT32_MAX]."""
    return _int(timeout_ms, what, 0, INT32_MAX)


def _outputs(reqs, n, k):
    """Each request's k' (its outputs field; 0 means k)."""
    return np.array([reqs[i].outputs or k for i in range(n)], dtype=np.int32)


def _bf16_dtype():
    """ml_dtypes.bfloat16 when ml_dtypes is installed (optional), else None."""
    try:
        import ml_dtypes  # noqa: PLC0415 (optional dependency, looked up when rows arrive)
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def protocol_version(library: Optional[str] = None) -> int:
    """The host-interface protocol version this binding speaks: that of the loaded libdspark_client.so
    (``dspark_protocol_version()``). A worker that does not serve it refuses the attach with UNAVAILABLE, the
    message naming both versions (docs/clients.md, "Protocol versions")."""
    return int(load_library(library).dspark_protocol_version())


def default_ring_name() -> str:
    """The worker's default ``ring.name``: ``/dspark-<uid>`` of this user (docs/configuration.md)."""
    return f"/dspark-{os.getuid()}"


class Client:
    """An attached host: the Python face of one ``dspark_client`` handle.

    ``Client(name=None, timeout_ms=30000, worker_uid=None, attach_timeout_ms=None)`` attaches to the worker of ring
    name `name` (its config's ``ring.name``; None: the default, ``default_ring_name()``), waiting up to
    attach_timeout_ms for it to exist and serve (None: timeout_ms; a worker still loading its weights may need
    minutes); timeout_ms is each call's wait limit (set_timeout changes it). The worker must run as `worker_uid` (None: this process's effective
    uid; another user's worker is reached through ``ring.group``): a worker of another uid at that path is refused
    before anything is sent. Use it as a context
    manager (or call detach()). Every failure raises DSparkError; a dead or stuck worker raises it with
    status UNAVAILABLE instead of hanging.
    """

    def __init__(self, name: Optional[str] = None, timeout_ms: int = 30000, library: Optional[str] = None,
                 worker_uid: Optional[int] = None, attach_timeout_ms: Optional[int] = None) -> None:
        """Attaches (see the class doc); `library` overrides where libdspark_client.so is loaded from."""
        if name is None:
            name = default_ring_name()
        self._h = None  # before anything can raise: __del__ reads it
        timeout_ms = _timeout(timeout_ms)
        attach_ms = timeout_ms if attach_timeout_ms is None else _timeout(attach_timeout_ms, "attach_timeout_ms")
        uid = os.geteuid() if worker_uid is None else _int(worker_uid, "worker_uid", 0, 2**32 - 1)
        self._lib = load_library(library)
        handle = ctypes.c_void_p()
        status = self._lib.dspark_attach_as(name.encode(), uid, attach_ms, ctypes.byref(handle))
        if status != OK:
            raise DSparkError(status, self._lib.dspark_last_error(None).decode(errors="replace"))
        self._h = handle
        self.name = name
        self.protocol_version = int(self._lib.dspark_protocol_version())  # the version spoken on this attach
        self._check(self._lib.dspark_set_timeout(self._h, timeout_ms))
        self._model = self.model()

    # -- lifetime

    def __enter__(self) -> Client:
        """The client itself."""
        return self

    def __exit__(self, *exc: object) -> bool:
        """Detaches."""
        self.detach()
        return False

    def __del__(self) -> None:
        """Detaches a client that was not detached explicitly."""
        try:
            self.detach()
        except Exception:  # interpreter shutdown: the worker notices the stopped heartbeat anyway
            pass

    def detach(self) -> None:
        """Tells the worker this host leaves and frees the handle. Idempotent."""
        if self._h is not None:
            h, self._h = self._h, None
            self._lib.dspark_detach(h)

    @property
    def attached(self) -> bool:
        """False once detached."""
        return self._h is not None

    def set_timeout(self, timeout_ms: int) -> None:
        """Per-call wait limit in milliseconds (0 to 2**31 - 1); a call past it raises DSparkError(UNAVAILABLE)."""
        self._check(self._lib.dspark_set_timeout(self._handle(), _timeout(timeout_ms)))

    # -- calls

    def model(self) -> ModelInfo:
        """The model description (ModelInfo); max_model_len as last set through this client."""
        m = ModelInfo()
        self._check(self._lib.dspark_model(self._handle(), ctypes.byref(m)))
        ids = (ctypes.c_int32 * MAX_TAPPED_LAYERS)()
        n, noise = ctypes.c_uint32(), ctypes.c_int32()
        self._check(self._lib.dspark_model_taps(self._handle(), ids, MAX_TAPPED_LAYERS, ctypes.byref(n),
                                                ctypes.byref(noise)))
        m.tapped_layers = tuple(ids[: min(n.value, MAX_TAPPED_LAYERS)])
        m.noise_token = noise.value
        return m

    def reset(self, slots: Iterable[int]) -> None:
        """Resets the given slots (their context is forgotten)."""
        a = _int32_array(slots, "slots")
        self._check(self._lib.dspark_reset(self._handle(), a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                           a.size))

    def context(self, slot: int, first_pos: int, rows: Rows) -> None:
        """Context rows of `slot` at positions first_pos, first_pos + 1, ...

        `rows`: [n, taps * H], [n, taps, H] or flat whole rows, of uint16 bf16 bits, ``ml_dtypes.bfloat16``
        values (when ml_dtypes is installed), or floats (converted to bf16 with round-to-nearest-even). Sends
        larger than a message are split by the library.
        """
        slot, first_pos = _int(slot, "context: slot"), _int(first_pos, "context: first_pos")
        r = self._rows(rows, "context")
        self._check(self._lib.dspark_context(self._handle(), slot, first_pos, r.ctypes.data, r.shape[0]))

    def draft(self, requests: Union[Sequence[DraftRequestLike], np.ndarray], margins: bool = True,
              sampling: Optional[Sequence[Optional[Sampling]]] = None) -> DraftResult:
        """One draft batch; returns a DraftResult of [n, k] arrays.

        Each request is (slot, anchor token, anchor position[, window low (-1: default)[, k' (0: k)[, accepted]]]):
        accepted reports how many tokens of the slot's previous draft the target accepted (for the worker's
        acceptance metrics; None or -1: no report). `sampling`: one Sampling (or None: greedy) per request;
        None: every request greedy.
        """
        return self.step(requests=requests, margins=margins, sampling=sampling)

    def sampling_limits(self) -> dict[str, Union[int, float]]:
        """What a sampled draft may ask for: ``max_distributions`` (requests per step that may ask for their
        whole distribution) and ``max_temperature``."""
        n, t = ctypes.c_uint32(), ctypes.c_float()
        self._check(self._lib.dspark_sampling_limits(self._handle(), ctypes.byref(n), ctypes.byref(t)))
        return {"max_distributions": n.value, "max_temperature": t.value}

    def step(self, resets: Iterable[int] = (), contexts: Iterable[ContextSend] = (),
             requests: Union[Sequence[DraftRequestLike], np.ndarray] = (), margins: bool = True,
             sampling: Optional[Sequence[Optional[Sampling]]] = None) -> DraftResult:
        """Resets, then context sends, then one draft batch, in one round trip when they fit one message.

        `contexts` is a sequence of (slot, first_pos, rows) as for context(); `requests` and `sampling` as for
        draft(). Returns a DraftResult (n may be 0).
        """
        rs = _int32_array(resets, "resets")
        keep = []  # the converted rows stay alive through the call
        contexts = list(contexts)
        _int(len(contexts), "contexts: count", 0, UINT32_MAX)
        blocks = (_ContextBlock * len(contexts))()
        for i, (slot, first_pos, rows) in enumerate(contexts):
            what = f"context {i}"
            slot, first_pos = _int(slot, f"{what}: slot"), _int(first_pos, f"{what}: first_pos")
            r = self._rows(rows, what)
            keep.append(r)
            blocks[i] = _ContextBlock(slot, first_pos, r.shape[0], r.ctypes.data)
        reqs, n = _requests(requests)
        samp = _sampling(sampling, n)
        k = self._model.block_size
        outputs = _outputs(reqs, n, k)
        rows = sum(int(outputs[i]) for i in range(n) if samp is not None and samp[i].flags & SAMPLE_DISTRIBUTION)
        out = DraftResult(n, k, outputs, rows, self._model.vocab_size if rows else 0)
        count = ctypes.c_uint32()
        self._check(self._lib.dspark_step_sampled(
            self._handle(), rs.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), rs.size, blocks, len(contexts),
            reqs, samp, n, 1 if margins else 0, out._out(), out._sampled(count)))
        out._keep_rows(count.value)
        return out

    def set_max_model_len(self, max_model_len: int) -> None:
        """Lowers (or restores, up to the configured limit) the worker's max_model_len."""
        n = _int(max_model_len, "max_model_len", INT64_MIN, INT64_MAX)
        self._check(self._lib.dspark_set_max_model_len(self._handle(), n))

    def stats(self) -> dict[str, Any]:
        """The worker's counters and recent step latencies (microseconds) as a dict, with the acceptance
        reports (``acceptance_reports``, ``accepted_tokens``), the Markov bias cache's ``markov_lookups`` and
        ``markov_hits``, and ``hot_uncached``: the most seen previous tokens it does not hold, as (token,
        times seen) pairs, most seen first."""
        s, m = _Stats(), _ServingStats()
        self._check(self._lib.dspark_serving_stats_get(self._handle(), ctypes.byref(s), ctypes.byref(m)))
        d = {name: getattr(s, name) for name, _ in s._fields_}
        for name in ("acceptance_reports", "accepted_tokens", "markov_lookups", "markov_hits"):
            d[name] = getattr(m, name)
        n = min(m.hot_uncached, _HOT_UNCACHED_TOKENS)
        d["hot_uncached"] = [(m.hot_tokens[i], m.hot_seen[i]) for i in range(n)]
        return d

    def health(self) -> dict[str, Any]:
        """The worker's state (``state`` code and ``state_name``), tp, steps and failed steps in a row."""
        h = _Health()
        self._check(self._lib.dspark_health_get(self._handle(), ctypes.byref(h)))
        d = {name: getattr(h, name) for name, _ in h._fields_}
        d["state_name"] = _WORKER_STATES.get(h.state, "unknown")
        return d

    # -- helpers

    def _handle(self):
        """The C handle; raises once detached."""
        if self._h is None:
            raise DSparkError(INVALID_ARGUMENT, "the client is detached")
        return self._h

    def _check(self, status):
        """Raises DSparkError with the library's reason for any status but OK."""
        if status != OK:
            raise DSparkError(status, self._lib.dspark_last_error(self._h).decode(errors="replace"))

    def _rows(self, rows, what):
        """Context rows as a contiguous uint16 bf16 array [n, taps * H] (n checked to fit int32). The shape must
        be [n, taps * H], [n, taps, H] or 1-D whole rows: a row's values are not guessed from the element count
        alone."""
        a = np.asarray(rows)
        bf16 = _bf16_dtype()
        if a.dtype == np.uint16:
            bits = a
        elif bf16 is not None and a.dtype == bf16:
            bits = a.view(np.uint16)  # the same bits
        elif np.issubdtype(a.dtype, np.floating):
            bits = to_bf16(a)
        else:
            raise DSparkError(INVALID_ARGUMENT, f"{what}: rows of dtype {a.dtype}: pass uint16 bf16 bits, "
                                                "ml_dtypes.bfloat16 or floats")
        m = self._model
        per_row = m.row_values
        shapes = {1: bits.ndim == 1 and bits.size % per_row == 0,
                  2: bits.ndim == 2 and bits.shape[1] == per_row,
                  3: bits.ndim == 3 and bits.shape[1:] == (m.taps, m.hidden)}
        if not shapes.get(bits.ndim, False):
            want = f"[n, {per_row}] (taps * H), [n, {m.taps}, {m.hidden}] or 1-D whole rows of {per_row}"
            raise DSparkError(INVALID_ARGUMENT, f"{what}: rows of shape {list(bits.shape)}: expected {want}")
        _int(bits.size // per_row, f"{what}: rows")
        return np.ascontiguousarray(bits.reshape(-1, per_row))
