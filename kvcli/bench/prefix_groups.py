"""A shuffled JSONL file of chat requests in prefix groups, for ``generate --input-order prefix``.

``python -m kvcli.bench.prefix_groups GROUPS PER_GROUP WORDS > groups.jsonl``: GROUPS system
prompts of WORDS random support-vocabulary words, PER_GROUP questions each, shuffled (seed 0),
``max_tokens`` 4 (prefill is what the order changes). docs/BENCHMARKS.md measures
``16 8 160`` (128 lines, ~190-token prefixes) with ``--max-pending 16 --kv-cache-memory 96MiB``.
"""

from __future__ import annotations

import argparse
import random
import sys

import orjson

VOCAB = ("refund policy order shipping account password invoice warranty return exchange "
         "delivery tracking support agent customer premium basic plan upgrade cancel billing "
         "discount coupon product feature manual install update device battery screen").split()


def prefix_group_lines(groups: int, per_group: int, words: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for g in range(groups):
        system = (f"You are support assistant number {g}. Rules: "
                  + " ".join(rng.choice(VOCAB) for _ in range(words)))
        for i in range(per_group):
            question = " ".join(rng.choice(VOCAB) for _ in range(12))
            rows.append({"id": f"g{g}-{i}", "max_tokens": 4, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {i}: {question}?"}]})
    rng.shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("groups", "per_group", "words"):
        parser.add_argument(name, type=int)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for row in prefix_group_lines(args.groups, args.per_group, args.words, args.seed):
        sys.stdout.buffer.write(orjson.dumps(row) + b"\n")


if __name__ == "__main__":
    main()
