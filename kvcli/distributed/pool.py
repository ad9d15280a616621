"""WorkerPool: the engine interface the batch job drives (add_request, step, abort, stats), over Ray actors.

The job's loop is unchanged: it admits requests until its ``--max-pending``
window is full, then calls ``step()``, which here waits for the first actor to
reply and returns the results it carried. Per actor the pool keeps

* a queue of routed requests not sent yet (bounded by the job's window), and
* the requests sent and not yet finished (at most ``max_in_flight``): re-sent
  after a failed call, so a restarted actor loses nothing, and dropped once
  their result arrived, so nothing is written twice;
* up to PIPELINE outstanding ``advance`` calls, so the actor's engine goes on
  stepping while the driver handles a reply.

``add_request`` checks the sampling parameters at once (like the engine); the
engine's own prompt checks run on the actor and come back as RejectedRequest.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayError, RayTaskError

from kvcli.batch.records import RejectedRequest
from kvcli.distributed.cluster import describe_error
from kvcli.distributed.prediction import SingleEnginePrediction
from kvcli.distributed.routing import Router, routing_key
from kvcli.distributed.tally import WorkerTally, merge_stats
from kvcli.distributed.worker import WorkerReply
from kvcli.hashing import hash_token_blocks

SLICE_S = 0.25  # longest actor call: how long a request routed to a busy actor may wait
WAIT_S = 1.0  # step() returns at least this often, so Ctrl-C is seen
PIPELINE = 2  # calls queued per actor: the next one starts the moment the last returns
RETRY_S = (0.1, 2.0)  # back-off after a failed call, doubling from the first to the second
STATS_TIMEOUT_S = 10.0


@dataclass(slots=True)
class PendingItem:
    request_id: str
    prompt_token_ids: list[int]
    params: Any
    cache_salt: str | None
    predicted: int | None  # single-engine prediction of its cached tokens
    key: bytes | None  # its routing key (the chain hash of its first blocks)

    @property
    def payload(self) -> tuple[str, list[int], Any, str | None]:
        return self.request_id, self.prompt_token_ids, self.params, self.cache_salt


@dataclass(slots=True)
class WorkerSlot:
    handle: Any
    tally: WorkerTally
    alive: bool = True
    queue: deque[PendingItem] = field(default_factory=deque)
    in_flight: dict[str, PendingItem] = field(default_factory=dict)
    calls: list[Any] = field(default_factory=list)  # outstanding advance() ObjectRefs, oldest first
    deaths: int = 0  # calls lost to the actor dying (not to it being briefly unreachable)
    resent: int = 0  # requests queued again after a failed call
    retry_delay: float = 0.0  # > 0 while its calls fail: send again at retry_at
    retry_at: float = 0.0

    @property
    def load(self) -> int:
        return len(self.queue) + len(self.in_flight)


class WorkerPoolError(Exception):
    """Every worker failed more often than Ray may restart it: the job cannot go on."""


class WorkerPool:
    def __init__(self, handles: list[Any], nodes: list[str], router: Router, tokenizer: Any,
                 max_model_len: int, vocab_size: int, block_size: int, affinity_blocks: int,
                 max_in_flight: int, max_restarts: int,
                 warn: Callable[[str], None] | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.slots = [WorkerSlot(h, WorkerTally(i, node)) for i, (h, node)
                      in enumerate(zip(handles, nodes, strict=True))]
        self.router = router
        self.block_size = block_size
        self.affinity_blocks = affinity_blocks
        self.max_in_flight = max_in_flight
        self.max_restarts = max_restarts
        self.prediction = SingleEnginePrediction(block_size)
        self.started = time.perf_counter()
        self._warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))
        self._where: dict[str, WorkerSlot] = {}  # request id -> the worker it is routed to

    # ------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: Any,
                    cache_salt: str | None = None) -> None:
        params.validate()  # the engine's first check, so a bad value fails now as it does locally
        hashes = hash_token_blocks(prompt_token_ids, self.block_size, cache_salt)
        predicted = self.prediction.add(hashes, len(prompt_token_ids))
        key = routing_key(hashes, self.affinity_blocks)
        self._route(PendingItem(request_id, prompt_token_ids, params, cache_salt, predicted, key))

    def _route(self, item: PendingItem) -> None:
        w = self.router.choose(item.key, [s.load for s in self.slots],
                               [s.alive for s in self.slots])
        self.slots[w].queue.append(item)
        self._where[item.request_id] = self.slots[w]

    def has_unfinished(self) -> bool:
        return bool(self._where)

    def abort(self, request_id: str) -> None:
        """Forget a request (the job is stopping); a result still on its way is dropped."""
        slot = self._where.pop(request_id, None)
        if slot is None:
            return
        if slot.in_flight.pop(request_id, None) is None:
            slot.queue = deque(i for i in slot.queue if i.request_id != request_id)

    # ----------------------------------------------------------------- step
    def step(self) -> list[Any]:
        self._dispatch()
        calls = {ref: s for s in self.slots for ref in s.calls}
        if not calls:  # every worker with work is backing off after a failure
            time.sleep(max(0.0, min(WAIT_S, min(s.retry_at for s in self.slots)
                                    - time.monotonic())))
            return []
        ready, rest = ray.wait(list(calls), num_returns=1, timeout=WAIT_S)
        if ready and rest:  # take every reply that is already there
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        finished: list[Any] = []
        for ref in ready:
            if ref in calls[ref].calls:  # not dropped by a failure of an earlier call
                finished.extend(self._collect(calls[ref], ref))
        return finished

    def _dispatch(self) -> None:
        """Send each actor its queued requests (up to its in-flight cap), keeping PIPELINE calls
        queued while it has work, so its engine never waits for the driver between calls."""
        now = time.monotonic()
        for slot in self.slots:
            if not slot.alive or slot.retry_at > now:
                continue
            while len(slot.calls) < PIPELINE:
                batch = []
                while slot.queue and len(slot.in_flight) < self.max_in_flight:
                    item = slot.queue.popleft()
                    slot.in_flight[item.request_id] = item
                    batch.append(item.payload)
                if not slot.in_flight:  # nothing left for it to run
                    break
                slot.calls.append(slot.handle.advance.remote(batch, SLICE_S))

    def _collect(self, slot: WorkerSlot, ref: Any) -> list[Any]:
        slot.calls.remove(ref)
        try:
            reply: WorkerReply = ray.get(ref)
        except RayError as err:
            self._on_failure(slot, err)
            return []
        slot.retry_delay = 0.0
        tally = slot.tally
        tally.note_stats(reply.incarnation, reply.stats)
        tally.busy_s += reply.busy_s
        finished: list[Any] = []
        for request_id, message in reply.rejected:
            if self._settle(slot, request_id) is not None:
                finished.append(RejectedRequest(request_id, message))
        for out in reply.outputs:
            item = self._settle(slot, out.request_id)
            if item is not None:  # None: aborted, or already delivered by an earlier reply
                tally.record(out, item.predicted)
                finished.append(out)
        return finished

    def _settle(self, slot: WorkerSlot, request_id: str) -> PendingItem | None:
        """The request's item if this result is the first for it, else None."""
        if self._where.get(request_id) is not slot:
            return None  # aborted, delivered before, or moved to another worker
        del self._where[request_id]
        item = slot.in_flight.pop(request_id, None)
        if item is None:  # re-queued after a call failed, yet an earlier call finished it
            item = next(i for i in slot.queue if i.request_id == request_id)
            slot.queue.remove(item)
        return item

    # -------------------------------------------------------------- failure
    def _on_failure(self, slot: WorkerSlot, err: RayError) -> None:
        """Send the lost requests again after a back-off; give the worker up once Ray has."""
        slot.calls.clear()  # queued after the failed one: their replies are not waited for
        lost = list(slot.in_flight.values())
        slot.in_flight.clear()
        slot.queue.extendleft(reversed(lost))
        slot.resent += len(lost)
        first = slot.retry_delay == 0.0  # warn once per outage, not once per retry
        slot.retry_delay = min(RETRY_S[1], max(RETRY_S[0], 2 * slot.retry_delay))
        slot.retry_at = time.monotonic() + slot.retry_delay
        name, cause = f"Ray worker {slot.tally.index}", describe_error(err)
        if isinstance(err, ActorUnavailableError):  # restarting, or unreachable for a moment
            if first:
                self._warn(f"kvcli generate: {name} is unavailable ({cause}); its "
                           f"{len(slot.queue)} unfinished requests are sent again once it is back")
            return
        slot.deaths += 1
        if slot.deaths <= self.max_restarts:
            if isinstance(err, RayTaskError):  # the engine raised: its state is unknown
                ray.kill(slot.handle, no_restart=False)
            if first:
                self._warn(f"kvcli generate: {name} failed ({cause}); Ray restarts it and its "
                           f"{len(slot.queue)} unfinished requests are sent again")
            return
        self._retire(slot, f"{name} failed {slot.deaths} times ({cause})")

    def _retire(self, slot: WorkerSlot, why: str) -> None:
        """Ray restarts no more: move the worker's requests to the others."""
        slot.alive = False
        lost, slot.queue = list(slot.queue), deque()
        if not any(s.alive for s in self.slots):
            raise WorkerPoolError(f"every Ray worker failed; the last: {why}")
        self._warn(f"kvcli generate: {why}; its {len(lost)} unfinished requests move to the "
                   "other workers")
        ray.kill(slot.handle, no_restart=True)
        for item in lost:
            self._route(item)

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """The engines' stats added up, plus per-worker rows and the single-engine prediction."""
        live = [s for s in self.slots if s.alive]
        refs = [s.handle.stats.remote() for s in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=STATS_TIMEOUT_S)
        for slot, ref in zip(live, refs, strict=True):
            if ref in ready:
                try:
                    slot.tally.note_stats(*ray.get(ref))
                except RayError:
                    pass  # keep its last reported stats
        return merge_stats([s.tally for s in self.slots], time.perf_counter() - self.started)

