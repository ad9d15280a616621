"""OpenTelemetry GenAI spans as traffic: each span's prompt (current `gen_ai.input.messages`,
older span events, `gen_ai.prompt`) is audited as the chat request it records, and its usage
(`gen_ai.usage.cache_read.input_tokens` and older names) is the provider's actual cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_audit_support import run, write_jsonl

from kvcli.audit.otel import actual_of, otel_requests
from kvcli.audit.traffic import LESS, Actual

SYSTEM = "You are a careful assistant for ACME Cloud. Answer from the documentation. " * 120
TOOL = {"type": "function", "name": "search_docs", "description": "Search the docs.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
T0 = 1_764_670_000_000_000_000  # ns


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # OTLP JSON writes 64-bit integers as strings
    return {"stringValue": v if isinstance(v, str) else json.dumps(v)}


def _attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in d.items()]


def _span(i: int, attrs: dict[str, Any], events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"traceId": "ab" * 16, "spanId": f"{i:016x}", "name": "chat gpt-4o", "kind": 3,
            "startTimeUnixNano": str(T0 + i * 10**9), "endTimeUnixNano": str(T0 + i * 10**9 + 5),
            "attributes": _attrs(attrs), "events": events or []}


def _export(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {"attributes": _attrs({"service.name": "app"})},
                               "scopeSpans": [{"scope": {"name": "openai"}, "spans": spans}]}]}


def _chat_span(i: int, question: str, usage: dict[str, int]) -> dict[str, Any]:
    return _span(i, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-2024-08-06",
                     "gen_ai.system_instructions": [{"type": "text", "content": SYSTEM}],
                     "gen_ai.input.messages": [{"role": "user", "parts": [{"type": "text", "content": question}]}],
                     "gen_ai.tool.definitions": [TOOL], **usage})


def _doc(path: Path, *args: str) -> dict[str, Any]:
    result = run([str(path), "--format", "json", "--fail-on", "never", "--profile", "openai", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_spans_are_audited_as_their_chat_requests_with_the_actual_cache(tmp_path: Path) -> None:
    chat = [{"model": "gpt-4o-2024-08-06", "tools": [{"type": "function", "function": {
        k: TOOL[k] for k in ("name", "description", "parameters")}}],
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}?"}]}
        for i in range(3)]
    plain = _doc(write_jsonl(tmp_path / "chat.jsonl", chat))
    predicted = [p["cached_tokens"] for p in plain["prompts"]]
    tokens = [p["tokens"] for p in plain["prompts"]]
    assert predicted[0] == 0 and predicted[1] >= 1024
    actual = [0, predicted[1], 0]  # the third went to another machine
    spans = [_chat_span(i, f"Question {i}?", {"gen_ai.usage.input_tokens": tokens[i],
                                              "gen_ai.usage.cache_read.input_tokens": actual[i]})
             for i in range(3)]
    noise = _span(9, {"http.method": "POST"})  # another span of the trace: skipped
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(_export([spans[2], noise, spans[0], spans[1]])))  # a batch: any order
    doc = _doc(path)
    assert [p["tokens"] for p in doc["prompts"]] == tokens  # the same prompt as the chat request
    assert [p["cached_tokens"] for p in doc["prompts"]] == predicted  # replayed by start time
    assert doc["input_problems"] == []
    t = doc["traffic"]
    assert t["requests"] == 3 and t["actual_cached_tokens"] == sum(actual) and t["agree"] == 2
    [d] = t["disagree"]
    assert (d["prompt"], d["id"], d["actual"], d["why"]) == (2, f"{2:016x}", 0, LESS)
    assert d["source"] == f"{path} span {2:016x}"
    assert doc["provider_replay"]["timed"] == 3  # startTimeUnixNano is the request's time


def test_older_conventions_and_usage_names(tmp_path: Path) -> None:
    events = [{"name": "gen_ai.system.message", "attributes": _attrs({"content": SYSTEM})},
              {"name": "gen_ai.user.message", "attributes": _attrs({"content": "Hi?"})}]
    old = _span(1, {"gen_ai.system": "anthropic", "gen_ai.request.model": "claude-sonnet-4-20250514",
                    "gen_ai.usage.input_tokens": 12, "gen_ai.usage.cache_read_input_tokens": 1500,
                    "gen_ai.usage.cache_creation_input_tokens": 8}, events)
    flat = {"attributes": {"gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": SYSTEM,
                           "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "Hi?",
                           "gen_ai.usage.prompt_tokens": 1520}, "context": {"span_id": "0xfeed"}}
    prompt = _span(3, {"gen_ai.prompt": json.dumps([{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": "Hi?"}])})
    [(_, first, usage)] = otel_requests(_export([old]), "f")
    assert isinstance(first, dict) and usage == Actual(1500, 1520)  # Anthropic's input_tokens: without reads
    [(_, second, _)] = otel_requests(flat, "f")  # the console exporter's plain attributes
    [(_, third, _)] = otel_requests(_export([prompt]), "f")
    assert isinstance(second, dict) and isinstance(third, dict)
    assert first["messages"] == second["messages"] == third["messages"] == [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi?"}]
    assert actual_of({"gen_ai.usage.input_tokens": 2000, "gen_ai.usage.cache_read.input_tokens": 1920}) == \
        Actual(1920, 2000)  # the current conventions: reads inside input_tokens
    assert actual_of({"gen_ai.request.model": "x"}) is None


def test_tool_calls_round_trip_and_problems_are_named(tmp_path: Path) -> None:
    messages = [{"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "wx",
                                                 "arguments": {"city": "Oslo"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "rain"}]}]
    [(_, body, _)] = otel_requests(_export([_span(1, {"gen_ai.input.messages": json.dumps(messages)})]), "f")
    assert isinstance(body, dict) and body["messages"][1]["tool_calls"][0]["function"] == {
        "name": "wx", "arguments": '{"city": "Oslo"}'}
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    image = [{"role": "user", "parts": [{"type": "blob", "modality": "image", "content": "..."}]}]
    lines = [_export([_span(1, {"gen_ai.input.messages": image}), _span(2, {"gen_ai.usage.input_tokens": 5})]),
             _export([_span(3, {"http.method": "GET"})]),
             _export([_chat_span(4, "Question?", {})])]
    path = write_jsonl(tmp_path / "exports.jsonl", lines)  # the collector's file exporter: one export a line
    result = run([str(path), "--fail-on", "never"])
    assert result.exit_code == 0, result.output
    assert f"{path}:1 span {1:016x}: gen_ai.input.messages[0].parts[0]: part type 'blob' not read" in result.stderr
    assert f"{path}:1 span {2:016x}: GenAI span without prompt content" in result.stderr
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true" in result.stderr
    assert f"{path}:2: no GenAI spans" in result.stderr
    doc = json.loads(run([str(path), "--fail-on", "never", "--format", "json"]).stdout)
    assert doc["summary"]["prompts"] == 1 and len(doc["input_problems"]) == 3  # the readable span is audited


def test_fix_refuses_an_export(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "spans.jsonl", [_export([_chat_span(1, "Q?", {})])])
    result = run([str(path), "--fix", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 2 and f"{path}:1 is an OpenTelemetry export" in result.output


def test_openinference_llm_spans() -> None:
    attrs = {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-2024-08-06",
             "llm.input_messages.0.message.role": "system", "llm.input_messages.0.message.content": SYSTEM,
             "llm.input_messages.1.message.role": "user", "llm.input_messages.1.message.content": "Hi?",
             "llm.tools.0.tool.json_schema": json.dumps({"type": "function", "function": {"name": "search_docs"}}),
             "llm.token_count.prompt": 1600, "llm.token_count.prompt_details.cache_read": 1536}
    [(_, body, usage)] = otel_requests(_export([_span(1, attrs)]), "f")
    assert isinstance(body, dict) and body["model"] == "gpt-4o-2024-08-06"
    assert body["messages"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi?"}]
    assert body["tools"] == [{"type": "function", "function": {"name": "search_docs"}}]
    assert usage == Actual(1536, 1600)
