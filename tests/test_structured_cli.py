"""`kvcli generate` with structured outputs: response_format on OpenAI chat / completions bodies
and plain lines, vLLM's structured_outputs object, per-line errors naming the field path."""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner
from test_batch_parse import chat_line, fails, ok

from kvcli.batch.parse import ParseOptions
from kvcli.cli import main
from kvcli.sampling_params import SamplingParams

MSGS = [{"role": "system", "content": "Extract the ticket."},
        {"role": "user", "content": "My order 123 never arrived, urgent!"}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["category", "urgent"],
          "properties": {"category": {"enum": ["shipping", "billing", "other"]},
                         "urgent": {"type": "boolean"}}}


def rf(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema,
                                                   "strict": True}}


def test_plain_line_takes_vllms_structured_outputs_object():
    req = ok({"prompt": "x", "structured_outputs": {"choice": ["yes", "no"]}})
    assert req.params.structured_outputs.choice == ["yes", "no"]
    body = ok(chat_line({"messages": MSGS, "structured_outputs": {"regex": "[0-9]+"}}))
    assert body.params.structured_outputs.path == "body.structured_outputs.regex"


@pytest.mark.parametrize("line, field", [
    ({"prompt": "x", "structured_outputs": {"regex": "a", "json": {}}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"guided_json": {}}},
     "structured_outputs.guided_json"),
    (chat_line({"messages": MSGS, "response_format": {"type": "json_object"},
                "structured_outputs": {"regex": "a"}}), "body.response_format"),
    (chat_line({"messages": MSGS, "response_format": rf({"type": "object", "properties": {
        "age": {"type": "strin"}}})}), "body.response_format.json_schema.schema.properties.age.type"),
    (chat_line({"messages": MSGS, "response_format": rf({"not": {}})}),
     "body.response_format.json_schema.schema.not"),
    (chat_line({"messages": MSGS, "response_format": {"type": "json_object"},
                "ignore_eos": True}), "body.ignore_eos"),
])
def test_bad_constraints_are_that_lines_error(line, field):
    fails(line, field)


def test_cli_ignore_eos_default_conflicts_per_line():
    opts = ParseOptions(SamplingParams(ignore_eos=True))
    fails({"prompt": "x", "response_format": {"type": "json_object"}}, "ignore_eos", opts=opts)


def generate(*args: str, input: str):
    res = CliRunner().invoke(main, ["generate", *args], input=input, catch_exceptions=False)
    return res, {r.get("custom_id") or r["id"]: r for r in map(json.loads, res.stdout.splitlines())}


def test_generate_constrained_batch(tiny_models, tmp_path):
    """Schema lines validate whenever they stop; a bad schema and an uncompilable regex are
    their lines' errors (exit 1) and every other line is done."""
    lines = [chat_line({"messages": MSGS, "max_tokens": 60, "response_format": rf(SCHEMA)},
                       custom_id=f"t{i}") for i in range(3)]
    lines += [
        chat_line({"messages": MSGS, "response_format": rf({"type": "object", "properties": {
            "age": {"type": "strin"}}})}, custom_id="bad-schema"),
        {"id": "bad-regex", "prompt": "x", "structured_outputs": {"regex": "a(b"}},
        {"id": "choice", "prompt": "Colour:", "structured_outputs": {"choice": ["red", "blue"]}},
        {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "Ticket:", "max_tokens": 40, "response_format": {"type": "json_object"}}},
        {"id": "free", "prompt": "Once upon a time", "max_tokens": 5},
    ]
    stats = tmp_path / "stats.json"
    res, out = generate("-", "--model", str(tiny_models["qwen2"]), "-q", "--stats", str(stats),
                        input="".join(json.dumps(x) + "\n" for x in lines))
    assert res.exit_code == 1, res.stderr
    assert out["bad-schema"]["error"]["param"] == \
        "body.response_format.json_schema.schema.properties.age.type"
    assert out["bad-regex"]["error"]["param"] == "structured_outputs.regex"
    assert "bad-regex" in res.stderr and "parenthesis" in res.stderr
    for i in range(3):
        choice = out[f"t{i}"]["response"]["body"]["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    assert out["choice"]["text"] in ("red", "blue") and out["choice"]["finish_reason"] == "stop"
    cmpl = out["cmpl"]["response"]["body"]["choices"][0]
    assert cmpl["finish_reason"] == "stop" and isinstance(json.loads(cmpl["text"]), dict)
    assert out["free"]["finish_reason"] in ("stop", "length")
    counts = json.loads(stats.read_text())["structured"]
    finished = [out[k] for k in ("t0", "t1", "t2", "choice", "cmpl")]
    stopped = sum(_finish(r) == "stop" for r in finished)
    assert (counts["requests"], counts["completed"], counts["invalid"]) == (5, stopped, 0)
    assert counts["cut"] == 5 - stopped and counts["grammars_compiled"] == 3


def _finish(result: dict) -> str:
    body = result.get("response")
    return body["body"]["choices"][0]["finish_reason"] if body else result["finish_reason"]
