"""Measure --kv-cache-dir: one workload, each run in its own process, sharing one DIR.

    python -m kvcli.bench.disk_cache [--model smollm2-135m] [--requests 16] [--repeat 7]

Runs (1) prefill only without a disk cache (how fast this machine computes K/V), (2) cold
with an empty DIR, (3) warm on the same DIR, and prints prefill tokens computed, the first
request's time to first token, wall, and load vs compute speed in GB/s and tokens/s, with
the CPU model (timings on a shared machine are noisy: say so when quoting them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvcli.bench.measure import cpu_model

SYSTEM = ("You are Atlas, a careful and friendly assistant for a small public library. Answer "
          "the visitor's question in two or three short sentences of plain English. ")
QUESTIONS = ["When are you open?", "How many books can I borrow?", "What does a late return "
             "cost?", "Can I renew online?", "Do you have a printer?", "Is there wifi?",
             "Can children join?", "Where do I park?"]


def prompts(n: int, repeat: int) -> list[dict[str, Any]]:
    """``n`` chat requests sharing a long system prompt (``repeat`` copies of SYSTEM)."""
    system = " ".join([SYSTEM] * repeat)
    return [{"messages": [{"role": "system", "content": system},
                          {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}]}
            for i in range(n)]


def child(args: argparse.Namespace) -> None:
    from kvcli import LLM, SamplingParams

    engine = {"kv_cache_dir": args.dir} if args.dir else {}
    llm = LLM(args.model, **engine)
    t0 = time.perf_counter()
    outs = llm.generate(prompts(args.requests, args.repeat),
                        SamplingParams(max_tokens=args.max_tokens))
    wall = time.perf_counter() - t0
    stats = llm.engine.stats()
    print(json.dumps({"wall_s": wall, "first_ttft_s": outs[0].time_to_first_token,
                      "prefill_tokens_computed": stats["prefill_tokens_computed"],
                      "forward_s": stats["forward_s"], "disk": stats.get("disk_cache"),
                      "texts": [o.outputs[0].text for o in outs]}))


def run(args: argparse.Namespace, kv_dir: str | None, max_tokens: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kvcli.bench.disk_cache", "--child", "--model", args.model,
           "--requests", str(args.requests), "--repeat", str(args.repeat),
           "--max-tokens", str(max_tokens)] + (["--dir", kv_dir] if kv_dir else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--repeat", type=int, default=60,
                   help="copies of the system prompt (60: ~1,900 tokens)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="kvcli-kv-bench-") as tmp:
        compute = run(args, None, 1)
        cold = run(args, str(Path(tmp) / "kv"), args.max_tokens)
        warm = run(args, str(Path(tmp) / "kv"), args.max_tokens)
    report(compute, cold, warm, args)


def report(compute: dict, cold: dict, warm: dict, args: argparse.Namespace) -> None:
    disk = warm["disk"]
    kv_bytes_per_token = disk["bytes_read"] / max(1, disk["hit_tokens"])
    compute_tok_s = compute["prefill_tokens_computed"] / compute["forward_s"]
    load_tok_s = disk["hit_tokens"] / disk["load_s"] if disk["load_s"] else float("nan")
    print(f"kvcli --kv-cache-dir, {args.model}, {args.requests} requests, on {cpu_model()}")
    for name, r in (("cold", cold), ("warm", warm)):
        print(f"  {name:<5} prefill computed {r['prefill_tokens_computed']:>6,} tokens, first "
              f"TTFT {r['first_ttft_s']:7.3f} s, wall {r['wall_s']:7.2f} s")
    print(f"  first TTFT {cold['first_ttft_s'] / warm['first_ttft_s']:.1f}x lower warm, wall "
          f"{cold['wall_s'] / warm['wall_s']:.1f}x lower; same texts: "
          f"{cold['texts'] == warm['texts']}")
    print(f"  load    {load_tok_s:>10,.0f} tokens/s  {load_tok_s * kv_bytes_per_token / 1e9:.3f} "
          f"GB/s ({disk['hit_blocks']} blocks, {disk['bytes_read'] / 1e6:.1f} MB)")
    print(f"  compute {compute_tok_s:>10,.0f} tokens/s  "
          f"{compute_tok_s * kv_bytes_per_token / 1e9:.4f} GB/s of K/V (prefill only, no cache)")
    print(f"  loading is {load_tok_s / compute_tok_s:,.0f}x faster than computing")


if __name__ == "__main__":
    main()
