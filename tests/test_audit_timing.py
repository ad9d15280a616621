"""Time-aware provider replay: request times, cache lifetimes, and the cost estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit_support import SYSTEM, audit_json, chat, run, system, user, write_jsonl

from kvcli.audit.timing import Cost, TimeFieldError, request_time

LONG = SYSTEM * 8  # past the providers' 1024-token minimum


def _rows(times: list[float | None], **extra: object) -> list[dict]:
    rows = []
    for i, t in enumerate(times):
        row = chat([system(LONG), user(f"Question {i}?")], id=f"r{i}", model="gpt-4o", **extra)
        if t is not None:
            row["created"] = t
        rows.append(row)
    return rows


def test_request_times_from_the_usual_fields() -> None:
    assert request_time({"created": 1_700_000_000}, None) == 1_700_000_000
    assert request_time({"created": 1_700_000_000_500}, None) == 1_700_000_000.5  # milliseconds
    assert request_time({"timestamp": "2026-01-05T10:00:00Z"}, None) == 1767607200.0
    assert request_time({"body": {"metadata": {"ts": 5}}}, "metadata.ts") == 5.0
    assert request_time({"messages": []}, None) is None
    with pytest.raises(TimeFieldError, match="created: expected Unix seconds or an ISO 8601 time"):
        request_time({"created": "yesterday"}, None)


def test_a_bad_time_is_that_line_s_problem(tmp_path: Path) -> None:
    rows = _rows([0, None])
    rows[1]["created"] = "soon"
    result = run([str(write_jsonl(tmp_path / "r.jsonl", rows)), "--profile", "openai"])
    assert "r.jsonl:2: created: expected Unix seconds or an ISO 8601 time, got 'soon'" in result.output


def test_openai_prefixes_expire_after_five_idle_minutes(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, _rows([0, 60, 460, 470]), "--profile", "openai")
    cached = [p["cached_tokens"] for p in doc["prompts"]]
    assert cached[0] == 0 and cached[1] > 1024 and cached[2] == 0 and cached[3] == cached[1]
    replay = doc["provider_replay"]
    assert (replay["ttl_s"], replay["timed"], replay["expired_tokens"]) == (300, 4, cached[1])
    longer = audit_json(tmp_path, _rows([0, 60, 460, 470]), "--profile", "openai", "--cache-ttl", "1000")
    assert [p["cached_tokens"] for p in longer["prompts"]][2] == cached[1]


def test_without_times_the_replay_says_it_assumes_no_expiry(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", _rows([None, None]))
    text = run([str(path), "--profile", "openai"]).stdout
    assert "the replay assumes no expiry" in text


def _anthropic(times: list[float]) -> list[dict]:
    system_blocks = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    return [{"model": "claude-sonnet-4-5", "system": system_blocks, "created": t,
             "messages": [{"role": "user", "content": f"Question {i}?"}]} for i, t in enumerate(times)]


def test_anthropic_reads_refresh_the_five_minute_lifetime(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, _anthropic([0, 200, 450, 800, 900]), "--profile", "anthropic")
    cached = [p["cached_tokens"] for p in doc["prompts"]]
    # 200 s after the write: read (refreshed); 250 s after that read: read again; 350 s: expired.
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0 and cached[3] == 0 and cached[4] > 0


def test_cost_uses_the_provider_multipliers(tmp_path: Path) -> None:
    doc = audit_json(tmp_path, _rows([None, None, None]), "--profile", "openai")
    tokens, cached = doc["summary"]["tokens"], doc["summary"]["cached_tokens"]
    assert doc["provider_replay"]["relative_input_cost"] == pytest.approx((tokens - 0.5 * cached) / tokens)
    cost = Cost("anthropic")
    cost.add("claude-sonnet-4-5", 2000, 1000, 500)
    assert cost.relative == pytest.approx((500 + 1000 * 0.1 + 500 * 1.25) / 2000)
    gpt5 = Cost("openai")
    gpt5.add("gpt-5-mini", 1000, 1000)
    assert gpt5.relative == pytest.approx(0.1)


def test_engines_expire_only_when_given_a_lifetime(tmp_path: Path) -> None:
    assert audit_json(tmp_path, _rows([0, 1000]))["provider_replay"] is None
    doc = audit_json(tmp_path, _rows([0, 1000]), "--cache-ttl", "600")
    assert [p["cached_tokens"] for p in doc["prompts"]] == [0, 0]
    assert json.dumps(doc["provider_replay"]["ttl_s"]) == "600.0"
