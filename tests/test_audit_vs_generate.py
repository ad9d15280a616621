"""The audit predicts exactly the prefix-cache hits `kvcli generate` reports for the same prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvcli.cli import main

SYSTEM = ("You are a helpful assistant for the quick brown fox library. Answer briefly. "
          "The capital of France is Paris and the capital of Italy is Rome. ") * 3


def _rows() -> list[dict]:
    questions = ["What is the weather like today?", "Where does the fox live?",
                 "Name the capital of Germany.", "What is 12 plus 345?"]
    rows = [{"id": f"q{i}", "messages": [{"role": "system", "content": SYSTEM},
                                         {"role": "user", "content": q}]}
            for i, q in enumerate(questions)]
    rows.append({"id": "plain", "prompt": SYSTEM + " Once upon a time"})
    rows.append({"id": "salted", "cache_salt": "tenant-b", "messages": rows[0]["messages"]})
    rows += _structured_rows(rows[0]["messages"])
    return rows


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _structured_rows(messages: list[dict]) -> list[dict]:
    """Lines with a schema and with tools: the constraint changes no prompt token, the tools do
    (the template renders them), and the audit predicts both."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    return [{"id": "schema", "messages": messages, "response_format": fmt},
            {"id": "tools", "messages": messages, "tools": TOOLS},
            {"id": "tools-again", "messages": messages, "tools": TOOLS, "tool_choice": "none"}]


@pytest.mark.parametrize("max_num_seqs", ["1", "64"])
def test_generate_cached_tokens_equal_audit_prediction(tmp_path: Path, tiny_models, max_num_seqs):
    model = str(tiny_models["llama"])
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    runner = CliRunner()
    gen = runner.invoke(main, ["generate", str(batch), "--model", model, "--max-tokens", "4",
                               "--max-num-seqs", max_num_seqs, "--quiet", "--ordered"])
    assert gen.exit_code == 0, gen.output
    results = [json.loads(line) for line in gen.stdout.splitlines()]
    audit = runner.invoke(main, ["audit", str(batch), "--model", model, "--format", "json",
                                 "--fail-on", "never"])
    assert audit.exit_code == 0, audit.output
    predicted = [p["cached_tokens"] for p in json.loads(audit.stdout)["prompts"]]
    actual = [r["usage"]["cached_tokens"] for r in results]
    assert actual == predicted
    assert all(c > 0 for c in actual[1:4])  # the shared system prompt is served from the cache
    assert actual[4] == 0  # a plain prompt does not start with the chat template
    assert actual[5] == 0  # another tenant's salt never shares a block
    assert actual[6] > 0 and actual[8] > actual[7]  # schema: same prompt; tools: cached again
