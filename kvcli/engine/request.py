"""A request's state as it moves through the engine (torch-free).

The scheduler, the KV-cache manager and the model runner all read and advance
the same :class:`Request`; ``num_computed_tokens`` is the single cursor of how
far its KV cache has been filled.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from kvcli.hashing import DEFAULT_BLOCK_SIZE, BlockHash, BlockHasher


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling and stopping settings (vLLM / OpenAI semantics).

    ``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` disable those
    filters. ``seed`` makes sampling reproducible whatever else is in the batch.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError("field: reason")`` for the first invalid field."""
        checks: list[tuple[str, bool, str]] = [
            ("max_tokens", _is_int(self.max_tokens) and self.max_tokens >= 1, "an integer >= 1"),
            ("temperature", _is_num(self.temperature) and self.temperature >= 0, "a number >= 0"),
            ("top_k", _is_int(self.top_k) and self.top_k >= 0, "an integer >= 0"),
            ("top_p", _is_num(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("min_p", _is_num(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]"),
            ("repetition_penalty", _is_num(self.repetition_penalty) and self.repetition_penalty > 0,
             "a number > 0"),
            ("presence_penalty", _is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             "a number in [-2, 2]"),
            ("frequency_penalty", _is_num(self.frequency_penalty)
             and -2 <= self.frequency_penalty <= 2, "a number in [-2, 2]"),
            ("seed", self.seed is None or _is_int(self.seed), "an integer"),
            ("stop", isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
             "a list of non-empty strings"),
            ("stop_token_ids", isinstance(self.stop_token_ids, list)
             and all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "a list of token ids"),
            ("n", _is_int(self.n) and 1 <= self.n <= 128, "an integer in [1, 128]"),
            ("logprobs", self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
             "an integer in [0, 20]"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: expected {expected}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


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
    status: RequestStatus = RequestStatus.WAITING
    error: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    block_hasher: BlockHasher = field(init=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        self.block_hasher = BlockHasher(self.block_size, self.cache_salt)
        self.block_hasher.update(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

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
