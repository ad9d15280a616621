"""Stopping rules applied after each sampled token (torch-free)."""

from __future__ import annotations

from collections.abc import Callable

from kvcli.engine.request import Request, RequestStatus


def check_stop(
    req: Request, max_model_len: int, decode: Callable[[list[int]], str]
) -> RequestStatus | None:
    """The finished status of ``req`` after its newest token, or None to keep going.

    Order matters and follows vLLM: EOS / stop ids, then stop strings (checked on
    the detokenized text, so a stop string split across tokens is still found),
    then the length limits.
    """
    sp = req.sampling_params
    last = req.output_token_ids[-1]
    if (not sp.ignore_eos and last in req.eos_token_ids) or last in sp.stop_token_ids:
        req.stop_reason = last
        return RequestStatus.FINISHED_STOPPED
    if sp.stop:
        # Only a match ending in the newest text is new (earlier text was checked at earlier
        # steps), so decode just a tail window: a stop string of k characters spans at most 4k
        # tokens (byte-level tokens), and the window never grows with the output.
        longest = max(len(s) for s in sp.stop)
        text = decode(req.output_token_ids[-(4 * longest + 8):])
        tail_from = max(0, len(text) - longest - 16)
        for s in sp.stop:
            if text.find(s, tail_from) >= 0:
                req.stop_reason = s
                return RequestStatus.FINISHED_STOPPED
    if req.num_output_tokens >= sp.max_tokens or req.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


def reported_stop_reason(req: Request) -> int | str | None:
    """``stop_reason`` as vLLM reports it: the stop string or stop token id that ended the
    output, None for any other end, an end-of-sequence token included (vLLM's
    ``check_stop`` sets it only for ``stop_token_ids``; the EOS id stays internal, where the
    structured-output check reads it)."""
    eos = isinstance(req.stop_reason, int) and req.stop_reason in req.eos_token_ids
    return None if eos and not req.sampling_params.ignore_eos else req.stop_reason


def final_text(req: Request, decode: Callable[[list[int]], str]) -> str:
    """Detokenized output, cut before a stop string (which is not included)."""
    text = decode(req.output_token_ids)
    if isinstance(req.stop_reason, str):
        cut = text.find(req.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text
