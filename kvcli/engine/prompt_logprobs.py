"""Prompt logprobs (vLLM's ``SamplingParams.prompt_logprobs``): for each prompt token after the
first, its log-probability given the tokens before it, plus the top-k alternatives.

The model runner computes the logits of every scheduled position of such a request, not only
of the row that samples, so a chunked prefill fills ``Request.prompt_logprobs`` chunk by chunk.
Log-softmax runs in float32 over the full vocabulary (as vLLM and llama.cpp's perplexity do).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvcli.engine.request import Request

# Rows of logits computed at once: 256 x a 49k vocabulary is 50 MB of float32, so a 1024-token
# chunk never holds all its logits (200 MB) at the same time.
LOGIT_ROWS = 256

ComputeLogits = Callable[[torch.Tensor], torch.Tensor]


def prompt_rows(req: Request, start: int, n: int) -> range:
    """Positions of the chunk [start, start + n) whose logits give a prompt logprob still missing.

    Position p predicts prompt token p + 1; entries already there (a preempted request computes
    its prompt again) are not recomputed.
    """
    first = max(start, len(req.prompt_logprobs))
    return range(first, min(start + n, req.num_prompt_tokens - 1))


def collect(compute_logits: ComputeLogits, hidden: torch.Tensor, req: Request, start: int,
            row0: int, positions: range) -> None:
    """Append ``positions``' prompt logprobs to ``req``; ``row0`` is the chunk's first row in
    ``hidden`` (whose row ``row0 + p - start`` holds position p)."""
    k = req.sampling_params.prompt_logprobs or 0
    for lo in range(positions.start, positions.stop, LOGIT_ROWS):
        hi = min(lo + LOGIT_ROWS, positions.stop)
        rows = hidden[row0 + lo - start : row0 + hi - start]
        logprobs = torch.log_softmax(compute_logits(rows).float(), dim=-1)
        targets = torch.tensor(req.token_ids[lo + 1 : hi + 1], dtype=torch.long,
                               device=logprobs.device)
        chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
        top_ids, top_lps = ([], [])
        if k:
            top = torch.topk(logprobs, k, dim=-1)
            top_ids, top_lps = top.indices.tolist(), top.values.tolist()
        for i, (tok, lp) in enumerate(zip(targets.tolist(), chosen, strict=True)):
            entry = dict(zip(top_ids[i], top_lps[i], strict=True)) if k else {}
            entry[tok] = lp
            req.prompt_logprobs.append(entry)
