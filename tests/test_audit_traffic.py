"""Real traffic in: logged request+response pairs, the provider's actual cached tokens beside the
audit's prediction, and every request where they disagree named with the likelier side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_audit_support import run, write_jsonl

from kvcli.audit.traffic import LESS, MORE, Actual, actual_of

SYSTEM = {"role": "system", "content": "You are a careful assistant for ACME Cloud. Answer from the documentation. " * 120}


def _requests() -> list[dict[str, Any]]:
    return [{"model": "gpt-4o-2024-08-06", "messages": [SYSTEM, {"role": "user", "content": f"Question {i}: how?"}]}
            for i in range(4)]


def _response(cached: int, prompt_tokens: int, created: int) -> dict[str, Any]:
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": created, "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 10,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = run([str(path), "--format", "json", "--fail-on", "never", "--profile", "openai", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_actual_cached_tokens_beside_the_prediction(tmp_path: Path) -> None:
    plain = _doc(write_jsonl(tmp_path / "plain.jsonl", _requests()))
    predicted = [p["cached_tokens"] for p in plain["prompts"]]
    tokens = [p["tokens"] for p in plain["prompts"]]
    assert predicted[0] == 0 and min(predicted[1:]) >= 1024
    actual = [0, predicted[1], 0, predicted[3] + 512]  # a miss the provider made, and more than predicted
    pairs = [{"custom_id": f"r{i}", "request": req, "response": _response(a, tokens[i] + 7, 1_700_000_000 + 10 * i)}
             for i, (req, a) in enumerate(zip(_requests(), actual, strict=True))]
    doc = _doc(write_jsonl(tmp_path / "pairs.jsonl", pairs))
    assert [p["cached_tokens"] for p in doc["prompts"]] == predicted  # the request is audited as given
    assert [p["id"] for p in doc["prompts"]] == ["r0", "r1", "r2", "r3"]
    t = doc["traffic"]
    assert t["requests"] == 4 and t["agree"] == 2
    assert t["actual_cached_tokens"] == sum(actual) and t["predicted_cached_tokens"] == sum(predicted)
    assert t["provider_prompt_tokens"] == sum(tokens) + 28
    assert [(d["prompt"], d["id"], d["predicted"], d["actual"], d["why"]) for d in t["disagree"]] == [
        (2, "r2", predicted[2], 0, LESS), (3, "r3", predicted[3], predicted[3] + 512, MORE)]
    assert doc["provider_replay"]["timed"] == 4  # the response's `created` is the request's time
    text = run([str(tmp_path / "pairs.jsonl"), "--profile", "openai", "--fail-on", "never"]).output
    assert "── provider's actual cache" in text and '2 agree within a block (128 tokens), 2 disagree' in text
    assert f'prompt 2 "r2"  {tmp_path / "pairs.jsonl"}:3: predicted {predicted[2]:,}, actual 0 cached tokens' in text
    assert plain["traffic"] is None


def test_usage_shapes() -> None:
    assert actual_of({"usage": {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1920}}}) == \
        Actual(1920, 2000)
    assert actual_of({"usage": {"input_tokens": 50, "cache_read_input_tokens": 4000,
                                "cache_creation_input_tokens": 300}}) == Actual(4000, 4350)  # Anthropic
    assert actual_of({"usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 0}}}) == \
        Actual(0, 900)  # the Responses API
    assert actual_of({"status_code": 200, "body": {"usage": {"prompt_tokens": 10}}}) == Actual(0, 10)  # batch output
    assert actual_of({"error": "x"}) is None


def test_a_batch_output_file_is_joined_by_custom_id(tmp_path: Path) -> None:
    inputs = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
              for i, body in enumerate(_requests())]
    source = write_jsonl(tmp_path / "batch_input.jsonl", inputs)
    predicted = [p["cached_tokens"] for p in _doc(source)["prompts"]]
    outputs = [{"id": f"batch_req_{i}", "custom_id": f"b{i}", "error": None,
                "response": {"status_code": 200, "request_id": "x", "body": _response(c, 1900, 0)}}
               for i, c in ((3, 0), (1, predicted[1]), (0, 0))]  # any order; b2 has no output line
    outputs.append({"custom_id": "b9", "result": {"type": "succeeded", "message": {
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 0}}}})  # Anthropic's shape, no such input
    results = write_jsonl(tmp_path / "batch_output.jsonl", outputs + [{"unrelated": True}])
    result = run([str(source), "--profile", "openai", "--format", "json", "--fail-on", "never",
                  "--responses", str(results)])
    assert result.exit_code == 0, result.output
    assert "batch_output.jsonl:5: --responses: not a batch output line" in result.stderr
    t = json.loads(result.stdout)["traffic"]
    assert t["joined"] == {"file": str(results), "output_lines": 4, "joined": 3}
    assert t["requests"] == 3 and [d["id"] for d in t["disagree"]] == ["b3"]  # predicted > 0, actual 0
