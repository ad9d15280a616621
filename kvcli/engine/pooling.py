"""Embedding requests: their tokens' final hidden states -> one vector (prefill only).

The model runner hands each scheduled chunk of a pooling request to :func:`collect`, which
keeps only what the pooling needs: the last prompt position's row (last-token pooling, which
therefore reads prefix-cache hits: the KV-cache manager always leaves the last token to
compute), a running float32 sum of every row (mean) or position 0's row (CLS); mean and CLS
requests read no hits (``Request.reads_prefix_cache``), since a hit's hidden states are never
computed. A preempted request computes its prompt again; positions already pooled
(``pooled_upto``) are not added twice. :func:`finish` truncates (Matryoshka ``dimensions``)
and L2-normalises, the order vLLM and OpenAI's ``dimensions`` use.
"""

from __future__ import annotations

import math

import torch

from kvcli.checkpoint.pooling import PoolingParams
from kvcli.engine.outputs import RequestOutput
from kvcli.engine.request import Request, RequestStatus
from kvcli.sampling_params import SamplingParams


def requests(request_id: str, inputs: list[list[int]], params: PoolingParams,
             cache_salt: str | None, block_size: int, arrival: int) -> list[Request]:
    """One engine request per input (``id#i`` when there are several), as ``n > 1`` samples."""
    many = len(inputs) > 1
    return [Request(f"{request_id}#{i}" if many else request_id, list(ids),
                    SamplingParams(max_tokens=1), cache_salt=cache_salt, block_size=block_size,
                    arrival_index=arrival + i, parent_id=request_id, pooling=params)
            for i, ids in enumerate(inputs)]


def group_output(parent: str, group: list[Request], disk_hits: dict[str, int] | None
                 ) -> RequestOutput:
    """One output for all inputs of an embedding request, its counts summed over them."""
    first = group[0]
    result = RequestOutput(parent, [t for r in group for t in r.prompt_token_ids], [],
                           sum(max(r.num_cached_tokens, 0) for r in group),
                           sum(r.num_preemptions for r in group))
    result.error = next((r.error for r in group if r.error), None)
    if first.first_token_time is not None:
        result.time_to_first_token = first.first_token_time - first.arrival_time
    result.prefill_computed = sum(r.prefill_computed for r in group)
    result.prefill_skipped = sum(r.prefill_skipped for r in group)
    if result.error is None:
        result.embeddings = [r.embedding or [] for r in group]
    if disk_hits is not None:
        result.num_disk_cached_tokens = sum(disk_hits.get(r.request_id, 0) for r in group)
    return result


def collect(hidden: torch.Tensor, req: Request, start: int, row0: int, n: int) -> None:
    """Pool positions [start, start + n) of ``req``, whose rows start at ``row0``."""
    pooling = req.pooling
    assert pooling is not None
    first = max(start, req.pooled_upto)
    end = start + n
    if first >= end:
        return
    if pooling.pooling == "last":
        if end == req.num_prompt_tokens:
            req.pooled = hidden[row0 + n - 1].float().clone()
    elif pooling.pooling == "cls":
        if first == 0:
            req.pooled = hidden[row0].float().clone()
    else:
        rows = hidden[row0 + first - start : row0 + n].float()
        part = rows.sum(dim=0)
        req.pooled = part if req.pooled is None or first == 0 else req.pooled + part
    req.pooled_upto = end


def finish(req: Request) -> list[float]:
    """The request's embedding, once its whole prompt is pooled."""
    pooling = req.pooling
    assert pooling is not None and req.pooled is not None
    vector = req.pooled
    if pooling.pooling == "mean":
        vector = vector / req.num_prompt_tokens
    if pooling.dimensions is not None:
        vector = vector[: pooling.dimensions]
    if pooling.normalize:  # torch.nn.functional.normalize, as sentence-transformers' Normalize
        vector = torch.nn.functional.normalize(vector, p=2.0, dim=0)
    req.pooled = None
    return vector.tolist()


def complete(req: Request, now: float) -> RequestStatus:
    """A request whose whole prompt is pooled: its vector, and how it finishes (a non-finite
    vector, from damaged weights or an overflow, fails it rather than being written)."""
    req.first_token_time = now
    req.embedding = finish(req)
    if all(math.isfinite(x) for x in req.embedding):
        return RequestStatus.FINISHED_STOPPED
    req.error = "non-finite hidden states — damaged weights or an overflow"
    return RequestStatus.FINISHED_ERROR
