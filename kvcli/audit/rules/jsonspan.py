"""Finding the JSON value around a position, and saying how two serializations differ."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_DECODER = json.JSONDecoder()
LOOK_BACK = 32_768
MAX_OPENERS = 16


def openers(text: str, char: int, lo: int = 0) -> Iterator[int]:
    """Positions of '{' and '[' in text[lo:char + 1], nearest first."""
    lo, pos = max(lo, char - LOOK_BACK), char + 1
    for _ in range(MAX_OPENERS):
        start = max(text.rfind("{", lo, pos), text.rfind("[", lo, pos))
        if start < 0:
            return
        yield start
        pos = start


def decode_at(text: str, start: int) -> tuple[Any, int] | None:
    try:
        return _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None


def key_order_path(a: Any, b: Any, path: str = "$", depth: int = 0) -> str | None:
    """Where two equal JSON values first list keys in a different order: '$.x: (b, a) vs (a, b)'."""
    if depth > 64:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{path}: keys ({', '.join(list(a)[:4])}) vs ({', '.join(list(b)[:4])})"
        items = ((f"{path}.{k}", a[k], b[k]) for k in a)
    elif isinstance(a, list) and isinstance(b, list):
        items = ((f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)))
    else:
        return None
    for sub, x, y in items:
        found = key_order_path(x, y, sub, depth + 1)
        if found:
            return found
    return None


def difference_kind(a_raw: str, b_raw: str, a: Any, b: Any) -> str:
    """'key order', 'separators/whitespace' or 'escaping/number format' between equal values."""
    path = key_order_path(a, b)
    if path:
        return f"key order ({path})"
    if "".join(a_raw.split()) == "".join(b_raw.split()):
        return "separators/whitespace"
    return "escaping or number format (e.g. ensure_ascii, 1.0 vs 1)"


def unsorted_path(value: Any, path: str = "$", depth: int = 0) -> str | None:
    """The first object whose keys are not in sorted order."""
    if depth > 64:
        return None
    if isinstance(value, dict):
        keys = list(value)
        if keys != sorted(keys):
            return path
        children = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub, child in children:
        found = unsorted_path(child, sub, depth + 1)
        if found:
            return found
    return None
