"""OpenAI's explicit prompt_cache_breakpoint (gpt-5.6 and later): reads at breakpoints with no
lookback limit, the implicit one at the newest user or tool message, writes billed 1.25x; on
other models "not offered"; findings for breakpoints below the minimum and after per-request
content (never read), for Anthropic's cache_control as well."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_audit_support import run, write_jsonl

from kvcli.audit.profiles import PROFILES
from kvcli.audit.timing import Cost

SYSTEM = "You are a careful assistant for ACME Cloud. Answer from the documentation. " * 120
MARK = {"mode": "explicit"}


def _text(text: str, mark: bool = False) -> dict[str, Any]:
    return {"type": "text", "text": text, **({"prompt_cache_breakpoint": MARK} if mark else {})}


def _row(model: str, question: str, *, system_mark: bool = True, question_mark: bool = False,
         **extra: Any) -> dict[str, Any]:
    return {"model": model, **extra, "messages": [
        {"role": "system", "content": [_text(SYSTEM, system_mark)]},
        {"role": "user", "content": [_text(question, question_mark)]}]}


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = run([str(path), "--format", "json", "--fail-on", "never", "--profile", "openai", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _findings(doc: dict[str, Any]) -> list[tuple[int, str]]:
    return [(f["prompt"], f["message"]) for f in doc["findings"] if f["rule"] == "cache-breakpoints"]


def test_the_rule_table_is_per_model() -> None:
    openai = PROFILES["openai"]
    assert openai.takes_breakpoints("gpt-5.6") and openai.takes_breakpoints("gpt-5.6-mini-2026-07-01")
    assert not openai.takes_breakpoints("gpt-4o") and not openai.takes_breakpoints(None)
    assert PROFILES["anthropic"].takes_breakpoints("claude-opus-4-5")
    assert not PROFILES["kvcli"].takes_breakpoints("gpt-5.6")
    cost = Cost("openai")
    assert cost.multipliers("gpt-5.6")[1] == 1.25 and cost.multipliers("gpt-4o")[1] == 1.0


def test_breakpoint_reads_exactly_at_the_marked_prefix(tmp_path: Path) -> None:
    rows = [_row("gpt-5.6", f"Question {i}?") for i in range(3)]
    doc = _doc(write_jsonl(tmp_path / "a.jsonl", rows))
    cached = [p["cached_tokens"] for p in doc["prompts"]]
    after = doc["prompts"][1]["tokens"] - cached[1]  # the question's message and the generation prompt
    assert cached[0] == 0 and cached[1] == cached[2]
    assert 5 < after < 40 and cached[1] % 128 != 0  # read at the system prompt's end: no 128-token steps
    old = _doc(write_jsonl(tmp_path / "b.jsonl", [_row("gpt-4o", f"Question {i}?", system_mark=False)
                                                   for i in range(3)]))
    assert [p["cached_tokens"] for p in old["prompts"]][1] % 128 == 0  # automatic caching: 128-token steps
    assert _findings(old) == []


def test_implicit_breakpoint_and_explicit_mode(tmp_path: Path) -> None:
    """Without markers the implicit breakpoint at the newest user message makes a conversation's
    next turn read its previous turn; mode "explicit" without a marker caches nothing."""
    turn1 = {"model": "gpt-5.6", "messages": [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": "First question?"}]}
    turn2 = {"model": "gpt-5.6", "messages": [*turn1["messages"], {"role": "assistant", "content": "An answer."},
                                              {"role": "user", "content": "Second question?"}]}
    doc = _doc(write_jsonl(tmp_path / "c.jsonl", [turn1, turn2]))
    assert doc["prompts"][1]["cached_tokens"] >= doc["prompts"][0]["tokens"] - 20  # up to the first question
    explicit = [{**turn1, "prompt_cache_options": {"mode": "explicit"}},
                {**turn2, "prompt_cache_options": {"mode": "explicit"}}]
    doc = _doc(write_jsonl(tmp_path / "d.jsonl", explicit))
    assert [p["cached_tokens"] for p in doc["prompts"]] == [0, 0]
    assert any('"explicit" and no block has a prompt_cache_breakpoint' in m for _, m in _findings(doc))


def test_findings_not_offered_below_minimum_too_many_and_unread(tmp_path: Path) -> None:
    short = {"model": "gpt-5.6", "messages": [{"role": "system", "content": [_text("Be brief.", True)]},
                                              {"role": "user", "content": "Hi?"}]}
    many = {"model": "gpt-5.6", "messages": [{"role": "system", "content": [_text(SYSTEM[:900 * i + 900], True)
                                                                            for i in range(5)]},
                                             {"role": "user", "content": "Hi?"}]}
    rows = [_row("gpt-5.6", f"Question {i}?", question_mark=True) for i in range(3)]
    rows += [_row("gpt-4o", "Question?"), short, many]
    doc = _doc(write_jsonl(tmp_path / "e.jsonl", rows))
    found = _findings(doc)
    assert any(p == 3 and "on gpt-4o: explicit breakpoints are not offered" in m for p, m in found)
    assert any(p == 4 and "below gpt-5.6's minimum cacheable prefix of 1,024 tokens" in m for p, m in found)
    assert any(p == 5 and "5 prompt_cache_breakpoint markers; OpenAI writes only the latest 3" in m for p, m in found)
    [unread] = [m for p, m in found if "after per-request content" in m]
    # the system marker was read: no finding; the last question's write: no later request had its prefix
    assert "at messages[1] user, 2 requests wrote" in unread
    assert doc["worth"]["unread_writes"]["writes"] >= 3
    usd = doc["worth"]["usd"]
    assert usd["cached"] > 0 and "gpt-5.6" in usd["models"]


def test_anthropic_breakpoint_after_per_request_content_is_a_finding(tmp_path: Path) -> None:
    marker = {"type": "ephemeral"}
    system = [{"type": "text", "text": SYSTEM, "cache_control": marker}]
    rows = [{"model": "claude-sonnet-4-20250514", "system": system, "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"Question {i}: how?", "cache_control": marker}]}]}
        for i in range(3)]
    doc = _doc(write_jsonl(tmp_path / "f.jsonl", rows), "--profile", "anthropic")
    [(prompt, message)] = [(p, m) for p, m in _findings(doc) if "after per-request content" in m]
    assert prompt == 0 and "at messages[0] user, 2 requests wrote" in message


def test_a_conversations_last_turn_is_not_after_per_request_content(tmp_path: Path) -> None:
    """The recommended pattern: a breakpoint on each turn's last user message. Every turn's write is
    read by the next one; the last turn's write is never read, but no later request had its prefix."""
    marker = {"type": "ephemeral"}

    def turn(session: str, n: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for k in range(n):
            if k:
                messages.append({"role": "assistant", "content": f"Answer {k} in {session}."})
            last = k == n - 1
            messages.append({"role": "user", "content": [{"type": "text", "text": f"{session} question {k}?",
                                                           **({"cache_control": marker} if last else {})}]})
        return {"model": "claude-sonnet-4-20250514", "session_id": session, "messages": messages,
                "system": [{"type": "text", "text": SYSTEM, "cache_control": marker}]}

    rows = [turn(s, n) for n in (1, 2, 3) for s in ("a", "b")]
    doc = _doc(write_jsonl(tmp_path / "conv.jsonl", rows), "--profile", "anthropic")
    assert all(p["cached_tokens"] > 1000 for p in doc["prompts"][1:])
    assert doc["worth"]["unread_writes"]["writes"] == 2  # the two conversations' last turns
    assert not [m for _, m in _findings(doc) if "after per-request content" in m]


@pytest.mark.parametrize("value", [True, False])
def test_provider_rules_add_or_remove_a_breakpoint_model(tmp_path: Path, value: bool) -> None:
    rules = tmp_path / "rules.json"
    model = "gpt-5.7" if value else "gpt-5.6"
    rules.write_text(json.dumps({"as_of": "2026-12-01", "models": {model: {"breakpoints": value}}}))
    rows = [_row(model, f"Question {i}?") for i in range(2)]
    doc = _doc(write_jsonl(tmp_path / "g.jsonl", rows), "--provider-rules", str(rules))
    offered = [m for _, m in _findings(doc) if "not offered" in m]
    assert bool(offered) is (not value)
    assert (doc["prompts"][1]["cached_tokens"] % 128 != 0) is value
    rules.write_text(json.dumps({"models": {model: {"breakpoints": "yes"}}}))
    bad = run([str(tmp_path / "g.jsonl"), "--profile", "openai", "--provider-rules", str(rules)])
    assert bad.exit_code == 2 and "breakpoints: expected true or false" in bad.output


@pytest.mark.parametrize("ttl", [None, "1h"])
def test_anthropic_one_hour_breakpoints_live_an_hour_and_write_at_2x(tmp_path: Path, ttl: str | None) -> None:
    marker = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    system = [{"type": "text", "text": SYSTEM, "cache_control": marker}]
    rows = [{"model": "claude-sonnet-4-20250514", "created": 1_764_670_000 + 1800 * i, "system": system,
             "messages": [{"role": "user", "content": f"Question {i}: how?"}]} for i in range(2)]  # 30 min apart
    doc = _doc(write_jsonl(tmp_path / "h.jsonl", rows), "--profile", "anthropic")
    cached = [p["cached_tokens"] for p in doc["prompts"]]
    assert cached[0] == 0 and (cached[1] > 1000) is (ttl == "1h")  # the 5-minute entry expired
    cost = Cost("anthropic")
    cost.add("claude-sonnet-4-20250514", 1000, cached=0, written=800, written_long=600)
    assert cost.usd_cached == pytest.approx((200 + 200 * 1.25 + 600 * 2.0) * 3e-6)


def test_segment_token_ends_one_pass_equals_the_search() -> None:
    """The tiktoken pass over token lengths gives the binary search over char_offset's answer."""
    from array import array

    from kvcli.audit.counting import segment_token_ends
    from kvcli.audit.parse import to_request
    from kvcli.audit.records import PromptRequest
    from kvcli.audit.render import render_request
    from kvcli.audit.tokenizers import load_tokenizer

    tok = load_tokenizer()

    class Search:  # no token_ends: the generic path
        char_offset = tok.char_offset

    rows = [_row("gpt-5.6", "Grüße — ünïcödé 🎉 日本語 " * 20, question_mark=True),
            {"messages": [{"role": "system", "content": "a\u0301 " * 50}, {"role": "user", "content": "x" * 999},
                          {"role": "assistant", "content": "  spaced  \n\n out "}, {"role": "user", "content": "?"}]}]
    for i, row in enumerate(rows):
        request = to_request(row, f"r:{i}")
        assert isinstance(request, PromptRequest)
        prompt = render_request(i, request)
        ids = array("I", tok.encode_batch([prompt.text])[0])
        fast = segment_token_ends(prompt, ids, tok)
        assert fast == segment_token_ends(prompt, ids, Search()) and fast[-1] <= len(ids)
        assert fast == sorted(fast) and len(fast) == len(prompt.segments)
