"""Request-side structured outputs: vLLM's field names, OpenAI's response_format, schema checks
with field paths, and the keywords refused because xgrammar would silently ignore them."""

from __future__ import annotations

import json

import pytest

from kvcli.sampling_params import SamplingParams
from kvcli.structured import StructuredOutputsParams, response_format_to_params
from kvcli.structured.schema_check import FORMATS

RF = "body.response_format"


def err(fn, *args) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args)
    return str(info.value)


def test_response_format_types():
    assert response_format_to_params({"type": "text"}, RF) is None
    obj = response_format_to_params({"type": "json_object"}, RF)
    assert (obj.kind, obj.path) == ("json_object", RF)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    p = response_format_to_params(
        {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}, RF)
    assert (p.kind, p.json, p.path) == ("json", schema, f"{RF}.json_schema.schema")
    no_schema = response_format_to_params({"type": "json_schema", "json_schema": {"name": "t"}}, RF)
    assert no_schema.kind == "json_object"


def test_response_format_errors_name_the_field():
    bad_type = {"type": "object", "properties": {"age": {"type": "strin"}}}
    msg = err(response_format_to_params,
              {"type": "json_schema", "json_schema": {"name": "t", "schema": bad_type}}, RF)
    assert msg.startswith(f"{RF}.json_schema.schema.properties.age.type: 'strin'")
    assert err(response_format_to_params, {"type": "xml"}, RF).startswith(f"{RF}.type: ")
    assert err(response_format_to_params, "json", RF).startswith(f"{RF}: expected an object")
    assert err(response_format_to_params, {"type": "json_schema", "json_schema": {"strict": 1}},
               RF).startswith(f"{RF}.json_schema.strict: expected true or false")
    items = {"type": "array", "minItems": -1}
    assert err(response_format_to_params, {"type": "json_schema", "json_schema": {
        "schema": items}}, RF).startswith(f"{RF}.json_schema.schema.minItems: -1")


def test_structured_outputs_object_as_vllm_names_it():
    p = StructuredOutputsParams.from_json({"json": json.dumps({"type": "string"})})
    assert (p.json, p.path) == ({"type": "string"}, "structured_outputs.json")
    assert StructuredOutputsParams.from_json({"choice": ["a", "b"]}).path == \
        "structured_outputs.choice"
    assert err(StructuredOutputsParams.from_json, {"regex": "a", "choice": ["a"]}) == (
        "structured_outputs: expected exactly one of json, regex, choice, grammar, json_object, "
        "got regex and choice")
    assert err(StructuredOutputsParams.from_json, {}).endswith("got none")
    assert err(StructuredOutputsParams.from_json, {"whitespace_pattern": " "}).startswith(
        "structured_outputs.whitespace_pattern: not supported")
    assert err(StructuredOutputsParams.from_json, {"choice": ["a", ""]}).startswith(
        "structured_outputs.choice[1]: expected a non-empty string")
    assert err(StructuredOutputsParams.from_json, {"json": "{nope"}).startswith(
        "structured_outputs.json: not valid JSON")


def test_sampling_params_take_a_lines_object():
    """A plain line's "structured_outputs" arrives as a dict (SamplingParams fields are plain-line
    fields): validate() turns it into the params object, or fails naming the field."""
    sp = SamplingParams(structured_outputs={"regex": "[0-9]+"})
    sp.validate()
    assert isinstance(sp.structured_outputs, StructuredOutputsParams)
    assert sp.structured_outputs.regex == "[0-9]+"
    assert err(SamplingParams(structured_outputs={"regex": 5}).validate).startswith(
        "structured_outputs.regex: expected a non-empty string")
    assert err(SamplingParams(structured_outputs=[1]).validate).startswith(
        "structured_outputs: expected an object")


def test_canonical_key_ignores_key_order_and_source():
    a = StructuredOutputsParams(json={"type": "object", "required": ["x"]}, source="a")
    b = StructuredOutputsParams(json={"required": ["x"], "type": "object"}, source="b")
    assert a.key == b.key != StructuredOutputsParams(json={"type": "object"}).key


@pytest.mark.parametrize("keyword, schema", [
    ("not", {"not": {"type": "string"}}),
    ("if", {"if": {"type": "integer"}, "then": {"minimum": 3}}),
    ("uniqueItems", {"type": "array", "items": {}, "uniqueItems": True}),
    ("contains", {"type": "array", "items": {}, "contains": {"type": "string"}}),
    ("dependentRequired", {"type": "object", "dependentRequired": {"a": ["b"]}}),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 3}]}),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "number"}]}),
    ("multipleOf", {"type": "number", "multipleOf": 0.5}),
    ("format", {"type": "string", "format": "credit-card"}),
    ("maxLength", {"type": "string", "format": "email", "maxLength": 5}),
    ("minLength", {"minLength": 2}),
])
def test_unenforceable_keywords_are_refused(keyword, schema):
    nested = {"type": "object", "properties": {"not": schema}}  # a property named "not" is fine
    msg = err(response_format_to_params, {"type": "json_schema", "json_schema": {
        "schema": nested}}, RF)
    assert msg.startswith(f"{RF}.json_schema.schema.properties.not.{keyword}: "), msg
    assert "cannot enforce it" in msg


VIOLATIONS = {  # schema, an instance violating it only through the refused keyword
    "not": ({"not": {"type": "string"}}, '"x"'),
    "if": ({"if": {"type": "integer"}, "then": {"minimum": 3}}, "1"),
    "uniqueItems": ({"type": "array", "items": {}, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": {}, "contains": {"type": "string"}}, "[1]"),
    "dependentRequired": ({"type": "object", "additionalProperties": True,
                           "dependentRequired": {"a": ["b"]}}, '{"a": 1}'),
    "allOf": ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "1"),
    "oneOf": ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
    "multipleOf": ({"type": "number", "multipleOf": 0.5}, "0.3"),
    "format": ({"type": "string", "format": "credit-card"}, '"x"'),
    "maxLength": ({"type": "string", "format": "email", "maxLength": 5}, '"abcdef@x.com"'),
}


@pytest.fixture(scope="module")
def compiler(tiny_models):
    import xgrammar as xgr

    from kvcli.structured.vocab import tokenizer_info
    from kvcli.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tiny_models["llama"])
    return xgr.GrammarCompiler(tokenizer_info(tok, tok.vocab_size, (1,)), max_threads=1)


def _accepts(compiler, schema, text) -> bool:
    import xgrammar as xgr

    grammar = compiler.compile_json_schema(json.dumps(schema), strict_mode=True)
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.accept_token(1)


@pytest.mark.parametrize("keyword", list(VIOLATIONS))
def test_refused_keywords_are_ones_xgrammar_ignores(compiler, keyword):
    """Why each is refused: xgrammar compiles it and lets the violating instance through.
    When a newer xgrammar enforces one, this fails and the keyword can be allowed."""
    schema, bad = VIOLATIONS[keyword]
    assert _accepts(compiler, schema, bad)


@pytest.mark.parametrize("fmt", FORMATS)
def test_allowed_formats_are_enforced(compiler, fmt):
    assert not _accepts(compiler, {"type": "string", "format": fmt}, '"~~ not a value ~~"')


def test_string_lengths_are_compiled_as_patterns(compiler):
    """xgrammar's own string-length grammar lets a raw control character through (invalid
    JSON); kvcli compiles lengths as a pattern instead, which rejects it and keeps the bounds."""
    from kvcli.structured.schema_check import with_string_lengths_as_patterns

    schema = {"type": "string", "minLength": 1, "maxLength": 3}
    assert _accepts(compiler, schema, '"a\x0c"')  # the bug the rewrite works around
    fixed = with_string_lengths_as_patterns({"type": "object", "properties": {"s": schema}})
    inner = fixed["properties"]["s"]
    for text, ok in (('"abc"', True), ('""', False), ('"abcd"', False), ('"a\x0c"', False),
                     ('"\u00e9\u6f22\u5b57"', True), ('"\u00e9\u6f22\u5b57x"', False)):
        assert _accepts(compiler, inner, text) is ok, text  # characters counted, not bytes
    nullable = with_string_lengths_as_patterns({"type": ["string", "null"], "maxLength": 2})
    for text, ok in (('"ab"', True), ("null", True), ('"abc"', False), ("1", False)):
        assert _accepts(compiler, nullable, text) is ok, text
