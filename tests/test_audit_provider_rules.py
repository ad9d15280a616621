"""--provider-rules FILE: per-model minimums and prices over the built-in tables, checked per field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_audit_support import run, write_jsonl

SYSTEM = {"role": "system", "content": "You are a careful assistant for ACME Cloud. Answer from the documentation. " * 120}


def _requests(tmp_path: Path, model: str = "gpt-4.1-2025-04-14") -> Path:
    rows = [{"model": model, "messages": [SYSTEM, {"role": "user", "content": f"Question {i}: how?"}]}
            for i in range(3)]
    return write_jsonl(tmp_path / "r.jsonl", rows)


def _rules(tmp_path: Path, models: dict[str, Any]) -> Path:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"as_of": "2026-11-01", "source": "my copy", "models": models}))
    return path


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = run([str(path), "--format", "json", "--fail-on", "never", "--profile", "openai", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_model_minimum_from_the_file_applies_to_that_model_only(tmp_path: Path) -> None:
    path = _requests(tmp_path)
    assert _doc(path)["summary"]["cached_tokens"] > 0  # ~1,800 shared tokens: above OpenAI's 1,024
    rules = _rules(tmp_path, {"gpt-4.1": {"min_tokens": 4096}})
    doc = _doc(path, "--provider-rules", str(rules))
    assert doc["summary"]["cached_tokens"] == 0
    assert {f["rule"] for f in doc["findings"]} == {"below-minimum"}
    other = _requests(tmp_path, "gpt-4o-2024-08-06")
    assert _doc(other, "--provider-rules", str(rules))["summary"]["cached_tokens"] > 0


def test_prices_from_the_file(tmp_path: Path) -> None:
    path = _requests(tmp_path)
    rules = _rules(tmp_path, {"gpt-4.1-2025": {"input_usd_per_mtok": 10.0}})  # longer than the table's gpt-4.1
    doc = _doc(path, "--provider-rules", str(rules))
    usd, tokens = doc["worth"]["usd"], doc["summary"]["tokens"]
    assert usd["uncached"] == pytest.approx(tokens * 10e-6)
    assert "my copy (--provider-rules, as of 2026-11-01)" in usd["prices_as_of"]
    assert _doc(path)["worth"]["usd"]["uncached"] == pytest.approx(tokens * 2e-6)  # the table's


@pytest.mark.parametrize(("models", "message"), [
    ({"gpt-x": {"min_tokens": -1}}, "rules.json: models.gpt-x.min_tokens: expected a non-negative integer, got -1"),
    ({"gpt-x": {"min_tokens": 1.5}}, "models.gpt-x.min_tokens: expected a non-negative integer"),
    ({"gpt-x": {"ttl": 5}}, "models.gpt-x: expected an object with min_tokens and/or input_usd_per_mtok"),
    ({"gpt-x": {"input_usd_per_mtok": "cheap"}}, "models.gpt-x.input_usd_per_mtok: expected a non-negative number"),
])
def test_a_bad_rules_file_names_the_field(tmp_path: Path, models: dict[str, Any], message: str) -> None:
    result = run([str(_requests(tmp_path)), "--profile", "openai", "--provider-rules", str(_rules(tmp_path, models))])
    assert result.exit_code == 2 and message in result.stderr
