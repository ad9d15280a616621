"""EngineWorker: the Ray actor that holds one engine (model loaded once, in the actor's process).

The driver keeps at most one ``advance`` call outstanding per actor. A call adds
the new requests to the engine, then runs engine steps until something finished
(after ``MIN_SLICE_S``, so one reply carries several results) or ``slice_s`` passed
(so requests routed meanwhile wait at most that long), and returns what finished.

Re-sending is idempotent: after a failed call the driver re-sends every request
it has no result for. A restarted actor (a fresh engine) runs them all; an actor
that was only unreachable skips the ones still running, and re-runs the ones
whose results were lost with the failed reply. Either way each id finishes once.

Deliberately Ray-free: ``cluster`` wraps it with ``ray.remote``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kvcli.engine import engine_class
from kvcli.engine.config import EngineConfig

MIN_SLICE_S = 0.02
STATS_EVERY_S = 1.0

# (request id, prompt token ids, SamplingParams, cache_salt): the engine's add_request arguments
WorkItem = tuple[str, list[int], Any, str | None]


@dataclass(slots=True)
class WorkerReply:
    outputs: list[Any]  # RequestOutput of requests that finished
    rejected: list[tuple[str, str]]  # (request id, the engine's "field: reason") from add_request
    incarnation: str  # changes when Ray restarts the actor (a fresh engine, fresh stats)
    stats: dict[str, Any] | None = None  # engine.stats(), at most every STATS_EVERY_S
    busy_s: float = 0.0  # time this call spent in engine steps


@dataclass(slots=True)
class WorkerInfo:
    max_model_len: int
    vocab_size: int
    num_blocks: int
    node: str
    pid: int
    incarnation: str = ""


class EngineWorker:
    def __init__(self, config: EngineConfig, num_threads: int = 1) -> None:
        LLMEngine = engine_class()  # torch imported as `kvcli generate` imports it
        import torch

        torch.set_num_threads(max(1, num_threads))  # the actor's CPU share, not the node's
        self.engine = LLMEngine.from_config(config)
        self.incarnation = uuid.uuid4().hex
        self._live: set[str] = set()  # ids added and not finished
        self._stats_at = 0.0

    def info(self) -> WorkerInfo:
        e = self.engine
        return WorkerInfo(e.max_model_len, e.vocab_size, e.num_blocks, socket.gethostname(),
                          os.getpid(), self.incarnation)

    def advance(self, items: list[WorkItem], slice_s: float) -> WorkerReply:
        rejected = self._add(items)
        finished: list[Any] = []
        start = time.perf_counter()
        while self.engine.has_unfinished():
            finished.extend(self.engine.step())
            elapsed = time.perf_counter() - start
            if ((finished or rejected) and elapsed >= MIN_SLICE_S) or elapsed >= slice_s:
                break
        busy = time.perf_counter() - start
        for out in finished:
            self._live.discard(out.request_id)
        return WorkerReply(finished, rejected, self.incarnation, self._stats_due(), busy)

    def stats(self) -> tuple[str, dict[str, Any]]:
        return self.incarnation, self.engine.stats()

    def _add(self, items: list[WorkItem]) -> list[tuple[str, str]]:
        rejected = []
        for request_id, ids, params, salt in items:
            if request_id in self._live:  # a re-send of a request this engine still runs
                continue
            try:
                self.engine.add_request(request_id, ids, params, salt)
            except ValueError as err:
                rejected.append((request_id, str(err)))
                continue
            self._live.add(request_id)
        return rejected

    def _stats_due(self) -> dict[str, Any] | None:
        now = time.monotonic()
        if now - self._stats_at < STATS_EVERY_S:
            return None
        self._stats_at = now
        return self.engine.stats()
