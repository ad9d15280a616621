"""What the engine hands back: finished requests with their completions (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "error"
    logprobs: list[dict[int, float]] | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    time_to_first_token: float | None = None
    # Prefill work of all its samples, every admission (Request.prefill_computed/_skipped)
    prefill_computed: int = 0
    prefill_skipped: int = 0
    error: str | None = None
    # Of num_cached_tokens, those loaded from the disk cache; None when it is off.
    num_disk_cached_tokens: int | None = None
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then one
    # {token_id: logprob} per prompt token (itself and the top alternatives), as in vLLM.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # An embedding request: one vector per input, in input order (``outputs`` is empty and
    # ``prompt_token_ids`` holds every input's tokens, one after another, for the counts).
    embeddings: list[list[float]] | None = None

    @property
    def finished(self) -> bool:
        return True
