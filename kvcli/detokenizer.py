"""Incremental detokenization: generated ids to text deltas, one token at a time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvcli.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turn generated ids into text one token at a time, emitting only finished text.

    A token can end inside a multi-byte UTF-8 character (emoji, CJK); decoding
    then yields U+FFFD, so the text is held back until a later token completes
    it. Text is computed as the difference between decodes of a short window
    that starts a few tokens back, which also keeps the spaces that
    sentencepiece decoders strip at the start of a decode. Without prompt ids,
    the concatenated deltas (plus flush()) equal tokenizer.decode(all ids).
    """

    __slots__ = ("_tokenizer", "_ids", "_prefix", "_read", "_prefix_text", "_skip", "text")

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        context_tokens: int = 5,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        # Only the prompt's last few tokens matter as decoding context.
        self._ids = list(prompt_ids[-context_tokens:]) if context_tokens > 0 else []
        self._prefix = 0
        self._read = len(self._ids)
        self._prefix_text = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip)
        self.text = ""

    def add(self, token_id: int) -> str:
        """Append one generated id; return the newly completed text (maybe "")."""
        self._ids.append(token_id)
        window_text = self._tokenizer.decode(
            self._ids[self._prefix :], skip_special_tokens=self._skip
        )
        if len(window_text) <= len(self._prefix_text) or window_text.endswith("\ufffd"):
            return ""
        delta = window_text[len(self._prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._tokenizer.decode(
            self._ids[self._prefix : self._read], skip_special_tokens=self._skip
        )
        self.text += delta
        return delta

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(token_id) for token_id in token_ids)

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character decodes as U+FFFD)."""
        window_text = self._tokenizer.decode(
            self._ids[self._prefix :], skip_special_tokens=self._skip
        )
        delta = window_text[len(self._prefix_text) :]
        self._prefix = self._read = len(self._ids)
        self._prefix_text = ""
        self.text += delta
        return delta
