"""Run vLLM's offline engine for `kvcli bench --compare vllm`, inside vLLM's own Python.

This file is executed by another interpreter (the one given by --vllm-python), so it
imports only the standard library and vllm, never kvcli. Protocol, one JSON object per
line (peer_serve.py runs the loop): the runner loads the model and writes {"ready": true,
"load_s": ...}; then for every line {"prompts": [[ids]], "max_new_tokens": n} on stdin it
writes the outputs, timings and cache counters, or {"error": "..."}.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from peer_serve import peak_rss_mb, reset_peak, serve


def load(args: dict[str, Any]) -> Any:
    from vllm import LLM

    return LLM(model=args["model"], tokenizer=args["model"], dtype="float32",
               enable_prefix_caching=args.get("enable_prefix_caching", True),
               block_size=args.get("block_size", 32),
               max_num_batched_tokens=args["max_num_batched_tokens"],
               max_model_len=args["max_model_len"], seed=0, disable_log_stats=True)


def run(llm: Any, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """One timed batch through the engine's step loop (what LLM.generate does), greedy."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()  # every run starts cold, like kvcli's fresh engine
    measured = reset_peak()
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens,
                            min_tokens=max_new_tokens, ignore_eos=True)
    engine = llm.llm_engine
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=list(ids)), params)
    first: dict[str, float] = {}
    finished: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id not in first and out.outputs and out.outputs[0].token_ids:
                first[out.request_id] = time.perf_counter() - start
            if out.finished:
                finished[out.request_id] = out
    wall = time.perf_counter() - start
    ordered = [finished[str(i)] for i in range(len(prompts))]
    return {
        "wall_s": wall,
        "outputs": [list(o.outputs[0].token_ids) for o in ordered],
        "ttfts": [first[str(i)] for i in range(len(prompts)) if str(i) in first],
        "cached_tokens": sum(int(o.num_cached_tokens or 0) for o in ordered),
        "peak_rss_mb": peak_rss_mb(measured),
    }


def _load(args: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    llm = load(args)
    import vllm

    return llm, {"version": getattr(vllm, "__version__", "unknown")}


def _handle(llm: Any, request: dict[str, Any]) -> dict[str, Any]:
    return run(llm, request["prompts"], request["max_new_tokens"])


if __name__ == "__main__":
    sys.exit(serve(_load, _handle))
