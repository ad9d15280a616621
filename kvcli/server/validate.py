"""A batch's input file checked before anything runs, as OpenAI checks it (errors with line numbers).

Every line must be a JSON object with a string ``custom_id`` used by no other line, ``method``
POST, the batch's ``url`` and a ``body`` naming a model this server has; a file over the
line limit fails whole. The file is read one line at a time (kvcli/batch/source.py), ids are
remembered as 64-bit fingerprints (kvcli/batch/seen.py): memory stays flat for any file.
What a line's body asks for is checked later, line by line, by the batch machinery: a bad
field there is that line's error result, not the batch's failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvcli.batch.records import LineId
from kvcli.batch.seen import SeenIds
from kvcli.batch.source import iter_lines

MAX_LISTED_ERRORS = 100  # errors.data is a summary, not a second copy of a broken file


@dataclass(slots=True)
class Validation:
    lines: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    more_errors: int = 0  # past MAX_LISTED_ERRORS

    def add(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        if len(self.errors) >= MAX_LISTED_ERRORS:
            self.more_errors += 1
            return
        self.errors.append({"code": code, "message": message, "param": param, "line": line})


def validate_input(path: Path, endpoint: str, models: set[str], max_lines: int,
                   max_line_bytes: int) -> Validation:
    result = Validation()
    seen = SeenIds()
    with open(path, "rb") as f:
        for raw in iter_lines(f, max_line_bytes):
            result.lines += 1
            if raw.data is None:
                result.add(raw.line_no, "line_too_long",
                           f"line is {raw.size} bytes, over the limit of {max_line_bytes}")
                continue
            _check_line(raw.data, raw.line_no, endpoint, models, seen, result)
    if result.lines == 0:
        result.add(None, "empty_file", "the input file has no requests")
    elif result.lines > max_lines:
        result.errors.insert(0, {"code": "too_many_requests", "param": None, "line": None,
                                 "message": f"the input file has {result.lines} requests, "
                                            f"over the limit of {max_lines} "
                                            "(kvcli serve --max-lines)"})
    return result


def _check_line(data: bytes, line_no: int, endpoint: str, models: set[str], seen: SeenIds,
                result: Validation) -> None:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        result.add(line_no, "invalid_json_line", f"line {line_no} is not valid JSON: {err}")
        return
    if not isinstance(obj, dict):
        result.add(line_no, "invalid_json_line", f"line {line_no} is not a JSON object")
        return
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        result.add(line_no, "missing_required_parameter",
                   f"line {line_no}: custom_id must be a non-empty string", "custom_id")
    else:
        first = seen.add(LineId(line_no, custom_id, "custom_id"))
        if first is not None:
            result.add(line_no, "duplicate_custom_id", f"line {line_no}: custom_id "
                       f"{custom_id!r} is already used on line {first}", "custom_id")
    if obj.get("method") != "POST":
        result.add(line_no, "invalid_method", f"line {line_no}: method must be \"POST\"",
                   "method")
    if obj.get("url") != endpoint:
        result.add(line_no, "mismatched_endpoint", f"line {line_no}: url {obj.get('url')!r} "
                   f"is not the batch's endpoint {endpoint!r}", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        result.add(line_no, "invalid_request", f"line {line_no}: body must be a JSON object",
                   "body")
    elif body.get("model") not in models:
        result.add(line_no, "model_not_found", f"line {line_no}: model {body.get('model')!r} "
                   f"is not served here (GET /v1/models lists {sorted(models)})", "body.model")
