"""Continuous batching: one rule per step, no separate prefill and decode phases (torch-free).

Every request has ``num_computed_tokens`` and ``num_tokens``; each step hands out
tokens until the first catches up with the second, within a token budget
(``max_num_batched_tokens``) and a sequence cap (``max_num_seqs``). Running
requests are served first (decodes and unfinished prefill chunks), then waiting
ones are admitted while budget and blocks allow. A prefill longer than the budget
is chunked. When the pool runs out of blocks, the most recently admitted request
is preempted: its blocks are freed and it is recomputed later (mostly from the
prefix cache, since freed blocks keep their hashes).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from kvcli.engine.kv_cache import KVCacheManager
from kvcli.engine.request import Request, RequestStatus


@dataclass(slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 64
    max_model_len: int = 2048
    policy: str = "fcfs"  # or "cache-aware": admit requests sharing a prefix together


@dataclass(slots=True)
class SchedulerOutput:
    """What one forward pass computes: ``num_new_tokens[i]`` tokens of ``requests[i]``."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.requests)


class _CacheAwareQueue:
    """Waiting requests ordered by prompt tokens, so requests sharing a prefix sit together.

    The first of a group computes the shared prefix and the rest hit it. Preempted
    requests go to the front (they already hold an output to continue).
    """

    def __init__(self) -> None:
        self._front: deque[Request] = deque()
        self._keys: list[tuple[tuple[int, ...], int]] = []
        self._items: list[Request] = []

    def append(self, req: Request) -> None:
        key = (tuple(req.prompt_token_ids[:512]), req.arrival_index)
        i = bisect.bisect(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, req)

    def appendleft(self, req: Request) -> None:
        self._front.appendleft(req)

    def __getitem__(self, i: int) -> Request:
        assert i == 0
        return self._front[0] if self._front else self._items[0]

    def popleft(self) -> Request:
        if self._front:
            return self._front.popleft()
        del self._keys[0]
        return self._items.pop(0)

    def remove(self, req: Request) -> None:
        if req in self._front:
            self._front.remove(req)
            return
        i = self._items.index(req)
        del self._items[i], self._keys[i]

    def __len__(self) -> int:
        return len(self._front) + len(self._items)

    def __iter__(self):
        yield from self._front
        yield from self._items


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Request] | _CacheAwareQueue = (
            _CacheAwareQueue() if config.policy == "cache-aware" else deque()
        )
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prefill_tokens_skipped = 0  # prefix-cache hits taken at admissions (all of them)

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while self.kv_cache.allocate_slots(req, num_new) is None:
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                out.requests.append(req)
                out.num_new_tokens.append(num_new)
                budget -= num_new
                i += 1
                continue
            break  # the request itself was preempted: nothing after it is running
        return budget

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.kv_cache.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        if req in out.requests:  # scheduled earlier in this step: unschedule it
            j = out.requests.index(req)
            del out.requests[j], out.num_new_tokens[j]
        out.preempted.append(req)
        self.waiting.appendleft(req)

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            hit_blocks, num_hit = self.kv_cache.get_computed_blocks(req)
            num_new = min(req.num_tokens - num_hit, budget)
            if self.kv_cache.allocate_slots(req, num_new, hit_blocks) is None:
                break
            self.waiting.popleft()
            req.num_computed_tokens = num_hit
            req.prefill_skipped += num_hit
            self.prefill_tokens_skipped += num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.requests.append(req)
            out.num_new_tokens.append(num_new)
            budget -= num_new

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Advance the cursors of every scheduled request (their K/V is now in the cache)."""
        for req, n in zip(out.requests, out.num_new_tokens, strict=True):
            req.num_computed_tokens += n

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Remove a request wherever it is and release its blocks."""
        req.status = status
        if req in self.running:
            self.running.remove(req)
            self.kv_cache.free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self.kv_cache.free(req)  # drops its recorded lookup
