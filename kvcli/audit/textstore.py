"""Recent prompt texts, bounded by total size; older ones are rebuilt from their tokens."""

from __future__ import annotations

from collections import OrderedDict


class TextStore:
    __slots__ = ("budget", "_texts", "_size")

    def __init__(self, budget_chars: int) -> None:
        self.budget = budget_chars
        self._texts: OrderedDict[int, str] = OrderedDict()
        self._size = 0

    def put(self, index: int, text: str) -> None:
        self._texts[index] = text
        self._size += len(text)
        while self._size > self.budget and len(self._texts) > 1:
            _, old = self._texts.popitem(last=False)
            self._size -= len(old)

    def get(self, index: int) -> str | None:
        text = self._texts.get(index)
        if text is not None:
            self._texts.move_to_end(index)
        return text
