"""Reading inputs: files, directories and stdin, one record at a time.

A record is a parsed JSON value (one JSONL line, one element of a JSON array, or
a whole JSON document) or the text of a .txt/.md file. Problems with one record
are yielded as InputProblem so the rest is still audited; a path that cannot be
read at all raises InputError (exit 2).
"""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from kvcli.audit.records import InputProblem
from kvcli.compression import Decompressed, open_decompressed, open_read, strip_suffix

TEXT_SUFFIXES = (".txt", ".md")
JSON_SUFFIXES = (".json",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
AUDITED_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + JSONL_SUFFIXES


class InputError(Exception):
    """An input path that cannot be read at all."""


@dataclass(slots=True)
class RawRecord:
    where: str  # "file:line", "file[i]" or "file"
    value: Any  # a parsed JSON value, or str for a text prompt
    is_text: bool = False


Item = RawRecord | InputProblem

#: A JSONL line longer than this is skipped unread (a per-line problem), like `kvcli generate
#: --max-line-bytes`: no prompt a context window can hold comes near it, and reading a 500 MB
#: line whole would need gigabytes.
MAX_LINE_BYTES = 16 << 20
_SKIP_CHUNK = 1 << 20


@dataclass(slots=True)
class _LongLine:
    size: int  # bytes, skipped unread


def _bounded_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES) -> Iterator[bytes | _LongLine]:
    """The stream's lines (blank ones included, so numbers stay true), never a huge one whole."""
    while chunk := stream.readline(limit + 1):
        if len(chunk) <= limit or chunk.endswith(b"\n"):
            yield chunk
            continue
        size = len(chunk)
        while (more := stream.readline(_SKIP_CHUNK)) and not more.endswith(b"\n"):
            size += len(more)
        yield _LongLine(size + len(more.rstrip(b"\r\n")))


def describe_json_error(err: Exception) -> str:
    """orjson's message, worded for people (its depth limit is 1024 levels)."""
    text = str(err)
    if "depth limit" in text or "recursion" in text.lower():
        return "invalid JSON: nested too deeply (more than 1024 levels)"
    return f"invalid JSON: {text}"


def decode_utf8(data: bytes, where: str) -> str | InputProblem:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        return InputProblem(where, f"invalid UTF-8 at byte {err.start}")


def parse_json(text: str, where: str) -> Any | InputProblem:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as err:
        return InputProblem(where, describe_json_error(err))
    except (RecursionError, MemoryError) as err:  # belt and braces: never crash on input
        return InputProblem(where, f"invalid JSON: {type(err).__name__}")


def iter_jsonl(lines: Iterable[bytes | _LongLine], name: str) -> Iterator[Item]:
    """One record per non-blank line; `lines` may be a stream's _bounded_lines."""
    seen = False
    for number, raw in enumerate(lines, start=1):
        where = f"{name}:{number}"
        if isinstance(raw, _LongLine):
            seen = True
            yield InputProblem(where, f"line of {raw.size:,} bytes is longer than the "
                                      f"{MAX_LINE_BYTES:,}-byte limit: skipped unread")
            continue
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
        if not raw.strip():
            continue
        seen = True
        text = decode_utf8(raw, where)
        if isinstance(text, InputProblem):
            yield text
            continue
        value = parse_json(text, where)
        yield value if isinstance(value, InputProblem) else RawRecord(where, value)
    if not seen:
        yield InputProblem(name, "empty input: no requests", empty=True)


def iter_json_document(data: bytes, name: str) -> Iterator[Item]:
    """A whole JSON document: an array of requests, or one request object.

    A file that is not one document but holds several lines is read as JSONL.
    """
    text = decode_utf8(data.removeprefix(codecs.BOM_UTF8), name)
    if isinstance(text, InputProblem):
        yield text
        return
    if not text.strip():
        yield InputProblem(name, "empty input: no requests", empty=True)
        return
    value = parse_json(text, name)
    if isinstance(value, InputProblem):
        lines = [line for line in data.splitlines() if line.strip()]
        if len(lines) > 1 and _parses(lines[0].lstrip().removeprefix(codecs.BOM_UTF8))[0]:
            yield from iter_jsonl(data.splitlines(), name)  # JSONL saved as .json
        else:
            yield value
        return
    if isinstance(value, list):
        if not value:
            yield InputProblem(name, "empty JSON array: no requests", empty=True)
        for i, item in enumerate(value):
            yield RawRecord(f"{name}[{i}]", item)
        return
    yield RawRecord(name, value)


def iter_text(data: bytes, name: str) -> Iterator[Item]:
    text = decode_utf8(data.removeprefix(codecs.BOM_UTF8), name)
    if isinstance(text, InputProblem):
        yield text
    elif not text:
        yield InputProblem(name, "empty file: no prompt", empty=True)
    else:
        yield RawRecord(name, text, is_text=True)


def _parses(line: bytes) -> tuple[bool, Any]:
    try:
        return True, orjson.loads(line)
    except orjson.JSONDecodeError:
        return False, None


def _next_content(stream: IO[bytes]) -> bytes:
    line = stream.readline()
    while line and not line.strip():
        line = stream.readline()
    return line


def iter_sniffed(stream: IO[bytes], name: str) -> Iterator[Item]:
    """Unknown format (stdin, other suffixes), by its first two non-blank lines: JSON lines if
    either parses on its own; a JSON document if the input starts with '[' or '{' otherwise
    (one line, or pretty-printed); anything else is one text prompt."""
    first = _next_content(stream)
    head = first.lstrip().removeprefix(codecs.BOM_UTF8)
    if not head.startswith((b"{", b"[")):
        yield from iter_text(first + stream.read(), name)
        return
    second = _next_content(stream)
    if second and (_parses(head)[0] or _parses(second.strip())[0]):
        yield from iter_jsonl(_chain_first([first, second], stream), name)
    else:
        yield from iter_json_document(first + second + stream.read(), name)


def _chain_first(lines: list[bytes], stream: IO[bytes]) -> Iterator[bytes | _LongLine]:
    yield from (line for line in lines if line)
    yield from _bounded_lines(stream)


def iter_file(path: Path) -> Iterator[Item]:
    """One file's records; a gzip/bzip2/xz/zstd file (by its first bytes) is read decompressed,
    by the suffix under its compression suffix (``x.jsonl.gz`` is JSONL)."""
    name = str(path)
    try:
        with open_read(name) as f:
            plain = strip_suffix(name) if isinstance(f, Decompressed) else name
            suffix = Path(plain).suffix.lower()
            if suffix in JSONL_SUFFIXES:
                yield from iter_jsonl(_bounded_lines(f), name)
            elif suffix in JSON_SUFFIXES:
                yield from iter_json_document(f.read(), name)
            elif suffix in TEXT_SUFFIXES:
                yield from iter_text(f.read(), name)
            else:
                yield from iter_sniffed(f, name)
    except OSError as err:
        yield InputProblem(name, f"cannot read: {err.strerror or err}")


def directory_files(directory: Path) -> list[Path]:
    """Audited files under `directory` (recursively, hidden entries skipped), sorted by path."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in files:
            if not file.startswith(".") and strip_suffix(file).lower().endswith(AUDITED_SUFFIXES):
                found.append(Path(root) / file)
    return sorted(found, key=lambda p: p.relative_to(directory).parts)


def check_paths(paths: Iterable[str]) -> list[str]:
    """Fail early (exit 2) on paths that do not exist or hold nothing to audit."""
    checked = []
    for spec in paths:
        if spec == "-":
            checked.append(spec)
            continue
        path = Path(spec)
        if not path.exists():
            raise InputError(f"{spec}: no such file or directory")
        if path.is_dir() and not directory_files(path):
            raise InputError(f"{spec}: directory holds no .txt, .md, .json or .jsonl files")
        if not path.is_dir() and not os.access(path, os.R_OK):
            raise InputError(f"{spec}: permission denied")
        checked.append(spec)
    return checked


def _stdin_records(stdin: IO[bytes]) -> Iterator[Item]:
    """Standard input, decompressed if it is compressed; damage is a problem, not a crash."""
    try:
        yield from iter_sniffed(open_decompressed(stdin), "<stdin>")  # type: ignore[arg-type]
    except OSError as err:
        yield InputProblem("<stdin>", f"cannot read: {err.strerror or err}")


def iter_records(paths: Iterable[str], stdin: IO[bytes] | None = None) -> Iterator[Item]:
    for spec in paths:
        if spec == "-":
            if stdin is None:
                raise InputError("-: no standard input")
            yield from _stdin_records(stdin)
            continue
        path = Path(spec)
        files = directory_files(path) if path.is_dir() else [path]
        for file in files:
            yield from iter_file(file)
