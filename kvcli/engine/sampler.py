"""Sampling: logits of the rows that sample -> next token ids (and optional logprobs).

Greedy rows are a plain argmax over the raw logits, so greedy output equals
transformers' ``generate(do_sample=False)``. Random rows draw from a
per-request ``torch.Generator``: a request's samples depend only on its own
seed, never on what else is in the batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kvcli.engine.request import Request
from kvcli.sampling_params import SamplingParams


@dataclass(slots=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]
    nonfinite: list[int] = field(default_factory=list)  # rows the engine fails (model_runner)


class Sampler:
    def __init__(self, base_seed: int = 0) -> None:
        self.base_seed = base_seed
        self._generators: dict[str, torch.Generator] = {}
        # Set by the engine once a request has a grammar: masks those rows' logits in place.
        self.logits_mask: Callable[[torch.Tensor, list[Request]], None] | None = None

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, req: Request) -> torch.Generator:
        gen = self._generators.get(req.request_id)
        if gen is None:
            # Unseeded requests still get a private stream (from the engine seed and the
            # request id), so outputs do not depend on batch composition either.
            seed = req.sampling_params.seed
            if seed is None:
                seed = self.base_seed ^ _stable_hash(req.request_id)
            else:
                seed = (seed + 1_000_003 * _sample_index(req.request_id)) & 0xFFFFFFFFFFFF
            gen = torch.Generator().manual_seed(seed)
            self._generators[req.request_id] = gen
        return gen

    def __call__(self, logits: torch.Tensor, requests: list[Request],
                 first_max: list[int] | None = None) -> SampleResult:
        """``first_max``: each row's first maximal index where the caller took it already
        (:func:`greedy_rows`); used only where no mask, bias or penalty changes a row."""
        logits = logits.float()
        if self.logits_mask is not None:  # before penalties, filters and logprobs read them
            self.logits_mask(logits, requests)
            first_max = None  # a mask may move a row's maximum
        if any(_has_penalties(r) or r.sampling_params.biased for r in requests):
            first_max = None
            logits = logits.clone()  # rows without them stay bit-identical
            for i, req in enumerate(requests):
                if req.sampling_params.biased:  # before penalties, as vLLM orders them
                    _apply_bias(logits[i], req.sampling_params)
                if _has_penalties(req):
                    _apply_penalties(logits[i], req)
        greedy = first_max if first_max is not None else _argmax_rows(logits)
        token_ids: list[int] = []
        for i, req in enumerate(requests):
            sp = req.sampling_params
            if sp.greedy:
                token_ids.append(greedy[i])
            else:
                probs = _filtered_probs(logits[i], sp.temperature, sp.top_k, sp.top_p, sp.min_p)
                tok = torch.multinomial(probs.cpu(), 1, generator=self._generator(req))
                token_ids.append(int(tok))
        logprobs = [self._logprobs(logits[i], req, token_ids[i]) for i, req in enumerate(requests)]
        return SampleResult(token_ids, logprobs)

    @staticmethod
    def _logprobs(row: torch.Tensor, req: Request, token: int) -> dict[int, float] | None:
        k = req.sampling_params.logprobs
        if k is None:
            return None
        lp = torch.log_softmax(row, dim=-1)
        out = {token: float(lp[token])}
        if k > 0:
            vals, ids = lp.topk(k)
            for v, t in zip(vals.tolist(), ids.tolist(), strict=True):
                if v > -math.inf:  # a grammar-masked token is no alternative
                    out.setdefault(t, v)
        return out


def _has_penalties(req: Request) -> bool:
    sp = req.sampling_params
    return sp.repetition_penalty != 1.0 or sp.presence_penalty != 0 or sp.frequency_penalty != 0


def _apply_bias(row: torch.Tensor, sp: SamplingParams) -> None:
    """vLLM's ``allowed_token_ids`` (every other token -inf), then OpenAI's ``logit_bias``.

    Greedy, sampled and logprobs all read the row after this, as they read the grammar mask."""
    if sp.allowed_token_ids is not None:
        keep = torch.full_like(row, float("-inf"))
        ids = torch.tensor(sp.allowed_token_ids, dtype=torch.long, device=row.device)
        keep[ids] = 0.0
        row += keep
    if sp.logit_bias:
        ids = torch.tensor(list(sp.logit_bias), dtype=torch.long, device=row.device)
        row[ids] += torch.tensor(list(sp.logit_bias.values()), dtype=row.dtype,
                                 device=row.device)


def _apply_penalties(row: torch.Tensor, req: Request) -> None:
    """HF-style repetition penalty over prompt+output; OpenAI presence/frequency over output."""
    sp = req.sampling_params
    if sp.repetition_penalty != 1.0 and req.token_ids:
        ids = torch.tensor(sorted(set(req.token_ids)), dtype=torch.long)
        vals = row[ids]
        row[ids] = torch.where(vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty)
    if (sp.presence_penalty or sp.frequency_penalty) and req.output_token_ids:
        counts = Counter(req.output_token_ids)
        ids = torch.tensor(list(counts), dtype=torch.long)
        cnt = torch.tensor(list(counts.values()), dtype=row.dtype)
        row[ids] -= sp.frequency_penalty * cnt + sp.presence_penalty


def _filtered_probs(
    row: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    logits = row / max(temperature, 1e-2)
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        cum = sorted_p.cumsum(0)
        drop = (cum - sorted_p) > top_p  # keep the smallest set whose mass reaches top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return probs / probs.sum()


def _sample_index(request_id: str) -> int:
    """Child ``i`` of an ``n > 1`` request (id ``parent#i``) gets its own stream."""
    _, sep, idx = request_id.rpartition("#")
    return int(idx) if sep and idx.isdigit() else 0


def _stable_hash(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "little")


def _argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first maximal index, as torch.argmax (transformers' greedy step) returns it.
    NumPy's argmax on CPU: 0.33 ms vs 1.13 ms for 32 x 49,152 logits (same first-index rule)."""
    if logits.device.type == "cpu":
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def greedy_rows(logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """Each row's first maximal index (:func:`_argmax_rows`) and the rows whose maximum is not
    finite: a NaN anywhere (argmax, as max, picks the first NaN), +inf, or all -inf, what greedy
    argmax and sampling cannot use. One pass over the logits on CPU: the value at the argmax
    tells finiteness, where a separate max took another 0.47 ms a step for 32 x 49,152 (~1% of
    a distinct run, with the sampler's own argmax)."""
    if logits.device.type != "cpu":
        finite = torch.isfinite(logits.amax(dim=-1))
        bad = [] if bool(finite.all()) else (~finite).nonzero().flatten().tolist()
        return _argmax_rows(logits), bad
    rows = logits.float().numpy()
    top = rows.argmax(axis=-1)
    finite = np.isfinite(rows[np.arange(len(top)), top])
    return top.tolist(), [] if finite.all() else np.flatnonzero(~finite).tolist()
