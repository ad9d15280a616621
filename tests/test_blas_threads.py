"""The batch-1 decode's OpenBLAS thread count follows measured step times (blas_threads.py)."""

from __future__ import annotations

import numpy as np
import pytest

from kvcli.model import blas_threads
from kvcli.model.blas_threads import MAX_INTERVAL, AdaptiveThreads, BlasThreads, thread_invariant


class FakeBlas:
    def __init__(self) -> None:
        self.count = 2

    def set(self, n: int) -> None:
        self.count = n


@pytest.fixture(autouse=True)
def busy_machine(monkeypatch):
    """Other threads runnable, so probes happen (the quiet gate has its own test)."""
    monkeypatch.setattr(blas_threads, "others_running", lambda own: True)


def run(tuner: AdaptiveThreads, seconds: dict[int, float], steps: int) -> list[int]:
    """Step ``steps`` times with the given step time per thread count; the counts used."""
    used = []
    for _ in range(steps):
        tuner.begin()
        used.append(tuner.blas.count)
        tuner.end(seconds[tuner.blas.count])
    return used


def test_contention_moves_to_one_thread_and_back() -> None:
    tuner = AdaptiveThreads(FakeBlas(), (2, 1))
    busy = run(tuner, {2: 0.150, 1: 0.045}, 200)  # one busy process: barriers wait
    assert busy[-100:].count(1) >= 90 and tuner.choices[0] == 1
    quiet = run(tuner, {2: 0.030, 1: 0.045}, 600)  # the other process ended
    assert tuner.choices[0] == 2 and quiet[-300:].count(2) >= 290


def test_quiet_machine_probes_rarely() -> None:
    tuner = AdaptiveThreads(FakeBlas(), (2, 1))
    used = run(tuner, {2: 0.030, 1: 0.045}, 3000)
    assert tuner.switches == 0 and tuner.interval == MAX_INTERVAL
    assert used[1000:].count(1) < 0.02 * 2000  # probes: ~1.5% of the steps, at 1.5x the time


def test_nothing_else_runnable_no_probes(monkeypatch) -> None:
    monkeypatch.setattr(blas_threads, "others_running", lambda own: False)
    tuner = AdaptiveThreads(FakeBlas(), (2, 1))
    assert run(tuner, {2: 0.030, 1: 0.020}, 500) == [2] * 500


def test_jitter_below_the_margin_does_not_switch() -> None:
    tuner = AdaptiveThreads(FakeBlas(), (2, 1))
    run(tuner, {2: 0.030, 1: 0.029}, 1000)
    assert tuner.switches == 0


def test_a_users_thread_count_wins(monkeypatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert AdaptiveThreads.create([np.zeros((4, 4), np.float32)]) is None


def test_a_new_engine_adapts_from_the_processs_full_count() -> None:
    """An engine that ended on 1 thread (contention) leaves OpenBLAS at 1 process-wide; the
    next engine's tuner starts from the count the process started with, not from that 1."""
    blas = BlasThreads.find()
    if blas is None or blas.full < 2:
        pytest.skip("NumPy's OpenBLAS not found, or one thread only")
    weights = [np.random.default_rng(2).standard_normal((576, 960), dtype=np.float32)]
    try:
        blas.set(1)  # what an earlier engine's last choice leaves behind
        tuner = AdaptiveThreads.create(weights)
        assert tuner is not None and tuner.choices == (blas.full, 1)
        assert BlasThreads.find().count == blas.full
    finally:
        blas.set(blas.full)


def test_adapts_only_where_the_count_changes_no_bit() -> None:
    blas = BlasThreads.find()
    if blas is None or blas.full < 2:
        pytest.skip("NumPy's OpenBLAS not found, or one thread only")
    blas.set(blas.full)  # a decode earlier in this process may have left it at 1
    rng = np.random.default_rng(1)
    assert thread_invariant(blas, [rng.standard_normal((576, 960), dtype=np.float32)], 1)
    # 500 columns per thread: the tail takes another summation path (measured, OpenBLAS 0.3.31)
    odd = rng.standard_normal((576, 1000), dtype=np.float32)
    if thread_invariant(blas, [odd], 1):
        pytest.skip("this OpenBLAS sums 1,000 columns alike with 1 and 2 threads")
    assert blas.count == blas_threads.BlasThreads.find().count  # restored after the check
