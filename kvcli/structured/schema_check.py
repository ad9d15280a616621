"""Is a JSON Schema well formed, and can the grammar compiler enforce all of it?

Checked against its meta-schema, then every keyword xgrammar would silently ignore (so
an output could violate the schema although it "followed the grammar") is refused:
a schema kvcli cannot enforce is the line's error, never a weaker constraint.

``jsonschema`` is imported on first use only (lines without a schema never pay for it).
The path of the first error is written the way kvcli names input fields:
``body.response_format.json_schema.schema.properties.age.type``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

#: Levels of JSON objects and arrays a schema may nest (about half as many schema levels).
#: The meta-schema check recurses ~10 Python frames per level and exhausts the interpreter's
#: stack near 200; real schemas stay far below (OpenAI allows 10 levels of nesting).
MAX_DEPTH = 64


def check_json_schema(schema: Any, path: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise ``ValueError("path.to.keyword: reason")`` unless ``schema`` is a valid JSON Schema."""
    if not isinstance(schema, dict):
        raise ValueError(f"{path}: expected a JSON Schema object, got {type(schema).__name__}")
    check_depth(schema, path, max_depth)
    from jsonschema import validators

    # The schema's own "$schema" picks the draft; without one, the latest (2020-12).
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    # The most specific error (deepest path) says what is wrong, not "not valid under anyOf".
    errors = sorted(cls(cls.META_SCHEMA).iter_errors(schema),
                    key=lambda e: (-len(e.absolute_path), str(list(e.absolute_path))))
    if errors:
        err = errors[0]
        raise ValueError(f"{join_path(path, err.absolute_path)}: {err.message}")
    check_enforceable(schema, path)


def check_depth(value: Any, path: str, limit: int = MAX_DEPTH) -> None:
    """Raise ``ValueError`` naming ``path`` if ``value`` nests more than ``limit`` containers
    (walked without recursion, so any depth the JSON reader accepted is measured safely)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            raise ValueError(f"{path}: nested deeper than {limit} levels of objects and arrays; "
                             "kvcli refuses deeper schemas (a recursive structure can use "
                             "$defs and $ref)")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


# Keywords xgrammar (0.2) accepts but does not enforce, measured one by one with a violating
# instance; see tests/test_structured_params.py, which re-measures each.
UNENFORCED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas",
              "dependencies", "contains", "minContains", "maxContains", "contentEncoding",
              "contentMediaType", "contentSchema")
FORMATS = ("date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
           "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer")
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "unevaluatedProperties",
              "unevaluatedItems", "propertyNames")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def check_enforceable(schema: Any, path: str) -> None:
    """Raise ``ValueError("path.keyword: ...")`` for the first keyword the compiler ignores."""
    for sub, where in walk_subschemas(schema, path):
        reason = _unenforced(sub)
        if reason is not None:
            keyword, why = reason
            raise ValueError(f"{where}.{keyword}: {why}; the grammar compiler (xgrammar) cannot "
                             "enforce it, so kvcli refuses the schema rather than ignore it")


def patterns(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every regex in the schema as ``(field path, pattern)``: the engine compiles each alone,
    because inside a schema xgrammar ignores what its regex parser rejects elsewhere."""
    for sub, where in walk_subschemas(schema, path):
        if isinstance(sub.get("pattern"), str):
            yield f"{where}.pattern", sub["pattern"]
        for name in sub.get("patternProperties") or {}:
            yield f"{where}.patternProperties.{name}", name


def walk_subschemas(schema: Any, path: str) -> Iterator[tuple[dict[str, Any], str]]:
    """``schema`` and every schema nested in it (object schemas only), with their paths."""
    if not isinstance(schema, dict):
        return  # true / false schemas
    yield schema, path
    for key in _SUBSCHEMA:
        if key in schema:
            yield from walk_subschemas(schema[key], f"{path}.{key}")
    for key in _SUBSCHEMA_LISTS:
        for i, sub in enumerate(schema.get(key) or ()):
            yield from walk_subschemas(sub, f"{path}.{key}[{i}]")
    for key in _SUBSCHEMA_MAPS:
        for name, sub in (schema.get(key) or {}).items():
            yield from walk_subschemas(sub, f"{path}.{key}.{name}")


def _unenforced(schema: dict[str, Any]) -> tuple[str, str] | None:
    for keyword in UNENFORCED:
        if keyword in schema:
            return keyword, "not supported"
    if schema.get("uniqueItems") is True:
        return "uniqueItems", "not supported"
    for keyword, meaning in (("oneOf", "exactly one branch"), ("allOf", "every branch")):
        if len(schema.get(keyword) or ()) > 1:
            return keyword, f"{len(schema[keyword])} branches (it would match any one branch, " \
                            f"not {meaning})"
    if "multipleOf" in schema and not (schema.get("type") == "integer"
                                       and isinstance(schema["multipleOf"], int)):
        return "multipleOf", "supported only on integers, with an integer divisor"
    if "minLength" in schema or "maxLength" in schema:
        kinds = schema.get("type")
        if not (kinds == "string" or (isinstance(kinds, list) and "string" in kinds
                                      and "anyOf" not in schema)):
            return "maxLength" if "maxLength" in schema else "minLength", \
                "supported only with a \"type\" that includes \"string\""
        if "pattern" in schema or "format" in schema:
            return "maxLength" if "maxLength" in schema else "minLength", \
                "not enforced together with pattern or format"
    fmt = schema.get("format")
    if fmt is not None and fmt not in FORMATS:
        return "format", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})"
    return None


def join_path(path: str, parts: Iterable[Any]) -> str:
    """``path`` extended by object keys (``.key``) and array indexes (``[i]``)."""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def with_string_lengths_as_patterns(schema: Any) -> Any:
    """A copy of ``schema`` in which ``{"type": "string", "minLength"/"maxLength"}`` becomes a
    ``pattern`` of that many plain characters (no quote, backslash or control character).

    xgrammar (0.2) compiles string lengths into a character class that lets raw control
    characters through (invalid JSON) and no escapes; the pattern form is enforced
    exactly, at the cost of escapes in such strings (test_structured_params.py re-measures).
    """
    copy = json.loads(json.dumps(schema))
    for sub, _ in list(walk_subschemas(copy, "")):
        if "minLength" not in sub and "maxLength" not in sub:
            continue
        low, high = sub.pop("minLength", 0), sub.pop("maxLength", "")
        string = {"type": "string", "pattern": f'^[^"\\\\\\x00-\\x1f]{{{low},{high}}}$'}
        kinds = sub.pop("type", "string")
        if kinds == "string":
            sub.update(string)
        else:  # ["string", "null"]: the lengths bind the string branch only
            sub["anyOf"] = [string, {"type": [k for k in kinds if k != "string"]}]
    return copy
