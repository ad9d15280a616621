"""Perplexity of a model on a text, computed as llama.cpp's `llama-perplexity` computes it.

The text's tokens are split into non-overlapping windows of ``context`` tokens (a shorter tail
is dropped). Each window runs as one request with ``prompt_logprobs``, so every token's
log-probability comes from the engine itself (its kernels, its quantized weights); only the
second half of each window is scored: tokens ``context // 2 + 1 .. context - 1``, each with at
least half a window of history. ``ppl = exp(mean NLL)``; the error is llama.cpp's, the
standard error of the mean NLL times ``ppl``. If the tokenizer starts a text with a BOS token,
it starts every window (llama.cpp replaces each window's first token with BOS).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvcli.engine.llm import LLM
from kvcli.engine.llm_engine import LLMEngine
from kvcli.sampling_params import SamplingParams

MIN_CONTEXT = 4  # a window must score at least one token with half a window before it


class PerplexityError(ValueError):
    """The text or the settings cannot give a perplexity; the message names the cause."""


@dataclass(slots=True)
class Perplexity:
    text_tokens: int  # tokens of the whole text
    context: int
    windows: int
    tokens_scored: int
    mean_nll: float  # nats per scored token
    ppl: float
    ppl_error: float  # one standard error, as llama.cpp's "PPL = x +/- e"
    seconds: float  # the engine's time for all windows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_text(path: str | Path) -> str:
    """The text of a UTF-8 file; a missing, unreadable, non-UTF-8 or blank file is an error."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise PerplexityError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise PerplexityError(f"{path}:{line}: not UTF-8 text (byte {err.start})") from None
    if not text.strip():
        raise PerplexityError(f"{path}: the text is empty")
    return text


def window_starts(num_tokens: int, context: int) -> list[int]:
    """First token of each full window; an error when not even one window fits."""
    if context < MIN_CONTEXT:
        raise PerplexityError(f"context: expected an integer >= {MIN_CONTEXT}, got {context}")
    if num_tokens < context:
        raise PerplexityError(f"the text has {num_tokens} tokens, fewer than one window of "
                              f"context {context}: give a longer text or a smaller context")
    return list(range(0, num_tokens - context + 1, context))


def scored_positions(context: int) -> range:
    """Positions in a window whose tokens are scored (llama.cpp: first = n_ctx / 2, tokens
    first + 1 .. n_ctx - 1, predicted from the logits at first .. n_ctx - 2)."""
    return range(context // 2 + 1, context)


def summarize(nlls: Sequence[float]) -> tuple[float, float, float]:
    """(mean NLL, ppl, ppl error) of per-token negative log-likelihoods, as llama.cpp."""
    count = len(nlls)
    if count == 0:
        raise PerplexityError("no token was scored")
    mean = math.fsum(nlls) / count
    if not math.isfinite(mean):
        raise PerplexityError("non-finite log-probabilities: damaged weights or an overflow")
    ppl = math.exp(mean)
    var = math.fsum(x * x for x in nlls) / count - mean * mean
    error = math.sqrt(var / (count - 1)) * ppl if count > 1 and var > 0 else 0.0
    return mean, ppl, error


def tokenize(engine: LLMEngine, text: str) -> tuple[list[int], int | None]:
    """The text's ids without special tokens, and the BOS id the tokenizer would put first."""
    tok = engine.tokenizer
    ids = list(tok.encode(text, add_special_tokens=False))
    special = list(tok.encode("", add_special_tokens=True))
    return ids, (special[0] if len(special) == 1 else None)


def windows_of(ids: Sequence[int], context: int, bos: int | None) -> list[list[int]]:
    windows = [list(ids[s : s + context]) for s in window_starts(len(ids), context)]
    if bos is not None:
        for w in windows:
            w[0] = bos
    return windows


def window_nlls(engine: LLMEngine, windows: Sequence[Sequence[int]]) -> list[float]:
    """Negative log-likelihoods of every window's scored tokens, in text order."""
    outputs = LLM.from_engine(engine).generate(
        [list(w) for w in windows], SamplingParams(max_tokens=1, prompt_logprobs=0))
    nlls: list[float] = []
    for i, (w, out) in enumerate(zip(windows, outputs, strict=True)):
        if out.error or out.prompt_logprobs is None:
            raise PerplexityError(f"window {i}: {out.error or 'no prompt logprobs'}")
        nlls.extend(-out.prompt_logprobs[p][w[p]] for p in scored_positions(len(w)))
    return nlls


def perplexity(engine: LLMEngine, text: str, context: int = 512) -> Perplexity:
    """Perplexity of the engine's model on ``text`` with windows of ``context`` tokens."""
    if context >= engine.max_model_len:  # a window and the one token each request samples
        raise PerplexityError(f"context: {context} does not fit the model's "
                              f"{engine.max_model_len}-token context (at most "
                              f"{engine.max_model_len - 1})")
    ids, bos = tokenize(engine, text)
    windows = windows_of(ids, context, bos)
    t0 = time.perf_counter()
    nlls = window_nlls(engine, windows)
    seconds = time.perf_counter() - t0
    mean, ppl, error = summarize(nlls)
    return Perplexity(len(ids), context, len(windows), len(nlls), mean, ppl, error, seconds)
