"""OpenBLAS threads for the batch-1 decode, chosen from its own measured step times.

A batch-1 step (``numpy_decode.py``) is ~250 small OpenBLAS calls, each split over all cores
and joined at a barrier. With one other busy process on a 2-core machine, one of the two
threads is often descheduled and every barrier waits for it: decode-1 ran 3x slower than
quiet (issue 18). Measured here (AMD EPYC family 26, AVX-512, 2 vCPUs, load average 5.3-5.6 from
other work, 64 tokens): 5.5-8.1 tok/s with 2 OpenBLAS threads against 17.8-24.5 with 1.
On a quiet machine 2 threads stream the weights faster, so no fixed count is right.

:class:`AdaptiveThreads` runs the current count and, every ``interval`` steps, a few steps of
the other one; it keeps whichever had the lower median step time. The interval doubles each
time the probe confirms the choice (up to :data:`MAX_INTERVAL`), and a change of load is
noticed within ~10 s. While nothing else is runnable (``/proc/loadavg``) the full count is not
probed against 1 at all: on a quiet machine the probes cost nothing (they cost decode-1 ~10%
there before this gate: 61.7 -> 54.6 tok/s, load 1.7, one run each). A user's
``OPENBLAS_NUM_THREADS`` is respected: then nothing adapts.

Outputs must not depend on the machine's load, so it adapts only where the thread count does
not change a bit: OpenBLAS splits a row's output columns over its threads, and where a
thread's share is not a multiple of its kernel's width the tail takes another summation path
(measured: x @ W bit-identical with 1 and 2 threads for 960, 1,024 and 4,864 columns, not for
1,000-1,008). :meth:`AdaptiveThreads.create` multiplies a random row by each of the model's
weights with both counts and adapts only if every result is identical.
"""

from __future__ import annotations

import ctypes
import os
import statistics
from collections import deque
from collections.abc import Sequence
from functools import cache

import numpy as np

PROBE_STEPS = 4  # steps of the other count per probe; the first warms its threads, not timed
FIRST_INTERVAL = 8
MAX_INTERVAL = 256  # ~10 s at 25 tok/s between probes on a steady machine
SWITCH_GAIN = 0.9  # the probe must be 10% faster to take over (step times jitter ~5%)


@cache
def _openblas() -> tuple[ctypes.CDLL, str] | None:
    """NumPy's OpenBLAS (already loaded) and its symbol pattern, or None where not found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()
                     and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", ""), ("openblas", "64_")):
            if hasattr(lib, f"{prefix}_set_num_threads{suffix}"):
                return lib, f"{prefix}_%s_num_threads{suffix}"
    return None


@cache
def _count_at_start(lib: ctypes.CDLL, pattern: str) -> int:
    """The thread count the process had when it first looked (OpenBLAS's own choice, from the
    cores): the count is process-wide, so an engine that ended on 1 thread under contention
    would otherwise leave every later engine of the process reading 1 and never adapting."""
    return int(getattr(lib, pattern % "get")())


class BlasThreads:
    """Get and set NumPy's OpenBLAS thread count."""

    def __init__(self, lib: ctypes.CDLL, pattern: str) -> None:
        self.full = _count_at_start(lib, pattern)
        self._set = getattr(lib, pattern % "set")
        self._set.argtypes = [ctypes.c_int]
        self._get = getattr(lib, pattern % "get")
        self.count = int(self._get())

    @classmethod
    def find(cls) -> BlasThreads | None:
        found = _openblas()
        return None if found is None else cls(*found)

    def set(self, n: int) -> None:
        if n != self.count:
            self._set(n)
            self.count = n


class AdaptiveThreads:
    """Around each batch-1 step: ``begin()`` sets the count, ``end(seconds)`` learns from it."""

    def __init__(self, blas: BlasThreads, choices: tuple[int, int]) -> None:
        self.blas = blas
        self.choices = choices  # (current, other)
        self.interval = FIRST_INTERVAL
        self.until_probe = FIRST_INTERVAL
        self.recent: deque[float] = deque(maxlen=8)  # the current count's last step times
        self.probe: list[float] = []
        self.probing = 0  # probe steps left
        self.switches = 0

    @classmethod
    def create(cls, weights: Sequence[np.ndarray]) -> AdaptiveThreads | None:
        """None where it cannot or must not adapt (a user's count, one core, no OpenBLAS, or a
        result of ``row @ w`` for a weight ``w`` that depends on the thread count)."""
        if os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("KVCLI_ADAPTIVE_BLAS") == "0":
            return None
        blas = BlasThreads.find()
        if blas is None or blas.full < 2:
            return None
        blas.set(blas.full)  # an earlier engine of this process may have left it at 1
        if not thread_invariant(blas, weights, 1):
            return None
        return cls(blas, (blas.full, 1))

    def begin(self) -> None:
        current, other = self.choices
        self.blas.set(other if self.probing else current)

    def end(self, seconds: float) -> None:
        if self.probing:
            self.probing -= 1
            if self.probing < PROBE_STEPS - 1:  # the first probe step wakes threads: not timed
                self.probe.append(seconds)
            if not self.probing:
                self._decide()
            return
        self.recent.append(seconds)
        self.until_probe -= 1
        if self.until_probe <= 0 and len(self.recent) >= 4:
            if self.choices[0] == 1 or others_running(self.blas.count):
                self.probing, self.probe = PROBE_STEPS, []
            else:  # nothing else runnable: the full count is the quiet machine's best
                self.until_probe = self.interval

    def _decide(self) -> None:
        if statistics.median(self.probe) < SWITCH_GAIN * statistics.median(self.recent):
            self.choices = (self.choices[1], self.choices[0])
            self.recent.clear()
            self.recent.extend(self.probe)
            self.interval = FIRST_INTERVAL
            self.switches += 1
        else:
            self.interval = min(2 * self.interval, MAX_INTERVAL)
        self.until_probe = self.interval


def others_running(own: int) -> bool:
    """Whether more threads are runnable than this step's own (``/proc/loadavg``'s running
    count, read in ~10 us; True where unknown, so the measurement decides)."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return running > own


def thread_invariant(blas: BlasThreads, weights: Sequence[np.ndarray], other: int) -> bool:
    """Whether ``row @ w`` is bit-identical with ``blas.count`` threads and with ``other`` for
    every weight (the kernel path depends on the shapes, not the values); the last weight is the
    output layer's, multiplied by a 1-row matrix as ``compute_logits`` does."""
    most = blas.count
    rng = np.random.default_rng(0)
    try:
        for w in weights:
            # The layers multiply a 1-D row, compute_logits a [1, in] matrix: one form each
            # (the logits weight is the largest: ~10 ms a product).
            row = rng.standard_normal((1, w.shape[0]) if w is weights[-1] else w.shape[0],
                                      dtype=np.float32)
            results = []
            for n in (most, other):
                blas.set(n)
                results.append(row @ w)
            if not np.array_equal(*results):
                return False
        return True
    finally:
        blas.set(most)
