"""Under eviction, `kvcli audit --cache-size N blocks` predicts what `kvcli generate --num-blocks N`
reports line by line: the replay runs the engine's own KV-cache manager."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvcli.cli import main

SYSTEMS = [f"You are assistant {name}. Answer briefly and politely, cite the manual, never guess. " * 2
           for name in ("Ada", "Bob", "Cyd")]


def _rows() -> list[dict]:
    """Three applications interleaved, each a conversation of growing turns: a pool of a few
    prompts' worth of blocks evicts one application's prefix while the others run."""
    rows, history = [], {name: [{"role": "system", "content": s}] for name, s in zip("ABC", SYSTEMS, strict=True)}
    for turn in range(3):
        for name in "ABCA":
            history[name] = history[name] + [{"role": "user", "content": f"Question {turn} for {name}?"}]
            rows.append({"id": f"{name}{turn}-{len(rows)}", "messages": list(history[name])})
    return rows


def test_bounded_prediction_equals_generate_under_eviction(tmp_path: Path, tiny_models) -> None:
    model = str(tiny_models["llama"])
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    runner = CliRunner()
    audit = runner.invoke(main, ["audit", str(batch), "--model", model, "--format", "json", "--fail-on", "never",
                                 "--cache-size", "1blocks"])
    largest = json.loads(audit.stdout)["capacity"]["largest_prompt_blocks"]
    num_blocks = largest + 4  # room for one prompt and a little: the other applications get evicted
    audit = runner.invoke(main, ["audit", str(batch), "--model", model, "--format", "json", "--fail-on", "never",
                                 "--cache-size", f"{num_blocks}blocks"])
    assert audit.exit_code == 0, audit.output
    doc = json.loads(audit.stdout)
    predicted = [p["bounded_cached_tokens"] for p in doc["prompts"]]
    unbounded = [p["cached_tokens"] for p in doc["prompts"]]
    # One request at a time, each done after its first token: the order the prediction assumes.
    gen = runner.invoke(main, ["generate", str(batch), "--model", model, "--max-tokens", "1", "--num-blocks",
                               str(num_blocks), "--max-num-seqs", "1", "--quiet", "--ordered"])
    assert gen.exit_code == 0, gen.output
    actual = [json.loads(line)["usage"]["cached_tokens"] for line in gen.stdout.splitlines()]
    assert actual == predicted
    assert sum(predicted) < sum(unbounded)  # the pool evicted prefixes an unbounded cache keeps
    assert sum(predicted) > 0
    assert doc["capacity"]["bounded"]["blocks"] == num_blocks
    assert doc["capacity"]["bounded"]["cached_tokens"] == sum(predicted)
