"""A Mooncake-style hash-id trace, generated: multi-turn conversations over shared system prompts.

`python -m kvcli.bench.audit_trace OUT.jsonl` writes 12,000 requests of about 145 M input tokens
in 512-token blocks (the size of Mooncake's FAST'25 conversation trace); then time
`kvcli audit --trace-block-size 512 OUT.jsonl --cache-size ...` with /usr/bin/time -v.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(slots=True)
class TraceShape:
    requests: int = 12_000
    block_size: int = 512
    systems: int = 40  # shared system prompts (with tools), in blocks below
    system_blocks: tuple[int, int] = (2, 10)
    turn_blocks: tuple[int, int] = (1, 4)  # a turn adds the answer and the next question
    first_blocks: tuple[int, int] = (1, 16)  # a conversation's first user message (documents)
    turns: tuple[int, int] = (1, 12)
    live: int = 64  # conversations open at once
    rate_per_s: float = 3.0  # Poisson arrivals
    whole_blocks: bool = True  # False: no input_length is a whole number of blocks


def generate(shape: TraceShape, seed: int = 0) -> Iterator[dict[str, object]]:
    """Trace lines in arrival order; ids numbered in order of first use, as Mooncake's are."""
    rng = random.Random(seed)
    counter = iter(range(1 << 62))
    systems = [[next(counter) for _ in range(rng.randint(*shape.system_blocks))] for _ in range(shape.systems)]
    open_: list[tuple[list[int], int]] = []  # (full-block history, turns left)
    now = 0.0
    bs = shape.block_size
    for _ in range(shape.requests):
        if len(open_) < shape.live or rng.random() < 0.1:
            system = systems[min(int(rng.expovariate(0.25)), shape.systems - 1)]  # a few are popular
            history = system + [next(counter) for _ in range(rng.randint(*shape.first_blocks))]
            slot = len(open_)
            open_.append((history, rng.randint(*shape.turns)))
        else:
            slot = rng.randrange(len(open_))
            history, left = open_[slot]
            history = history + [next(counter) for _ in range(rng.randint(*shape.turn_blocks))]
            open_[slot] = (history, left)
        history, left = open_[slot]
        tail = rng.randrange(0 if shape.whole_blocks else 1, bs)
        ids = history + ([next(counter)] if tail else [])  # the partial last block: its own id
        now += rng.expovariate(shape.rate_per_s)
        yield {"timestamp": int(now * 1000), "input_length": len(history) * bs + tail,
               "output_length": rng.randint(16, 600), "hash_ids": ids}
        if left <= 1:
            open_.pop(slot)
        else:
            open_[slot] = (history, left - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scale = 512 // args.block_size  # the same tokens in smaller blocks
    shape = TraceShape(args.requests, args.block_size)
    if scale > 1:
        shape = TraceShape(args.requests, args.block_size, system_blocks=(2 * scale, 10 * scale),
                           turn_blocks=(scale, 4 * scale), first_blocks=(scale, 16 * scale))
    tokens = 0
    with args.out.open("wb") as f:
        for line in generate(shape, args.seed):
            tokens += int(line["input_length"])  # type: ignore[call-overload]
            f.write(orjson.dumps(line) + b"\n")
    print(f"wrote {args.out}: {args.requests:,} requests, {tokens:,} input tokens, block size {args.block_size}")


if __name__ == "__main__":
    main()
