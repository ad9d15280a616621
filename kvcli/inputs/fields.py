"""Typed reads of a line's fields: ids, strings, the sampling overrides, unknown fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kvcli.inputs.errors import LineError, show_value, type_name
from kvcli.sampling_params import SamplingParams

#: Every SamplingParams field may be set per line (plain lines and OpenAI bodies alike).
SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SamplingParams)
                                         if not f.metadata.get("internal"))
ID_FIELDS = ("custom_id", "id", "request_id")
SESSION_KEYS = ("session_id", "prompt_cache_key", "user")


def present(obj: dict[str, Any]) -> dict[str, Any]:
    """The fields that are set: JSON ``null`` means "use the default", as in OpenAI's API."""
    return {k: v for k, v in obj.items() if v is not None}


def unknown_fields(obj: dict[str, Any], known: Iterable[str], strict: bool,
                   prefix: str = "") -> list[str]:
    """Fields this line sets that kvcli does not know; an error under ``--strict``."""
    known_set = set(known)
    unknown = [f"{prefix}{k}" for k in obj if k not in known_set]
    if unknown and strict:
        raise LineError(unknown[0], "unknown field (--strict)")
    return unknown


def get_str(obj: dict[str, Any], name: str, *, prefix: str = "") -> str | None:
    """An optional non-empty string field."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise LineError(prefix + name, f"expected a string, got {type_name(value)}")
    if not value:
        raise LineError(prefix + name, "expected a non-empty string, got ''")
    return value


def line_id(obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """(id, the field it came from); the fields that name one request must agree."""
    given = {n: v for n in ID_FIELDS if (v := get_str(obj, n)) is not None}
    if len(set(given.values())) > 1:
        first, *others = given
        raise LineError(first, f"differs from {others[0]}; give one of them")
    name = next(iter(given), None)  # custom_id first: the result echoes the field used for joining
    return (given[name], name) if name else (None, None)


def session_key(obj: dict[str, Any], prefix: str = "") -> str | None:
    """The key grouping one conversation's requests (audit's session rules)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id") is not None:
        return get_str(metadata, "session_id", prefix=f"{prefix}metadata.")
    for key in SESSION_KEYS:
        found = get_str(obj, key, prefix=prefix)
        if found is not None:
            return found
    return None


def sampling_overrides(obj: dict[str, Any], names: Iterable[str] = SAMPLING_FIELDS,
                       prefix: str = "") -> dict[str, Any]:
    """The sampling fields a line sets; ``stop`` may be one string, as in OpenAI's API."""
    out = {name: obj[name] for name in names if obj.get(name) is not None}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    if "ignore_eos" in out and not isinstance(out["ignore_eos"], bool):
        raise LineError(prefix + "ignore_eos", f"expected true or false, got {show_value(out['ignore_eos'])}")
    return out


def renamed(obj: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Another API's sampling fields under SamplingParams' names (``{theirs: ours}``)."""
    out = {ours: obj[theirs] for theirs, ours in names.items() if obj.get(theirs) is not None}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out
