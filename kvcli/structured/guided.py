"""A line's one output constraint, from whichever field names it: vLLM's ``structured_outputs``,
OpenAI's ``response_format`` / ``text.format``, or vLLM's older ``guided_*`` fields (torch-free).

``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` are what vLLM
called ``structured_outputs``' ``json`` / ``regex`` / ``choice`` / ``grammar`` before 0.10,
and what most vLLM batch files carry, at the top level of a request body. They mean the same
here. ``guided_decoding_backend`` picked the library that enforces them: kvcli has one,
xgrammar, so ``"xgrammar"`` and ``"auto"`` are honoured (with vLLM's ``:option`` suffixes that
xgrammar knows), and any other backend is the line's error rather than silently swapped,
since each backend has its own grammar dialect and schema coverage.
"""

from __future__ import annotations

from typing import Any

from kvcli.structured.params import StructuredOutputsParams, response_format_to_params

#: vLLM's old field -> the structured_outputs kind it sets.
GUIDED_KINDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                "guided_grammar": "grammar"}
BACKEND = "guided_decoding_backend"
# vLLM's option for the outlines backend only: xgrammar has no whitespace regex.
_WHITESPACE = "guided_whitespace_pattern"
GUIDED_FIELDS = (*GUIDED_KINDS, BACKEND, _WHITESPACE)
_BACKENDS = ("xgrammar", "auto")
# vLLM's backend options: no-fallback and no-additional-properties are what kvcli always does
# (it never falls back to another backend; an object schema without additionalProperties
# allows none, xgrammar's strict mode).
_OPTIONS = ("disable-any-whitespace", "no-fallback", "no-additional-properties")


def line_constraint(structured: Any, response_format: Any, prefix: str,
                    format_field: str = "response_format",
                    guided: dict[str, Any] | None = None) -> StructuredOutputsParams | None:
    """A line's constraint; two fields that each set one is an error, since which one wins
    would be a guess. ``guided``: the line's ``guided_*`` fields (those that are set)."""
    guided = guided or {}
    compact = _backend_compact(guided.get(BACKEND), prefix)
    given = [(name, c) for name, c in (
        ("structured_outputs", None if structured is None else StructuredOutputsParams.from_json(
            structured, f"{prefix}structured_outputs")),
        (format_field, None if response_format is None else response_format_to_params(
            response_format, prefix + format_field, flat=format_field == "text.format")),
        *_guided_constraints(guided, prefix)) if c is not None]
    if len(given) > 1:
        raise ValueError(f"{prefix}{given[1][0]}: conflicts with {given[0][0]} on the same "
                         "line; give one of them")
    if not given:
        return None
    constraint = given[0][1]
    if compact:
        constraint.disable_any_whitespace = True
    return constraint


def _guided_constraints(guided: dict[str, Any], prefix: str
                        ) -> list[tuple[str, StructuredOutputsParams]]:
    if guided.get(_WHITESPACE) is not None:
        raise ValueError(f"{prefix}{_WHITESPACE}: not supported (it is the outlines backend's; "
                         "kvcli's, xgrammar, has none); use guided_decoding_backend "
                         "\"xgrammar:disable-any-whitespace\" for compact JSON")
    out = []
    for name, kind in GUIDED_KINDS.items():
        if guided.get(name) is not None:
            params = StructuredOutputsParams(**{kind: guided[name]}, source=prefix + name)
            params.validate()
            out.append((name, params))
    return out


def _backend_compact(value: Any, prefix: str) -> bool:
    """Check ``guided_decoding_backend``; True if it asks for JSON without free whitespace."""
    if value is None:
        return False
    where = prefix + BACKEND
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string such as \"xgrammar\"")
    name, _, options = value.partition(":")
    if name not in _BACKENDS:
        raise ValueError(f"{where}: {name!r} is not available; kvcli enforces constraints with "
                         "xgrammar only (\"xgrammar\" or \"auto\"), and another backend's "
                         "grammar dialect and schema support differ, so it is refused rather "
                         "than swapped")
    chosen = [o.strip() for o in options.split(",") if o.strip()] if options else []
    for option in chosen:
        if option not in _OPTIONS:
            raise ValueError(f"{where}: unknown option {option!r}; xgrammar takes "
                             + ", ".join(_OPTIONS))
    return "disable-any-whitespace" in chosen
