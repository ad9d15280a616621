"""Terminal styling: colors only when writing to a TTY (or --color)."""

from __future__ import annotations

from dataclasses import dataclass

import click

from kvcli.numbers import plural

__all__ = ["Style", "plural"]

_STYLES = {
    "error": {"fg": "red", "bold": True},
    "warning": {"fg": "yellow", "bold": True},
    "info": {"fg": "cyan"},
    "hit": {"fg": "green"},
    "capped": {"fg": "yellow"},
    "miss": {"fg": "red"},
    "dim": {"dim": True},
    "bold": {"bold": True},
}


@dataclass(slots=True)
class Style:
    color: bool = False

    def __call__(self, text: str, kind: str) -> str:
        return click.style(text, **_STYLES[kind]) if self.color else text
