"""Run vLLM's offline engine for `kvcli bench --compare vllm`, inside vLLM's own Python.

This file is executed by another interpreter (the one given by --vllm-python), so it
imports only the standard library and vllm, never kvcli. Protocol, one JSON object per
line: the runner loads the model and writes {"ready": true, "load_s": ...}; then for
every line {"prompts": [[ids]], "max_new_tokens": n} on stdin it writes the outputs,
timings and cache counters, or {"error": "..."}. The protocol uses the original stdout;
fd 1 is pointed at stderr so vLLM's own prints cannot corrupt it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _vm_kib(field: str) -> int | None:  # measure._status_kib; kvcli is not importable here
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


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
    measured = _reset_peak()
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
    peak = _vm_kib("VmHWM") if measured else None
    return {
        "wall_s": wall,
        "outputs": [list(o.outputs[0].token_ids) for o in ordered],
        "ttfts": [first[str(i)] for i in range(len(prompts)) if str(i) in first],
        "cached_tokens": sum(int(o.num_cached_tokens or 0) for o in ordered),
        "peak_rss_mb": None if peak is None else round(peak / 1024, 1),
    }


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM and its libraries print freely; only `protocol` carries replies

    def reply(obj: dict[str, Any]) -> None:
        protocol.write(json.dumps(obj) + "\n")

    args = json.loads(sys.argv[1])
    try:
        start = time.perf_counter()
        llm = load(args)
        import vllm

        reply({"ready": True, "load_s": round(time.perf_counter() - start, 2),
               "version": getattr(vllm, "__version__", "unknown")})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        reply({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply(run(llm, request["prompts"], request["max_new_tokens"]))
        except Exception as err:  # noqa: BLE001
            reply({"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
