"""The per-line error both commands report as ``file:line (id): field: reason``."""

from __future__ import annotations

from typing import Any


def clip(text: str, limit: int) -> str:
    """Shorten ``text`` for a message: a bad value on a line may be megabytes long."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_value(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    return clip(repr(value), 60)


def type_name(value: Any) -> str:
    """The JSON type of a value, as error messages name it."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number" if isinstance(value, int | float) else type(value).__name__)


class LineError(ValueError):
    """A per-line problem: ``field`` names the offending input field (None: the whole line).

    ``str(err)`` is ``"field: message"``, the form every kvcli error about a line takes.
    """

    def __init__(self, field: str | None, message: str, code: str = "invalid_request") -> None:
        message = clip(message, 300)
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.code = code

    @classmethod
    def from_value_error(cls, err: ValueError) -> LineError:
        """Map the engine's ``ValueError("field: reason")`` convention onto a LineError."""
        text = str(err)
        name, sep, reason = text.partition(": ")
        if sep and name and " " not in name:
            return cls(name, reason)
        return cls(None, text)
