"""A request's state as it moves through the engine (torch-free).

The scheduler, the KV-cache manager and the model runner all read and advance
the same :class:`Request`; ``num_computed_tokens`` is the single cursor of how
far its KV cache has been filled.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from kvcli.checkpoint.pooling import PoolingParams
from kvcli.hashing import DEFAULT_BLOCK_SIZE, BlockHash, BlockHasher
from kvcli.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort", "error")


@dataclass(slots=True)
class Request:
    """One sequence to generate (an ``n > 1`` prompt becomes ``n`` requests)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    cache_salt: str | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    eos_token_ids: tuple[int, ...] = ()
    arrival_index: int = 0
    parent_id: str | None = None  # the id the user gave (an n > 1 sample's id is "parent#i")
    # --- state advanced by the engine ---
    output_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit at first admission; -1 = not yet admitted
    num_preemptions: int = 0
    # Prefill work of this sequence over all its admissions (kvcli/batch/summary.py defines how
    # they add up): tokens computed as prefill, and tokens taken from the prefix cache.
    prefill_computed: int = 0
    prefill_skipped: int = 0
    status: RequestStatus = RequestStatus.WAITING
    error: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] = field(default_factory=list)
    # Entry i: prompt token i + 1 given tokens 0..i (filled chunk by chunk, with prompt_logprobs)
    prompt_logprobs: list[dict[int, float]] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    # An embedding request (prefill only, no sampling): how it pools, what it has pooled so
    # far (a tensor; engine/pooling.py) over positions [0, pooled_upto), and the result.
    pooling: PoolingParams | None = None
    pooled: Any = None
    pooled_upto: int = 0
    embedding: list[float] | None = None
    block_hasher: BlockHasher = field(init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        self.block_hasher = BlockHasher(self.block_size, self.cache_salt)
        self.block_hasher.update(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def reads_prefix_cache(self) -> bool:
        """False with prompt logprobs (every prompt position's logits are computed) and for
        mean / CLS pooling (every position's hidden state, which K/V cannot give back)."""
        if self.pooling is not None and self.pooling.needs_every_token:
            return False
        return self.sampling_params.prompt_logprobs is None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def block_hashes(self) -> list[BlockHash]:
        """Hashes of the full blocks of ``token_ids`` (prompt and output so far)."""
        return self.block_hasher.hashes

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)
        self.block_hasher.update(self.token_ids)
