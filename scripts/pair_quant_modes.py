"""Decode-1 and batched prefill of the default model, gguf vs gguf-int (and float32), paired:
the modes alternate in one process, the ratio is taken per pair and its median printed, so a
loaded machine's drift cancels.

    PYTHONPATH=. python scripts/pair_quant_modes.py [--pairs 5] [--modes none,gguf,gguf-int]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from kvcli import LLM, SamplingParams


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--modes", default="gguf,gguf-int")
    args = parser.parse_args()
    modes = args.modes.split(",")
    engines = {m: LLM(quantization=None if m == "none" else m) for m in modes}
    decode = ([list(range(1000, 1055))], SamplingParams(max_tokens=128, temperature=0.0,
                                                        ignore_eos=True))
    prefill = ([list(range(2000 + 600 * i, 2000 + 600 * i + 512)) for i in range(8)],
               SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    print(f"CPU {_cpu()}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    for name, (prompts, sp) in {"decode-1 (128 tokens)": decode,
                                "prefill (8 x 512 tokens)": prefill}.items():
        times: dict[str, list[float]] = {m: [] for m in modes}
        for e in engines.values():  # warm-up
            e.generate([{"prompt_token_ids": p} for p in prompts], sp)
        for _ in range(args.pairs):
            for m, e in engines.items():
                e.engine.reset_prefix_cache()
                start = time.perf_counter()
                e.generate([{"prompt_token_ids": p} for p in prompts], sp)
                times[m].append(time.perf_counter() - start)
        base = modes[0]
        for m in modes:
            ratio = statistics.median(b / t for b, t in zip(times[base], times[m], strict=True))
            rate = (128 if "decode" in name else 8 * 512) / statistics.median(times[m])
            print(f"{name:>26} {m:>9}: median {statistics.median(times[m]):.3f} s, {rate:.1f} "
                  f"tok/s, {ratio:.2f}x {base} (paired)")
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
