"""vLLM's older guided_* fields: read as the structured_outputs they name (plain lines and OpenAI
bodies), conflicts and backends kvcli cannot honour are that line's error, and the output obeys."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from test_batch_parse import chat_line, fails, ok
from test_structured_cli import MSGS, SCHEMA, generate

REGEX = "[0-9]{3}"
GRAMMAR = 'root ::= "yes" | "no"'


@pytest.mark.parametrize("field, value, kind", [
    ("guided_json", SCHEMA, "json"), ("guided_json", json.dumps(SCHEMA), "json"),
    ("guided_regex", REGEX, "regex"), ("guided_choice", ["a", "b"], "choice"),
    ("guided_grammar", GRAMMAR, "grammar"),
])
def test_guided_fields_are_structured_outputs(field, value, kind):
    plain = ok({"prompt": "x", field: value, "guided_decoding_backend": "xgrammar"})
    so = plain.params.structured_outputs
    assert so.kind == kind and so.path == field and plain.ignored_fields == []
    if kind == "json":
        assert so.json == SCHEMA  # a JSON string is parsed, as vLLM does
    body = ok(chat_line({"messages": MSGS, field: value}))
    assert body.params.structured_outputs.path == f"body.{field}"
    assert body.params.structured_outputs.key == so.key


def test_backend_options():
    compact = ok({"prompt": "x", "guided_json": SCHEMA,
                  "guided_decoding_backend": "xgrammar:disable-any-whitespace"})
    assert compact.params.structured_outputs.disable_any_whitespace is True
    auto = ok(chat_line({"messages": MSGS, "response_format": {"type": "json_object"},
                         "guided_decoding_backend": "auto"}))
    assert auto.params.structured_outputs.kind == "json_object"
    alone = ok({"prompt": "x", "guided_decoding_backend": "auto:no-fallback"})
    assert alone.params.structured_outputs is None


@pytest.mark.parametrize("line, field", [
    ({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"prompt": "x", "guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
    (chat_line({"messages": MSGS, "guided_json": SCHEMA,
                "response_format": {"type": "json_object"}}), "body.guided_json"),
    ({"prompt": "x", "guided_regex": "a", "guided_decoding_backend": "outlines"},
     "guided_decoding_backend"),
    ({"prompt": "x", "guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
    ({"prompt": "x", "guided_regex": "a", "guided_decoding_backend": "xgrammar:fast"},
     "guided_decoding_backend"),
    ({"prompt": "x", "guided_json": SCHEMA, "guided_whitespace_pattern": " *"},
     "guided_whitespace_pattern"),
    ({"prompt": "x", "guided_choice": "yes"}, "guided_choice"),
    ({"prompt": "x", "guided_json": "{not json"}, "guided_json"),
    ({"prompt": "x", "guided_json": "[" * 5000 + "]" * 5000}, "guided_json"),  # too deep
    (chat_line({"messages": MSGS, "guided_json": {"type": "strin"}}), "body.guided_json.type"),
])
def test_what_cannot_be_honoured_is_the_lines_error(line, field):
    fails(line, field)


def test_generate_obeys_guided_fields(tiny_models):
    """Each guided field constrains the real output (they were ignored: free text, exit 0)."""
    lines = [
        {"id": "choice", "prompt": "Colour:", "guided_choice": ["red", "blue"]},
        {"id": "regex", "prompt": "Number:", "guided_regex": REGEX, "max_tokens": 20},
        {"id": "grammar", "prompt": "Answer:", "guided_grammar": GRAMMAR},
        chat_line({"messages": MSGS, "max_tokens": 60, "guided_json": json.dumps(SCHEMA),
                   "guided_decoding_backend": "xgrammar:disable-any-whitespace"},
                  custom_id="json"),
        {"id": "other-backend", "prompt": "x", "guided_regex": "a",
         "guided_decoding_backend": "guidance"},
    ]
    res, out = generate("-", "--model", str(tiny_models["qwen2"]), "-q",
                        input="".join(json.dumps(x) + "\n" for x in lines))
    assert res.exit_code == 1, res.stderr
    assert out["choice"]["text"] in ("red", "blue")
    assert re.fullmatch(REGEX, out["regex"]["text"]), out["regex"]
    assert out["grammar"]["text"] in ("yes", "no")
    choice = out["json"]["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    assert out["other-backend"]["error"]["param"] == "guided_decoding_backend"
    assert "unknown field" not in res.stderr
