"""``--resume``: which requests an earlier (possibly killed) run already wrote.

A result's key is its ``custom_id`` when it has one, else its ``id`` — the same
key the input line gave (or ``line-<N>``). Every complete line (ending in a
newline) is a whole result, because each was written by one ``os.write``; a
last line without its newline is the trace of a kill mid-write and is cut off
so the resumed run appends after the last complete result. Error results count
as done too: the same line would fail the same way (delete those lines from the
output to retry them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import orjson


@dataclass(slots=True)
class ResumeState:
    done: set[str] = field(default_factory=set)
    results: int = 0  # complete result lines found
    truncated_bytes: int = 0  # size of the partial last line that was cut off
    unreadable: list[int] = field(default_factory=list)  # complete lines that are not results


def result_key(line: bytes) -> str | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    for name in ("custom_id", "id"):
        if isinstance(obj.get(name), str):
            return obj[name]
    return None


def scan_output(path: str) -> ResumeState:
    """Read ``path``'s done keys and cut off a partial last line; a missing file is empty."""
    state = ResumeState()
    if not os.path.exists(path):
        return state
    with open(path, "r+b") as f:
        complete_end = 0
        for line_no, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                break
            complete_end += len(line)
            key = result_key(line)
            if key is None:
                state.unreadable.append(line_no)
            else:
                state.done.add(key)
                state.results += 1
        size = f.seek(0, os.SEEK_END)
        if size > complete_end:
            f.truncate(complete_end)
            state.truncated_bytes = size - complete_end
    return state
