"""Reasoning models' replies: ``<think>…</think>`` reasoning split from the answer (torch-free).

The parsers take vLLM's names and semantics (``--reasoning-parser qwen3`` / ``deepseek_r1``):

* ``qwen3``: the reasoning is what a ``<think>`` opens and ``</think>`` closes; a reply
  without the markup is all answer (Qwen3 with ``enable_thinking: false``).
* ``deepseek_r1``: the reply starts inside the reasoning (R1's template ends the prompt
  with ``<think>``, or the model writes it); everything before ``</think>`` is reasoning.

Whether a reply starts inside the reasoning is read off the rendered prompt as well: a
prompt ending with ``<think>`` (a template that opens it, as QwQ's and R1's do) starts
inside; one ending with ``</think>`` (Qwen3's empty block for ``enable_thinking: false``)
starts outside. ``auto`` picks the parser from the chat template, or none.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"
CHOICES = ("auto", "none", "qwen3", "deepseek_r1")


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str | None  # None: the reply has no reasoning
    content: str | None  # None: the reply ended inside its reasoning (or has no answer)
    closed: bool  # the reasoning ended (or there was none): what follows is the answer


@dataclass(frozen=True, slots=True)
class ReasoningParser:
    name: str
    starts_inside: bool  # a reply begins inside its reasoning unless the prompt says otherwise

    def opens(self, prompt_text: str) -> bool:
        """Whether a reply to ``prompt_text`` begins inside its reasoning."""
        tail = prompt_text.rstrip()
        if tail.endswith(START):
            return True
        if tail.endswith(END):
            return False
        return self.starts_inside

    def split(self, text: str, inside: bool) -> Split:
        """The reply ``text`` -> reasoning and answer; ``inside``: from :meth:`opens`."""
        head = text.lstrip()
        if head.startswith(START):  # the model opened it itself
            text, inside = head[len(START):], True
        if not inside:
            return Split(None, text, True)
        reasoning, end, content = text.partition(END)
        if not end:
            return Split(reasoning, None, False)
        return Split(reasoning, content or None, True)  # as vLLM: the answer as written


PARSERS = {"qwen3": ReasoningParser("qwen3", starts_inside=False),
           "deepseek_r1": ReasoningParser("deepseek_r1", starts_inside=True)}


def detect(template: str | None) -> str | None:
    """The parser a chat template's model needs: DeepSeek-R1 and its distills, Qwen3 (and any
    other template with the ``<think>…</think>`` form); None for a template without it."""
    if not template or (START not in template and END not in template):
        return None
    if "<｜Assistant｜>" in template:  # DeepSeek's full-width markers: R1 and the R1 distills
        return "deepseek_r1"
    return "qwen3"


def resolve(choice: str, template: str | None) -> ReasoningParser | None:
    """``--reasoning-parser``'s value for a model with ``template``; ValueError if unknown."""
    if choice not in CHOICES:
        raise ValueError(f"--reasoning-parser: unknown parser {choice!r}; expected one of "
                         + ", ".join(CHOICES))
    name = detect(template) if choice == "auto" else None if choice == "none" else choice
    return PARSERS[name] if name else None
