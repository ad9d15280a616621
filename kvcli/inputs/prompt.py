"""What a request asks the model to continue: text, chat messages (+ tools), or token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcli.inputs.content import PartText, template_messages, text_part
from kvcli.inputs.errors import LineError, show_value


@dataclass(slots=True)
class Prompt:
    """Exactly one of ``text``, ``messages`` or ``token_ids`` is set.

    Messages are kept as given (key order, content parts); ``system`` is an
    Anthropic top-level system prompt. ``source`` is the input field the prompt
    came from, for errors found later (rendering, encoding).
    """

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    token_ids: list[int] | None = None
    system: Any = None
    source: str = "prompt"
    system_source: str = "system"
    # A line's chat_template_kwargs (e.g. Qwen3's enable_thinking), passed to the template.
    template_kwargs: dict[str, Any] | None = None

    def chat(self, part_text: PartText = text_part) -> list[dict[str, Any]]:
        """The messages a chat template renders (see content.py for how content is cleaned)."""
        return template_messages(self.messages or [], self.system, source=self.source,
                                 system_source=self.system_source, part_text=part_text)


def template_kwargs(body: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    """``chat_template_kwargs`` (vLLM's name): an object of extra variables for the template."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise LineError(f"{prefix}chat_template_kwargs", "expected an object of template "
                        f"variables, got {show_value(value)}")
    return value


def check_text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise LineError(name, f"expected a non-empty string, got {show_value(value)}")
    return value


def check_token_ids(value: Any, name: str) -> list[int]:
    """Non-empty list of non-negative ints (the vocabulary range is checked when encoding)."""
    if not isinstance(value, list) or not value:
        raise LineError(name, f"expected a non-empty list of token ids, got {show_value(value)}")
    for i, tok in enumerate(value):
        if not isinstance(tok, int) or isinstance(tok, bool) or tok < 0:
            raise LineError(f"{name}[{i}]", f"expected a token id (integer >= 0), got {show_value(tok)}")
    return value
