"""What a rule sees (PromptView, AuditContext) and what it returns (Finding)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from kvcli.audit.contrast import Contrast
from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.profiles import Profile
from kvcli.audit.records import Divergence, Excerpt, Finding, RenderedPrompt, Severity
from kvcli.audit.shapes import Conversations, RequestShape

Phase = Literal["divergence", "structure", "static"]
STABLE_KINDS = ("tools", "schema", "system")


@dataclass(slots=True)
class AuditContext:
    """Run-wide state rules may read: earlier prompts' texts and ids, open conversations."""

    profile: Profile
    text_of: Callable[[int], str]
    id_of: Callable[[int], str | None]
    session_of: Callable[[int], str | None]
    conversations: Conversations


@dataclass(slots=True)
class PromptView:
    rendered: RenderedPrompt
    tokens: int
    cached: int
    lcp: int  # tokens shared with the earlier prompt sharing the longest prefix
    min_tokens: int
    divergence: Divergence | None
    shape: RequestShape | None
    contrast_factory: Callable[[], Contrast | None]
    findings: list[Finding] = field(default_factory=list)
    breakpoint_reachable: int = 0  # anthropic: longest prefix an earlier request wrote
    breakpoints: int = 0
    breakpoint_marks: list[tuple[str, int]] = field(default_factory=list)  # explicit ones: (label, token end)
    _contrast: Contrast | None = None
    _contrast_done: bool = False

    @property
    def index(self) -> int:
        return self.rendered.index

    @property
    def text(self) -> str:
        return self.rendered.text

    def contrast(self) -> Contrast | None:
        """This prompt against the earlier one sharing its longest prefix (built once, on demand)."""
        if not self._contrast_done:
            self._contrast = self.contrast_factory() if self.divergence is not None else None
            self._contrast_done = True
        return self._contrast

    def tokens_in(self, chars: int) -> int:
        """Characters of this prompt as an estimated number of tokens (its own ratio)."""
        return round(chars * self.tokens / len(self.text)) if self.text else 0

    def tokens_after(self, char: int) -> int:
        return self.tokens_in(max(0, len(self.text) - char))

    def finding(
        self,
        rule: str,
        severity: Severity,
        char: int | None,
        message: str,
        fix: str,
        *,
        against: int | None = None,
        stake: int = 0,
        excerpt: Excerpt | None = None,
    ) -> Finding:
        seg = self.rendered.segment_at(char) if char is not None else None
        return Finding(
            rule=rule, severity=severity, prompt=self.index, char=char, message=message, fix=fix,
            prompt_id=self.rendered.request.id, segment=seg.label if seg else None, against=against,
            tokens_at_stake=stake, excerpt=excerpt,
        )  # fmt: skip

    def contrast_excerpt(self, contrast: Contrast, char: int | None = None) -> Excerpt:
        at = contrast.start if char is None else char
        return make_excerpt(contrast.this, at, contrast.other, against=contrast.against)

    def in_stable_segment(self, char: int) -> bool:
        seg = self.rendered.segment_at(char)
        return seg is not None and seg.kind in STABLE_KINDS

    def has_finding_at(self, start: int, end: int) -> bool:
        return any(f.char is not None and start <= f.char < end for f in self.findings)


class Rule:
    """A rule looks at one prompt at a time; `finish` may add findings at the end of the run."""

    id: ClassVar[str]
    phase: ClassVar[Phase]
    summary: ClassVar[str]

    def __init__(self, ctx: AuditContext) -> None:
        self.ctx = ctx

    def check(self, view: PromptView) -> list[Finding]:
        raise NotImplementedError

    def finish(self) -> list[Finding]:
        return []


def prompt_name(ctx: AuditContext, index: int) -> str:
    """'prompt 3 "req-3"' (or 'prompt 3' without an id) for messages."""
    found = ctx.id_of(index)
    return f'prompt {index} "{found}"' if found else f"prompt {index}"
