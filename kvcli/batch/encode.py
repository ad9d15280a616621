"""A parsed prompt -> token ids, with the checks that need the model (vocabulary, context length).

Chat messages are rendered with the model's chat template (with ``tools`` when
given, and the generation prompt) and encoded without adding special tokens
again; plain text is encoded with them (BOS), as ``transformers`` does. The
messages a template sees come from the shared request model (``Prompt.chat``),
the same the audit renders. A template that ignores ``tools`` (the prompt is
the same without them) is counted, so the run can say so instead of silently
dropping them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcli.batch.records import LineError, LineRequest, PromptSpec, clip
from kvcli.reasoning import END, START, ReasoningParser


@dataclass(slots=True)
class PromptEncoder:
    tokenizer: Any  # kvcli.tokenizer.Tokenizer (encode, apply_chat_template)
    max_model_len: int
    vocab_size: int
    tools_ignored: list[int] = field(default_factory=list)  # lines whose tools the template dropped
    reasoning: ReasoningParser | None = None  # --reasoning-parser: chat replies are split

    def encode(self, spec: PromptSpec, line_no: int = 0) -> list[int]:
        text = self._render_chat(spec, line_no) if spec.messages is not None else None
        return self._ids(spec, text)

    def encode_line(self, req: LineRequest, line_no: int = 0) -> list[int]:
        """:meth:`encode`, and whether the reply will start inside a reasoning block."""
        spec = req.prompt
        if self.reasoning is None or spec.messages is None:
            return self.encode(spec, line_no)
        text = self._render_chat(spec, line_no)
        req.reasoning = self.reasoning
        req.reasoning_inside = self.reasoning.opens(text)
        _check_constraint(req, text, self.tokenizer)
        return self._ids(spec, text)

    def encode_input(self, spec: PromptSpec) -> list[int]:
        """An embedding input: text with the tokenizer's special tokens, no template; it adds
        no token, so it may fill the whole context."""
        return self._ids(spec, None, room=0)

    def _ids(self, spec: PromptSpec, text: str | None, room: int = 1) -> list[int]:
        if spec.token_ids is not None:
            ids = spec.token_ids
            bad = next((i for i, t in enumerate(ids) if t >= self.vocab_size), None)
            if bad is not None:
                raise LineError(f"{spec.source}[{bad}]", f"token id {ids[bad]} is outside the "
                                f"model's vocabulary [0, {self.vocab_size})")
        elif text is not None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(spec.text, add_special_tokens=True)
        if not ids:
            raise LineError(spec.source, "encodes to no tokens")
        if len(ids) + room > self.max_model_len:
            need = " (prompt plus at least one new token)" if room else ""
            raise LineError(spec.source, f"{len(ids)} tokens do not fit the model's context of "
                            f"{self.max_model_len} tokens{need}", "context_length_exceeded")
        return list(ids)

    def _render_chat(self, spec: PromptSpec, line_no: int) -> str:
        messages = spec.chat()
        text = self._template(spec, messages, spec.tools)
        if spec.tools and text == self._template(spec, messages, None):
            self.tools_ignored.append(line_no)
        return text

    def _template(self, spec: PromptSpec, messages: list[Any], tools: list[Any] | None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                      **(spec.template_kwargs or {}))
        except Exception as err:  # a template (user data + jinja) failing is a per-line error
            raise LineError(spec.source, "the model's chat template failed: "
                            f"{clip(str(err) or type(err).__name__, 200)}") from None


def _check_constraint(req: LineRequest, text: str, tokenizer: Any) -> None:
    """A grammar must not constrain the reasoning. A reply that starts inside it (the prompt
    opens ``<think>``) gets its grammar after ``</think>``, as vLLM's reasoning + structured
    outputs; one that starts closed needs nothing. Where the model may or may not open a
    block itself (Qwen3's own template), its first token may be the grammar's or ``<think>``,
    and which one it picks decides: that needs ``<think>`` to be one token that the reply's
    text shows (else the line is refused rather than answered wrongly)."""
    constraint = req.params.structured_outputs
    if constraint is None or text.rstrip().endswith(END):
        return
    req.params.structured_after = tokenizer.encode(END, add_special_tokens=False)
    if req.reasoning_inside:
        return
    opener = tokenizer.encode(START, add_special_tokens=False)
    if len(opener) == 1 and tokenizer.decode(opener) == START:
        req.params.structured_opener = opener[0]
        return
    path = (constraint.path or f"{req.field_prefix}structured_outputs").split(".")
    name = ".".join(path[:2] if req.field_prefix else path[:1])
    why = (f"{len(opener)} tokens here" if len(opener) != 1
           else f"shown as {tokenizer.decode(opener)!r}")
    raise LineError(name, "a grammar after a reasoning block the model may or may not open "
                    f"(--reasoning-parser {req.reasoning.name}) needs {START} as one token its "
                    f"text shows ({why}); turn thinking off for the line "
                    '("chat_template_kwargs": {"enable_thinking": false}) or run with '
                    "--reasoning-parser none")
