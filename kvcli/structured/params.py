"""What a request constrains its output to, named as vLLM's offline API names it (torch-free).

``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema))`` is vLLM's
``vllm.sampling_params.StructuredOutputsParams``: exactly one of ``json`` (a JSON Schema,
as an object or a JSON string), ``regex``, ``choice`` (a list of strings), ``grammar``
(EBNF / GBNF) or ``json_object=True`` (any JSON object). A plain input line sets the same
object under ``"structured_outputs"``; OpenAI bodies use ``response_format``
(:func:`response_format_to_params`). Everything that can be checked without the
tokenizer is checked here, with errors naming the input field
(``ValueError("body.response_format.json_schema.schema.properties.age.type: ...")``);
what only the grammar compiler knows (an unsupported schema feature, a bad regex) is an
error of the same shape when the engine admits the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kvcli.structured.schema_check import MAX_DEPTH, check_json_schema

LINE_KINDS = ("json", "regex", "choice", "grammar", "json_object")  # what a line may set
# Bytes of one constraint's canonical JSON. Compile time grows much faster than the size (an
# enum of 20,000 short strings, 270 KB, takes 40 s), so past this no compile could finish in
# time: refused before any work (--structured-compile-timeout bounds the rest).
MAX_CONSTRAINT_BYTES = 1 << 20
# + xgrammar's structural tag (vLLM's name too): how tool_choice constrains to calls
KINDS = (*LINE_KINDS, "structural_tag")


@dataclass(slots=True)
class StructuredOutputsParams:
    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    # vLLM's option: JSON with xgrammar's fixed separators instead of any JSON whitespace
    # (small models otherwise tend to run into max_tokens emitting whitespace).
    disable_any_whitespace: bool = False
    # The input field this came from (errors name it); "structured_outputs.<kind>" if unset.
    source: str = ""

    @property
    def kind(self) -> str:
        """The one constraint that is set (``validate`` guarantees there is exactly one)."""
        given = self._given()
        if len(given) != 1:
            raise ValueError(f"structured_outputs: expected exactly one of {', '.join(KINDS)}, "
                             f"got {' and '.join(given) or 'none'}")
        return given[0]

    @property
    def path(self) -> str:
        """The field errors about the constraint's value are reported under."""
        return self.source or f"structured_outputs.{self.kind}"

    @property
    def key(self) -> str:
        """Canonical text of the constraint: equal keys compile to the same grammar."""
        kind = self.kind
        value = getattr(self, kind)
        return json.dumps([kind, value, self.disable_any_whitespace], sort_keys=True,
                          ensure_ascii=False, separators=(",", ":"))

    def _given(self) -> list[str]:
        return [k for k in KINDS if getattr(self, k) not in (None, False)]

    def validate(self) -> None:
        """Raise ``ValueError("field.path: reason")`` unless exactly one valid constraint is set.

        A schema given as a JSON string is parsed in place, so :attr:`key` is canonical.
        """
        kind = self.kind
        value = getattr(self, kind)
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(f"{self.path.rpartition('.')[0] or 'structured_outputs'}"
                             ".disable_any_whitespace: expected true or false, got "
                             f"{_show(self.disable_any_whitespace)}")
        if kind in ("json", "structural_tag") and isinstance(value, str):
            setattr(self, kind, _parse_json_text(value, self.path))
        _check_size(self.key, self.path)  # before any work on it
        if kind == "json":
            _check_schema_once(self.key, self.path)
        elif kind == "json_object":
            if value is not True:
                raise ValueError(f"{self.path}: expected true or false, got {value!r}")
        elif kind == "choice":
            _check_choice(value, self.path)
        elif kind == "structural_tag":
            _check_structural_tag(self.structural_tag, self.path)
        elif not isinstance(value, str) or not value:
            raise ValueError(f"{self.path}: expected a non-empty string, got {_show(value)}")

    @classmethod
    def from_json(cls, value: Any, prefix: str = "structured_outputs") -> StructuredOutputsParams:
        """The object a line gives under ``structured_outputs`` (vLLM's field names), checked."""
        if isinstance(value, StructuredOutputsParams):
            value.validate()
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{prefix}: expected an object with one of {', '.join(KINDS)}, "
                             f"got {_show(value)}")
        unknown = [k for k in value if k not in (*LINE_KINDS, "disable_any_whitespace")]
        if unknown:
            raise ValueError(f"{prefix}.{unknown[0]}: not supported; kvcli takes one of "
                             + ", ".join(LINE_KINDS))
        given = [k for k in LINE_KINDS if value.get(k) not in (None, False)]
        params = cls(**{k: value.get(k) for k in LINE_KINDS},
                     disable_any_whitespace=value.get("disable_any_whitespace", False),
                     source=f"{prefix}.{given[0]}" if len(given) == 1 else "")
        if len(given) != 1:
            raise ValueError(f"{prefix}: expected exactly one of {', '.join(LINE_KINDS)}, got "
                             f"{' and '.join(given) or 'none'}")
        params.validate()
        return params


def response_format_to_params(value: Any, prefix: str,
                              flat: bool = False) -> StructuredOutputsParams | None:
    """OpenAI's ``response_format`` -> the constraint it asks for (None for ``{"type": "text"}``).

    ``json_schema.strict`` is accepted either way: kvcli always enforces the schema.
    ``flat``: the Responses API's form, ``{"type": "json_schema", "name", "schema"}``.
    """
    if not isinstance(value, dict):
        raise ValueError(f"{prefix}: expected an object with a \"type\", got {_show(value)}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        params = StructuredOutputsParams(json_object=True, source=prefix)
    elif kind == "json_schema":
        params = (_json_schema_params(value, prefix) if flat
                  else _json_schema_params(value.get("json_schema"), f"{prefix}.json_schema"))
    else:
        raise ValueError(f"{prefix}.type: expected \"text\", \"json_object\" or \"json_schema\", "
                         f"got {_show(kind)}")
    params.validate()
    return params


def _json_schema_params(spec: Any, path: str) -> StructuredOutputsParams:
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: expected an object with \"name\" and \"schema\", got "
                         f"{_show(spec)}")
    for name, types, expected in (("name", str, "a string"), ("strict", bool, "true or false"),
                                  ("description", str, "a string")):
        if spec.get(name) is not None and not isinstance(spec[name], types):
            raise ValueError(f"{path}.{name}: expected {expected}, got {_show(spec[name])}")
    schema = spec.get("schema")
    if schema is None:  # OpenAI makes the schema optional: then any JSON object
        return StructuredOutputsParams(json_object=True, source=path)
    return StructuredOutputsParams(json=schema, source=f"{path}.schema")


def _check_size(key: str, path: str) -> None:
    size = len(key.encode())
    if size > MAX_CONSTRAINT_BYTES:
        raise ValueError(f"{path}: {size:,} bytes as JSON, over kvcli's limit of "
                         f"{MAX_CONSTRAINT_BYTES:,} for one constraint (its grammar could "
                         "not compile in reasonable time)")


@lru_cache(maxsize=256)
def _check_schema_once(key: str, path: str) -> None:
    """A line's params are validated more than once (parser, engine) and most lines of a
    job share one schema: check each (schema, field path) once; failures are not cached."""
    check_json_schema(json.loads(key)[1], path)


def _parse_json_text(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from None
    except RecursionError:  # a schema string nested deeper than Python's parser goes
        raise ValueError(f"{path}: nested too deeply (over {MAX_DEPTH} levels)") from None


def _check_structural_tag(tag: Any, path: str) -> None:
    """An xgrammar structural tag; every JSON Schema inside it is checked like any other."""
    if not isinstance(tag, dict) or tag.get("type") != "structural_tag":
        raise ValueError(f"{path}: expected an object with \"type\": \"structural_tag\"")
    # Tool calls wrap their parameters (each checked alone at MAX_DEPTH) in a few more levels.
    for schema in embedded_schemas(tag):
        check_json_schema(schema, f"{path}.json_schema", MAX_DEPTH + 8)


def embedded_schemas(tag: Any) -> list[Any]:
    """The JSON Schemas of a structural tag's ``json_schema`` elements."""
    found, stack = [], [tag]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "json_schema":
                found.append(node.get("json_schema"))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _check_choice(value: Any, path: str) -> None:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{path}: expected a non-empty list of strings, got {_show(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValueError(f"{path}[{i}]: expected a non-empty string, got {_show(item)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
