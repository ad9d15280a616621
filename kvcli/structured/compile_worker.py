"""Grammar compiles off the engine's step loop: one at a time, oldest first, each within a time limit.

Compiling a grammar against the vocabulary is pure C++ in xgrammar, which releases the GIL,
so a thread runs it while the engine steps the other rows. Its time grows steeply with the
size of the constraint (an enum of 5,000 strings compiles in 0.25 s on a 448-token
vocabulary, one of 10,000 in 13 s, one of 20,000 in 39 s), and xgrammar cannot be
interrupted. So a compile that runs past its limit fails the lines waiting for it, and its
thread is abandoned: it finishes on its own and its result is dropped, while a fresh thread
takes the queue, so one huge constraint never holds up the others. The threads are daemons:
an interrupted run exits at once instead of waiting for a compile (SIGTERM -> 143).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class _Job:
    run: Callable[[], Any]
    path: str  # the input field of the constraint, for the timeout's message
    future: Future = field(default_factory=Future)
    started: float = 0.0


class CompileWorker:
    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout  # None: no limit
        self.abandoned = 0  # compiles given up (their threads may still be running)
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._current: _Job | None = None
        self._generation = 0
        self._start_thread()

    def submit(self, run: Callable[[], Any], path: str) -> Future:
        job = _Job(run, path)
        self._queue.put(job)
        return job.future

    def expire(self) -> None:
        """Fail the running compile if it is past its time limit and hand the queue to a
        fresh thread (called from the step loop)."""
        with self._lock:
            job = self._current
            if job is None or self.timeout is None or self._elapsed(job) <= self.timeout:
                return
            self._current = None
            self.abandoned += 1
            job.future.set_exception(ValueError(
                f"{job.path}: not compiled within {self.timeout:g} s "
                "(--structured-compile-timeout); a smaller schema, fewer enum values or a "
                "simpler grammar compiles faster"))
            self._start_thread()

    def seconds_left(self) -> float | None:
        """Until the running compile's time limit (None: no compile running, or no limit)."""
        with self._lock:
            job = self._current
            if job is None or self.timeout is None:
                return None
            return max(0.0, self.timeout - self._elapsed(job))

    @staticmethod
    def _elapsed(job: _Job) -> float:
        return time.monotonic() - job.started

    def _start_thread(self) -> None:
        self._generation += 1
        threading.Thread(target=self._loop, args=(self._generation,), daemon=True,
                         name=f"kvcli-grammar-{self._generation}").start()

    def _loop(self, generation: int) -> None:
        while True:
            job = self._queue.get()
            with self._lock:
                job.started = time.monotonic()
                self._current = job
            try:
                result, error = job.run(), None
            except Exception as err:  # the caller reads it from the future
                result, error = None, err
            with self._lock:
                if generation != self._generation:  # abandoned: its future already failed
                    return
                self._current = None
                if error is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(result)
