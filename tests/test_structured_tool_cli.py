"""`kvcli generate` with tools: tool_choice on chat lines, replies parsed into message.tool_calls."""

from __future__ import annotations

import json

import jsonschema
from test_batch_parse import MSGS, chat_line, fails, ok
from test_structured_cli import generate
from test_structured_tools import TOOLS, WEATHER, hermes_model  # noqa: F401 - a fixture

from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import ParseOptions
from kvcli.engine.outputs import CompletionOutput, RequestOutput

HERMES = ParseOptions(tool_format="hermes")
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tool_choice_on_lines():
    auto = ok(chat_line({"messages": MSGS, "tools": TOOLS}), opts=HERMES)
    assert auto.tool_format == "hermes" and auto.params.structured_outputs is None
    required = ok(chat_line({"messages": MSGS, "tools": TOOLS, "tool_choice": "required"}),
                  opts=HERMES)
    assert required.params.structured_outputs.kind == "structural_tag"
    none = ok({"messages": MSGS, "tools": TOOLS, "tool_choice": "none"}, opts=HERMES)
    assert none.tool_format is None and none.ignored_fields == []
    fails(chat_line({"messages": MSGS, "tools": TOOLS, "tool_choice": "required"}),
          "body.tool_choice")  # a template without a known tool-call format
    fails(chat_line({"messages": MSGS, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}), "body.tool_choice.function.name",
        opts=HERMES)
    fails(chat_line({"messages": MSGS, "tool_choice": "auto"}), "body.tool_choice", opts=HERMES)
    fails(chat_line({"messages": MSGS, "tools": TOOLS, "tool_choice": "required",
                     "response_format": {"type": "json_object"}}), "body.tool_choice",
          opts=HERMES)


def test_replies_become_tool_calls():
    fmt = ResultFormatter("m", tokenizer=None)
    out = RequestOutput("0", [1, 2], [CompletionOutput(0, "Let me look.\n" + CALL, [3], "stop")])
    line = ok(chat_line({"messages": MSGS, "tools": TOOLS}), opts=HERMES)
    choice = json.loads(fmt.success(line, out))["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    plain = ok({"messages": MSGS, "tools": TOOLS}, opts=HERMES)
    result = json.loads(fmt.success(plain, out))
    assert result["finish_reason"] == "tool_calls" and result["tool_calls"][0]["type"] == "function"
    cut = RequestOutput("0", [1], [CompletionOutput(0, CALL, [3], "length")])
    choice = json.loads(fmt.success(line, cut))["response"]["body"]["choices"][0]
    # a complete call is kept when max_tokens cut the reply after it (issue 28, item 12)
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) == 1


def test_generate_required_tool_call(hermes_model):  # noqa: F811 - the fixture
    line = chat_line({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                      "tools": TOOLS, "tool_choice": {"type": "function",
                                                      "function": {"name": "weather"}},
                      "parallel_tool_calls": False, "max_tokens": 100}, custom_id="call")
    res, out = generate("-", "--model", str(hermes_model), "-q", input=json.dumps(line) + "\n")
    assert res.exit_code == 0, res.stderr
    choice = out["call"]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] in ("tool_calls", "length"), choice
    if choice["finish_reason"] == "tool_calls":
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
