"""Which worker a request goes to: prefix affinity with bounded loads.

A request's routing key is the chain hash of its first ``affinity_blocks`` full
blocks (kvcli.hashing, cache_salt included: the engine's own hashes), so every
request sharing that prefix has the same key. The first request with a new key
goes to the least-loaded worker, which then owns the key; later ones follow it
there and hit its prefix cache. Bounded load (Mirrokni et al.'s consistent
hashing with bounded loads, applied to a sticky owner table): a worker already
holding ``load_factor`` times the average load takes no more, and the request
spills to the least-loaded worker, so one dominant prefix cannot idle the rest.
A spilled prefix is computed once more on the worker it spills to, then hits there too.

A key never needs more than its first blocks: the chain hash of block N already
covers blocks 0..N, and a prefix shorter than N blocks costs at most N blocks per
worker when requests sharing it land on different workers.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

MAX_KEYS = 1 << 16  # owner table size: old keys are forgotten (their cache is likely gone too)


def routing_key(block_hashes: Sequence[bytes], affinity_blocks: int) -> bytes | None:
    """The hash of the request's first ``affinity_blocks`` full blocks (None: no full block)."""
    if not block_hashes:
        return None
    return block_hashes[min(affinity_blocks, len(block_hashes)) - 1]


class Router(Protocol):
    def choose(self, key: bytes | None, loads: Sequence[int], alive: Sequence[bool]) -> int: ...


def least_loaded(loads: Sequence[int], alive: Sequence[bool]) -> int:
    candidates = [w for w, ok in enumerate(alive) if ok]
    if not candidates:
        raise ValueError("no live worker to route to")
    return min(candidates, key=lambda w: (loads[w], w))


class PrefixRouter:
    """Sticky prefix -> worker ownership, capped at ``load_factor`` x the average load."""

    def __init__(self, num_workers: int, load_factor: float = 1.25,
                 max_keys: int = MAX_KEYS) -> None:
        self.load_factor = load_factor
        self.max_keys = max_keys
        self.keys_owned = [0] * num_workers
        self.spills = 0  # requests sent away from their prefix's owner (load cap)
        self._owner: OrderedDict[bytes, int] = OrderedDict()

    def choose(self, key: bytes | None, loads: Sequence[int], alive: Sequence[bool]) -> int:
        if key is None:  # no full block: nothing to share, just balance
            return least_loaded(loads, alive)
        owner = self._owner.get(key)
        if owner is None or not alive[owner]:
            owner = self._assign(key, loads, alive)
        else:
            self._owner.move_to_end(key)
        if loads[owner] < self._cap(loads, alive):
            return owner
        self.spills += 1
        return least_loaded(loads, alive)

    def _cap(self, loads: Sequence[int], alive: Sequence[bool]) -> int:
        live = [load for load, ok in zip(loads, alive, strict=True) if ok]
        # +1: the request being placed. ceil keeps at least one slot for an idle pool.
        return math.ceil(self.load_factor * (sum(live) + 1) / len(live))

    def _assign(self, key: bytes, loads: Sequence[int], alive: Sequence[bool]) -> int:
        candidates = [w for w, ok in enumerate(alive) if ok]
        if not candidates:
            raise ValueError("no live worker to route to")
        owner = min(candidates, key=lambda w: (loads[w], self.keys_owned[w], w))
        previous = self._owner.pop(key, None)
        if previous is not None:
            self.keys_owned[previous] -= 1
        self._owner[key] = owner
        self.keys_owned[owner] += 1
        if len(self._owner) > self.max_keys:
            _, evicted = self._owner.popitem(last=False)
            self.keys_owned[evicted] -= 1
        return owner


class RandomRouter:
    """Uniformly random live worker (seeded): the baseline that prefix affinity is measured against."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self.spills = 0

    def choose(self, key: bytes | None, loads: Sequence[int], alive: Sequence[bool]) -> int:
        candidates = [w for w, ok in enumerate(alive) if ok]
        if not candidates:
            raise ValueError("no live worker to route to")
        return self._rng.choice(candidates)


def make_router(kind: str, num_workers: int, load_factor: float, seed: int) -> Router:
    if kind == "random":
        return RandomRouter(seed)
    return PrefixRouter(num_workers, load_factor)
