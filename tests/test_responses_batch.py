"""OpenAI Batch ``/v1/responses`` lines: run, and answered with a Responses ``Response`` object
(validated with the openai SDK's type), ``text.format`` constraining the output as in chat."""

from __future__ import annotations

import json

import jsonschema
from openai.types.responses import Response
from test_batch_parse import fails, ok
from test_structured_cli import generate
from test_structured_tool_cli import CALL

from kvcli.batch.output import ResultFormatter
from kvcli.batch.parse import GENERATE_URLS, ParseOptions
from kvcli.engine.outputs import CompletionOutput, RequestOutput
from kvcli.inputs.openai import URLS

SCHEMA = {"type": "object", "properties": {"urgent": {"type": "boolean"}},
          "required": ["urgent"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def responses_line(body: dict, custom_id: str = "r1") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}


def test_a_responses_line_is_read_like_a_responses_body():
    req = ok(responses_line({"instructions": "Be brief.", "input": "Hi", "max_output_tokens": 5,
                             "text": {"format": {"type": "json_schema", "name": "t",
                                                 "schema": SCHEMA}}}))
    assert req.prompt.messages[0] == {"role": "system", "content": "Be brief."}
    assert req.params.max_tokens == 5 and req.params.structured_outputs.kind == "json"
    assert req.echo["instructions"] == "Be brief."
    fails(responses_line({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "t",
                                                             "schema": {"type": "strin"}}}}),
          "body.text.format.schema.type")


def test_the_endpoint_refusal_lists_what_is_accepted():
    failed = fails({"custom_id": "e", "method": "POST", "url": "/v1/moderations",
                    "body": {"input": "x"}}, "url", code="invalid_url")
    assert failed.error.message.endswith("kvcli generate accepts /v1/chat/completions, "
                                         "/v1/completions, /v1/responses and /v1/embeddings")
    assert set(URLS) == set(GENERATE_URLS)  # what the request model reads, generate answers


def test_tool_calls_become_function_call_items():
    fmt = ResultFormatter("m", tokenizer=None)
    line = ok(responses_line({"input": "Weather in Paris?", "tools": TOOLS}),
              opts=ParseOptions(tool_format="hermes"))
    out = RequestOutput("0", [1, 2], [CompletionOutput(0, "Let me look.\n" + CALL, [3], "stop")])
    body = json.loads(fmt.success(line, out))["response"]["body"]
    resp = Response.model_validate(body)
    message, call = resp.output
    assert message.type == "message" and resp.output_text == "Let me look."
    assert call.type == "function_call" and call.name == "weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert resp.tools[0].name == "weather" and resp.status == "completed"


def test_generate_answers_responses_lines(tiny_models):
    lines = [responses_line({"instructions": "Be brief.", "input": "Where does the fox live?",
                             "max_output_tokens": 6}, "cut"),
             responses_line({"input": [{"role": "user", "content": "Urgent?"}],
                             "max_output_tokens": 60, "text": {"format": {
                                 "type": "json_schema", "name": "t", "schema": SCHEMA}}}, "json"),
             {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
              "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}]
    res, out = generate("-", "--model", str(tiny_models["qwen2"]), "-q",
                        input="".join(json.dumps(x) + "\n" for x in lines))
    assert res.exit_code == 0, res.stderr
    cut = Response.model_validate(out["cut"]["response"]["body"])
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 6 and cut.instructions == "Be brief."
    constrained = Response.model_validate(out["json"]["response"]["body"])
    if constrained.status == "completed":
        jsonschema.validate(json.loads(constrained.output_text), SCHEMA)
    assert constrained.text.format.type == "json_schema"
    assert out["chat"]["response"]["body"]["object"] == "chat.completion"
