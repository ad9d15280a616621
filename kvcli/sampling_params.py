"""Per-request sampling and stopping settings, checked field by field (torch-free).

The request model (``kvcli/inputs``), the batch parser, structured outputs and the engine all
read the same :class:`SamplingParams`; it lives at the package root so none of them imports
the engine to name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvcli.structured.params import StructuredOutputsParams


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling and stopping settings (vLLM / OpenAI semantics).

    ``temperature == 0`` is greedy. ``top_k <= 0`` and ``top_p == 1`` disable those
    filters. ``seed`` makes sampling reproducible whatever else is in the batch; any
    64-bit signed integer, negative ones included (as vLLM takes it). ``max_tokens=None``
    means "until the context ends" (the engine fills it in per prompt, as vLLM's OpenAI
    server does for a request without ``max_tokens``); an explicit value that does not fit
    the context with the prompt is the request's error.
    """

    max_tokens: int | None = 16
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
    # vLLM's: each prompt token's logprob given the tokens before it, plus this many top
    # alternatives (RequestOutput.prompt_logprobs). Such a request reads no prefix-cache hits:
    # the logits of cached positions are never computed.
    prompt_logprobs: int | None = None
    # A grammar the output must follow (vLLM's name); a line's JSON object is checked into one.
    structured_outputs: StructuredOutputsParams | None = None
    # OpenAI's: token id (a JSON object's key is a string) -> a bias in [-100, 100] added to
    # that token's logit; validate() turns the keys into ints.
    logit_bias: dict[int, float] | None = None
    # vLLM's: only these token ids may be sampled (e.g. a classifier's label tokens).
    allowed_token_ids: list[int] | None = None
    # Set by generate, never by a line: a reply that starts inside a reasoning block gets its
    # grammar only after these tokens (``</think>``), as vLLM's reasoning + structured outputs.
    structured_after: list[int] | None = field(default=None, metadata={"internal": True})
    # Set by generate: the model may open its reasoning itself (Qwen3's own template). A reply
    # whose first token is this one (``<think>``) gets its grammar after ``structured_after``;
    # any other first token is the grammar's, which then covers the whole reply.
    structured_opener: int | None = field(default=None, metadata={"internal": True})

    def validate(self) -> None:
        """Raise ``ValueError("field: reason")`` for the first invalid field."""
        for problem in (
            self.max_tokens is not None and _int_error("max_tokens", self.max_tokens, 1, INT64_MAX,
                                                       "an integer >= 1"),
            _check("temperature", _is_num(self.temperature) and self.temperature >= 0,
                   "a number >= 0", self.temperature),
            _int_error("top_k", self.top_k, 0, INT64_MAX, "an integer >= 0"),
            _check("top_p", _is_num(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]",
                   self.top_p),
            _check("min_p", _is_num(self.min_p) and 0 <= self.min_p <= 1, "a number in [0, 1]",
                   self.min_p),
            _check("repetition_penalty", _is_num(self.repetition_penalty)
                   and self.repetition_penalty > 0, "a number > 0", self.repetition_penalty),
            _penalty_error("presence_penalty", self.presence_penalty),
            _penalty_error("frequency_penalty", self.frequency_penalty),
            self.seed is not None and _int_error("seed", self.seed, INT64_MIN, INT64_MAX,
                                                 "an integer"),
            _check("stop", isinstance(self.stop, list)
                   and all(isinstance(s, str) and s for s in self.stop),
                   "a list of non-empty strings", self.stop),
            _stop_token_ids_error(self.stop_token_ids),
            _int_error("n", self.n, 1, 128, "an integer in [1, 128]"),
            self.logprobs is not None and _int_error("logprobs", self.logprobs, 0, 20,
                                                     "an integer in [0, 20]"),
            self.prompt_logprobs is not None and _int_error(
                "prompt_logprobs", self.prompt_logprobs, 0, 20, "an integer in [0, 20]"),
            _allowed_error(self.allowed_token_ids),
        ):
            if problem:
                raise ValueError(problem)
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        if self.structured_outputs is not None:
            self._check_structured_outputs()

    def _check_structured_outputs(self) -> None:
        self.structured_outputs = StructuredOutputsParams.from_json(self.structured_outputs)
        if self.ignore_eos:  # the grammar's end is the end-of-sequence token
            raise ValueError("ignore_eos: cannot be combined with structured_outputs (a "
                             "constrained output ends with its end-of-sequence token)")
        if self.allowed_token_ids is not None:  # the two could leave no token to sample
            raise ValueError("allowed_token_ids: cannot be combined with structured_outputs "
                             "(the grammar already decides which tokens may follow)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def biased(self) -> bool:
        """Whether ``logit_bias`` or ``allowed_token_ids`` change this request's logits."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # integer fields are 64-bit, as in vLLM


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _check(name: str, ok: bool, expected: str, value: object) -> str | None:
    return None if ok else f"{name}: expected {expected}, got {value!r}"


def _int_error(name: str, value: object, lo: int, hi: int, expected: str) -> str | None:
    """None for an integer in [lo, hi]; else the reason, "out of range" for a whole number.

    JSON parsers (orjson included) hand an integer beyond 64 bits over as a float, so
    ``1267650600228229401496703205376`` arrives as ``1.2676506002282294e+30``: a whole
    number either way, and what is wrong with it is its size, not its type.
    """
    if _is_int(value) and lo <= value <= hi:  # type: ignore[operator]
        return None
    whole = _is_int(value) or (isinstance(value, float) and value.is_integer())
    if whole and not lo <= value <= hi:  # type: ignore[operator]
        return f"{name}: {value!r} is out of range: expected an integer in [{lo}, {hi}]"
    return f"{name}: expected {expected}, got {value!r}"


def _penalty_error(name: str, value: object) -> str | None:
    return _check(name, _is_num(value) and -2 <= value <= 2, "a number in [-2, 2]",  # type: ignore[operator]
                  value)


def _stop_token_ids_error(ids: object) -> str | None:
    if not isinstance(ids, list):
        return f"stop_token_ids: expected a list of token ids, got {ids!r}"
    for i, tok in enumerate(ids):
        problem = _int_error(f"stop_token_ids[{i}]", tok, 0, INT64_MAX, "a token id (an integer >= 0)")
        if problem:
            return problem
    return None


def _token_id_error(name: str, tok: object) -> str | None:
    return _int_error(name, tok, 0, INT64_MAX, "a token id (an integer >= 0)")


def _allowed_error(ids: object) -> str | None:
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids:  # an empty list would leave nothing to sample
        return f"allowed_token_ids: expected a non-empty list of token ids, got {ids!r}"
    return next(filter(None, (_token_id_error(f"allowed_token_ids[{i}]", t)
                              for i, t in enumerate(ids))), None)


def _logit_bias(bias: object) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` -> ``{id: bias}``; ``ValueError`` naming the bad entry."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias: expected an object of token id -> bias, got {bias!r}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        tok = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        problem = _token_id_error(f"logit_bias[{key!r}]", tok) or _check(
            f"logit_bias[{key!r}]", _is_num(value) and -100 <= value <= 100,  # type: ignore[operator]
            "a bias in [-100, 100]", value)
        if problem:
            raise ValueError(problem)
        out[tok] = float(value)  # type: ignore[index]
    return out


def out_of_vocab(params: SamplingParams, vocab_size: int) -> str | None:
    """The first ``logit_bias`` / ``allowed_token_ids`` id the model's vocabulary lacks."""
    for name, ids in (("logit_bias", params.logit_bias or ()),
                      ("allowed_token_ids", params.allowed_token_ids or ())):
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            return f"{name}: token id {bad} outside the vocabulary [0, {vocab_size})"
    return None
