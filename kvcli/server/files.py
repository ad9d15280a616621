"""Files of ``kvcli serve`` on disk: uploads streamed to ``DATA/files/<id>``, capped in size.

An upload is parsed as it arrives (python-multipart's push parser): the file part goes
straight to a temporary file in ``DATA/tmp`` chunk by chunk, and the upload stops with
:class:`UploadTooLarge` the moment it passes the limit, so neither a whole file nor an
oversized one is ever held in memory or kept on disk. Only ids this server made
(``file-`` + 24 hex digits from :mod:`secrets`) ever become a path: no client string
reaches the filesystem.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.multipart import MultipartParser, parse_options_header

FILE_ID = re.compile(r"file-[0-9a-f]{24}\Z")
_MAX_FIELD_BYTES = 4096  # a form field other than the file (purpose): a short string


class UploadTooLarge(Exception):
    """The file passed the size limit (HTTP 413)."""


class BadUpload(ValueError):
    """Not a multipart form with one file part (HTTP 400)."""


def new_id(prefix: str) -> str:
    """An id nobody can guess: 96 random bits."""
    return prefix + secrets.token_hex(12)


@dataclass(slots=True)
class Upload:
    fields: dict[str, str]
    filename: str
    size: int
    tmp: Path


class FileDir:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"
        self.tmp = root / "tmp"
        for d in (self.root, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        for stale in self.tmp.iterdir():  # uploads cut off by a kill
            stale.unlink(missing_ok=True)

    def path(self, file_id: str) -> Path:
        if not FILE_ID.match(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        return self.root / file_id

    def commit(self, upload: Upload, file_id: str) -> None:
        os.replace(upload.tmp, self.path(file_id))

    def remove(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    async def receive(self, content_type: str, chunks: AsyncIterator[bytes],
                      limit: int) -> Upload:
        kind, params = parse_options_header(content_type)
        if kind != b"multipart/form-data" or b"boundary" not in params:
            raise BadUpload("expected a multipart/form-data body with a `file` part")
        tmp = self.tmp / secrets.token_hex(8)
        parts = _Parts(open(tmp, "wb"), limit)  # noqa: SIM115 (closed in finally)
        parser = MultipartParser(params[b"boundary"], parts.callbacks())
        try:
            async for chunk in chunks:
                parser.write(chunk)
            parser.finalize()
        except BaseException:
            parts.out.close()
            tmp.unlink(missing_ok=True)
            raise
        parts.out.close()
        if parts.filename is None:
            tmp.unlink(missing_ok=True)
            raise BadUpload("the form has no `file` part")
        return Upload(parts.fields, parts.filename, parts.size, tmp)

    def discard(self, upload: Upload) -> None:
        with contextlib.suppress(OSError):
            upload.tmp.unlink()


@dataclass(slots=True)
class _Parts:
    """python-multipart callbacks: the `file` part to ``out``, short fields kept as text."""

    out: object
    limit: int
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    _header: bytes = b""
    _value: bytes = b""
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _name: str = ""
    _is_file: bool = False
    _field: bytearray = field(default_factory=bytearray)

    def callbacks(self) -> dict[str, object]:
        return {"on_part_begin": self._begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_done, "on_part_data": self._data,
                "on_part_end": self._end}

    def _begin(self) -> None:
        self._headers, self._field = {}, bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header.lower()] = self._value
        self._header, self._value = b"", b""

    def _headers_done(self) -> None:
        _, params = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        self._is_file = self._name == "file" and b"filename" in params
        if self._is_file:
            if self.filename is not None:
                raise BadUpload("the form has more than one `file` part")
            # Kept as metadata only (the stored name is the id); a path's directories dropped.
            name = params[b"filename"].decode("utf-8", "replace")
            self.filename = name.replace("\\", "/").rsplit("/", 1)[-1][:255] or "upload.jsonl"

    def _data(self, data: bytes, start: int, end: int) -> None:
        if not self._is_file:
            self._field += data[start:end]
            if len(self._field) > _MAX_FIELD_BYTES:
                raise BadUpload(f"form field {self._name!r} is over {_MAX_FIELD_BYTES} bytes")
            return
        self.size += end - start
        if self.size > self.limit:
            raise UploadTooLarge(f"the file is over the server's limit of {self.limit} bytes "
                                 "(kvcli serve --max-file-bytes)")
        self.out.write(data[start:end])  # type: ignore[attr-defined]

    def _end(self) -> None:
        if not self._is_file:
            self.fields[self._name] = self._field.decode("utf-8", "replace")
