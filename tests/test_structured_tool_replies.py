"""Tool-call replies: every complete call is kept (also when max_tokens cut a later one), text that
is not a call stays in content, calls to unknown functions and non-JSON arguments are not calls,
and a plain line's text agrees with the OpenAI line's content."""

from __future__ import annotations

import json

import pytest
from test_batch_parse import MSGS, chat_line, ok
from test_structured_tools import TOOLS

from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import ParseOptions
from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.structured.tools import parse_tool_calls, tool_names

NAMES = tool_names(TOOLS)
WEATHER = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CUT = '\n<tool_call>\n{"name": "time", "argum'
UNKNOWN = '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>'
NAN = '<tool_call>\n{"name": "weather", "arguments": {"city": NaN}}\n</tool_call>'
HUGE_INT = '<tool_call>\n{"name": "weather", "arguments": {"n": ' + "9" * 5000 + "}}\n</tool_call>"
MALFORMED = "<tool_call>\n{not json\n</tool_call>"


def _names(calls: list[dict]) -> list[str]:
    return [c["function"]["name"] for c in calls]


@pytest.mark.parametrize("text, content, names", [
    (WEATHER + CUT, CUT.strip(), ["weather"]),  # the cut second call stays text
    ("Looking.\n" + WEATHER + "\n" + MALFORMED, "Looking.\n\n" + MALFORMED, ["weather"]),
    (UNKNOWN, UNKNOWN, []),
    (WEATHER + "\n" + UNKNOWN, UNKNOWN, ["weather"]),
    (NAN, NAN, []),
    (HUGE_INT, HUGE_INT, []),  # Python's int limit: not a call, and no exception
])
def test_hermes_keeps_every_complete_call_and_all_other_text(text, content, names):
    got_content, calls = parse_tool_calls(text, "hermes", NAMES)
    assert (got_content, _names(calls)) == (content, names)


@pytest.mark.parametrize("fmt, text", [
    ("llama3", '{"name": "delete_all", "parameters": {}}'),
    ("llama3", '{"name": "weather", "parameters": {"city": Infinity}}'),
    ("mistral", '[TOOL_CALLS][{"name": "time", "arguments": {}}, {"name": "nope", "arguments": {}}]'),
])
def test_json_formats_with_an_unknown_function_or_non_json_are_no_calls(fmt, text):
    assert parse_tool_calls(text, fmt, NAMES) == (text, [])


def test_without_names_any_function_is_a_call():
    assert _names(parse_tool_calls(UNKNOWN, "hermes")[1]) == ["delete_all"]


def _both(text: str, finish: str) -> tuple[dict, dict]:
    """(the OpenAI line's choice, the plain line's result) of one reply."""
    fmt = ResultFormatter("m", tokenizer=None)
    out = RequestOutput("0", [1, 2], [CompletionOutput(0, text, [3], finish)])
    opts = ParseOptions(tool_format="hermes")
    line = ok(chat_line({"messages": MSGS, "tools": TOOLS}), opts=opts)
    plain = ok({"messages": MSGS, "tools": TOOLS}, opts=opts)
    return (json.loads(fmt.success(line, out))["response"]["body"]["choices"][0],
            json.loads(fmt.success(plain, out)))


def test_cut_reply_keeps_its_complete_calls_and_says_length():
    choice, plain = _both(WEATHER + CUT, "length")
    assert choice["finish_reason"] == plain["finish_reason"] == "length"
    assert _names(choice["message"]["tool_calls"]) == _names(plain["tool_calls"]) == ["weather"]
    assert choice["message"]["content"] == plain["text"] == CUT.strip()


def test_plain_text_agrees_with_openai_content():
    choice, plain = _both("Let me look.\n" + WEATHER, "stop")
    assert choice["message"]["content"] == plain["text"] == "Let me look."
    assert choice["finish_reason"] == plain["finish_reason"] == "tool_calls"
    only_calls, plain = _both(WEATHER, "stop")
    assert only_calls["message"]["content"] is None and plain["text"] == ""
    assert plain["tool_calls"][0]["function"] == only_calls["message"]["tool_calls"][0]["function"]
    unknown, plain = _both(UNKNOWN, "stop")  # not a call: the reply is text, as it was
    assert unknown["message"] == {"role": "assistant", "content": UNKNOWN}
    assert plain["text"] == UNKNOWN and "tool_calls" not in plain
    assert unknown["finish_reason"] == plain["finish_reason"] == "stop"
