"""What the cache is worth: --prefill-tok-s seconds, provider dollars at the price table, and
"too short" (a shared prefix below one block or the provider minimum) apart from "not shared"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_audit_support import SAMPLES, run, write_jsonl

from kvcli.audit.timing import Cost, input_price

STORIES = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K"


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = run([str(path), "--format", "json", "--fail-on", "never", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_prefill_rate_turns_saved_tokens_into_seconds() -> None:
    doc = _doc(SAMPLES, "--prefill-tok-s", "4000", "--cache-size", "3000")
    s, w = doc["summary"], doc["worth"]
    assert w["saved_tokens"] == s["cached_tokens"] and w["tokens"] == s["tokens"]
    assert w["prefill_s_uncached"] == pytest.approx(s["tokens"] / 4000)
    assert w["prefill_s_cached"] == pytest.approx((s["tokens"] - s["cached_tokens"]) / 4000)
    assert w["bounded_saved_tokens"] == doc["capacity"]["bounded"]["cached_tokens"]
    text = run([str(SAMPLES), "--prefill-tok-s", "4000", "--fail-on", "never"]).output
    saved = (s["cached_tokens"]) / 4000
    assert f"{saved:,.1f} s saved" in text and "an estimate at --prefill-tok-s 4,000" in text
    assert "── worth" not in run([str(SAMPLES), "--fail-on", "never"]).output  # asked for only


def test_too_short_is_reported_apart_from_not_shared(tmp_path: Path) -> None:
    base = list(range(100, 140))  # 40 tokens: two full blocks of 16 and a tail of 8
    rows = [{"prompt_token_ids": base},
            {"prompt_token_ids": base[:5] + [7] * 30},  # shares 5 tokens: less than a block
            {"prompt_token_ids": [9] * 30},  # shares nothing
            {"prompt_token_ids": base[:20] + [8] * 30}]  # shares 20: one block and a 4-token tail
    if not (STORIES / "tokenizer.json").is_file():
        pytest.skip("shared/models/stories260K is not available")
    doc = _doc(write_jsonl(tmp_path / "ids.jsonl", rows), "--model", str(STORIES))  # ids hashed as given
    w = doc["worth"]
    assert w["not_shared"] == 2  # the first prompt, and the one sharing nothing
    assert w["too_short"] == {"prompts": 1, "tokens": 5, "below_tokens": 16}
    assert w["shared_tail_tokens"] == 4
    assert doc["summary"]["cached_tokens"] == 16


def test_provider_dollars_at_the_price_table() -> None:
    assert input_price("openai", "gpt-4o-mini-2024-07-18") == pytest.approx(0.15e-6)  # longest prefix
    assert input_price("openai", "gpt-4o-2024-08-06") == pytest.approx(2.5e-6)
    assert input_price("openai", "my-own-model") is None
    cost = Cost("anthropic")
    cost.add("claude-sonnet-4-20250514", 10_000, cached=6_000, written=2_000)
    assert cost.usd_uncached == pytest.approx(10_000 * 3e-6)
    assert cost.usd_cached == pytest.approx((2_000 + 6_000 * 0.1 + 2_000 * 1.25) * 3e-6)
    cost.add("claude-unknown", 5, 0)
    assert cost.unpriced == 1 and cost.models == {"claude-sonnet-4-20250514"}


def test_provider_report_gives_dollars_with_and_without_the_cache(tmp_path: Path) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 300}
    rows = [{"model": "gpt-4.1-2025-04-14", "messages": [system, {"role": "user", "content": f"Question {i}?"}]}
            for i in range(3)]
    path = write_jsonl(tmp_path / "r.jsonl", rows)
    doc = _doc(path, "--profile", "openai")
    usd, tokens, cached = doc["worth"]["usd"], doc["summary"]["tokens"], doc["summary"]["cached_tokens"]
    assert cached > 0 and usd["models"] == ["gpt-4.1-2025-04-14"] and usd["prices_as_of"] == "2025-08"
    assert usd["uncached"] == pytest.approx(tokens * 2e-6)
    assert usd["cached"] == pytest.approx(((tokens - cached) + cached * 0.25) * 2e-6)
    text = run([str(path), "--profile", "openai", "--fail-on", "never"]).output
    assert "without the cache" in text and "gpt-4.1-2025-04-14 list prices of 2025-08" in text


def test_anthropic_writes_no_request_reads_are_reported(tmp_path: Path) -> None:
    """A breakpoint on per-request content writes (billed 1.25x) what no later request reads;
    the one on the shared system prompt is read by every later request."""
    marker = {"type": "ephemeral"}
    system = [{"type": "text", "text": "You are a careful assistant for ACME Cloud. " * 200, "cache_control": marker}]
    rows = [{"model": "claude-sonnet-4-20250514", "system": system, "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"Question {i}: how?", "cache_control": marker}]}]}
        for i in range(3)]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    unread = _doc(path, "--profile", "anthropic")["worth"]["unread_writes"]
    assert unread["writes"] == 3  # each request's own question; the system write was read
    assert 0 < unread["tokens"] < 3 * 30  # the questions' tokens, not the system prompt's again
    assert unread["first"][0] == f"{path}:1 messages[0] user"
    text = run([str(path), "--profile", "anthropic", "--fail-on", "never"]).output
    assert "unread cache writes: 3 breakpoint write(s)" in text
    assert _doc(path)["worth"]["unread_writes"] is None  # engine profiles write no breakpoints
