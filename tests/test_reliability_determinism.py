"""Determinism: the same input and seeds give byte-identical output files, whatever the schedule.

One input mixes greedy and sampled lines (temperature 0.8, with and without
top-p/top-k, n=2, an explicit seed), with and without a shared prefix. It runs
with the default schedule, twice, then with one sequence at a time, with prefill
chunks of 7 and 33 tokens, with a KV pool so small that requests are preempted,
and without prefix caching. Every file is compared byte for byte (``--ordered``,
``--token-ids``); only ``usage.cached_tokens`` may differ: without prefix caching
(0 by definition) and with cache-aware admission (another request computes the
shared prefix first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main

PREFIX = "Caching the keys and values of a shared prompt prefix saves a great deal of work. "
SAMPLED = [{"temperature": 0.8}, {"temperature": 0.8, "top_p": 0.9},
           {"temperature": 0.8, "top_k": 20}, {"temperature": 0.8, "n": 2},
           {"temperature": 0.8, "seed": 5}]


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory) -> tuple[Path, Path]:
    lines = [{"id": f"d{i}", "prompt": (PREFIX if i % 2 else "") + f"The fox number {i} went",
              "max_tokens": 12 + i % 7, **(SAMPLED[i // 2 % 5] if i % 3 else {})}
             for i in range(30)]
    inp = tmp_path_factory.mktemp("determinism") / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return inp, tiny_models["llama"]


def generate(setup: tuple[Path, Path], tmp_path: Path, name: str, *args: str) -> bytes:
    inp, model = setup
    out = tmp_path / f"{name}.jsonl"
    res = CliRunner().invoke(main, ["generate", str(inp), "-o", str(out), "--model", str(model),
                                    "--ordered", "--token-ids", "--ignore-eos", "-q", *args],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return out.read_bytes()


@pytest.fixture(scope="module")
def base(setup, tmp_path_factory) -> bytes:
    return generate(setup, tmp_path_factory.mktemp("base"), "base")


def without_cached_tokens(data: bytes) -> list[dict]:
    rows = [json.loads(line) for line in data.splitlines()]
    for row in rows:
        row["usage"].pop("cached_tokens")
    return rows


def test_same_input_and_seed_give_byte_identical_files_whatever_the_schedule(setup, base,
                                                                           tmp_path):
    rows = [json.loads(line) for line in base.splitlines()]
    assert len(rows) == 30 and sum(r["usage"]["cached_tokens"] > 0 for r in rows) >= 10
    schedules = {
        "again": (),
        "one-at-a-time": ("--max-num-seqs", "1"),
        "chunks-of-7": ("--max-num-batched-tokens", "7"),
        "3-seqs-chunks-of-33": ("--max-num-seqs", "3", "--max-num-batched-tokens", "33"),
        "preempting-pool": ("--num-blocks", "8"),
    }
    for name, args in schedules.items():
        assert generate(setup, tmp_path, name, *args) == base, name
    uncached = generate(setup, tmp_path, "no-prefix-caching", "--no-prefix-caching")
    assert all(json.loads(line)["usage"]["cached_tokens"] == 0 for line in uncached.splitlines())
    assert without_cached_tokens(uncached) == without_cached_tokens(base)
    # cache-aware admits a prefix group's members together: which one computes the shared
    # prefix (0 cached) and which ones hit it changes, the completions do not.
    reordered = generate(setup, tmp_path, "cache-aware", "--scheduling", "cache-aware")
    assert without_cached_tokens(reordered) == without_cached_tokens(base)


def test_the_run_seed_changes_only_sampled_lines_without_their_own_seed(setup, base, tmp_path):
    seed0 = [json.loads(line) for line in base.splitlines()]
    other = [json.loads(line) for line in generate(setup, tmp_path, "seed1", "--seed", "1")
             .splitlines()]
    inp, _ = setup
    lines = [json.loads(line) for line in inp.read_text().splitlines()]
    changed = {line["id"] for line, a, b in zip(lines, seed0, other, strict=True) if a != b}
    sampled_unseeded = {line["id"] for line in lines
                        if line.get("temperature") and "seed" not in line}
    assert changed == sampled_unseeded
