"""volatile-prefix: timestamps, dates, ids, nonces or counters that vary between prompts early in them.

At a divergence: the first differing character sits inside such a value (error when
the texts agree again right after it: the value alone breaks the shared prefix).
In tools/system text: such a value that does not vary yet is a latent break
(reported once per place, warning for times and ids, info for plain dates).
"""

from __future__ import annotations

from kvcli.audit.contrast import Contrast
from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Finding
from kvcli.audit.rules.base import STABLE_KINDS, AuditContext, PromptView, Rule, prompt_name
from kvcli.audit.rules.patterns import VolatileSpan, span_covering, spans_in
from kvcli.audit.style import plural


def _clip(value: str, limit: int = 48) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


class VolatilePrefix(Rule):
    id = "volatile-prefix"
    phase = "divergence"
    summary = "a timestamp, id, nonce or counter that changes per request breaks the shared prefix"

    def check(self, view: PromptView) -> list[Finding]:
        contrast = view.contrast()
        if contrast is None or contrast.this_ends_first or contrast.other_ends_first:
            return []
        span = span_covering(contrast.this, contrast.start)
        if span is None:
            return []
        stable = view.in_stable_segment(contrast.start)
        if contrast.region is None and not stable:
            return []  # the prompts differ anyway from here: the value is not what breaks them
        other = span_covering(contrast.other, contrast.start)
        this_value = contrast.this[span.start : span.end]
        other_value = contrast.other[other.start : other.end] if other else contrast.other_diff
        chars, values = self._volatile_run(contrast)
        stake = view.tokens_in(chars)
        seg = view.rendered.segment_at(contrast.start)
        where = f" in {seg.label}" if seg else ""
        message = (
            f"{span.kind.label} '{_clip(this_value)}'{where} differs from {prompt_name(self.ctx, contrast.against)}"
            f" ('{_clip(other_value)}'): the shared prefix ends at token {view.lcp}"
        )
        if contrast.region is not None:
            more = f" (and {plural(values - 1, 'more varying value')} after it)" if values > 1 else ""
            message += f"; without it{more} the texts agree again: ~{stake} more tokens could be cached"
        severity = "error" if contrast.region is not None else "warning"
        return [
            view.finding(
                self.id, severity, contrast.start, message, span.kind.fix,
                against=contrast.against, stake=stake, excerpt=view.contrast_excerpt(contrast),
            )
        ]  # fmt: skip


    @staticmethod
    def _volatile_run(contrast: Contrast) -> tuple[int, int]:
        """Characters the prompts would share if the varying values from the divergence on
        were gone, and how many such values there are (they often come in runs: time, id)."""
        chars = values = 0
        for start, _, x, _, shared in contrast.regions():
            if span_covering(contrast.this, start) is None:
                break
            chars, values = chars + x + shared, values + 1
        return chars, values


class LatentVolatile(Rule):
    """Volatile-looking values inside tools/system text that every prompt would share."""

    id = "volatile-prefix"
    phase = "static"
    summary = VolatilePrefix.summary
    MEMO_LIMIT = 4096

    def __init__(self, ctx: AuditContext) -> None:
        super().__init__(ctx)
        self._reported: dict[tuple[str, str], Finding] = {}
        self._memo: dict[int, list[VolatileSpan]] = {}

    def _spans(self, text: str, start: int, end: int) -> list[VolatileSpan]:
        key = hash(text[start:end])  # equality within one run is all this memo needs
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            found = self._memo[key] = [
                VolatileSpan(s.start - start, s.end - start, s.kind)
                for s in spans_in(text, start, end)
                if s.kind.latent
            ]
        return found

    def check(self, view: PromptView) -> list[Finding]:
        limit = view.divergence.char if view.divergence else len(view.text)
        new: list[Finding] = []
        for seg in view.rendered.segments:
            if seg.kind not in STABLE_KINDS or seg.start >= limit:
                continue
            for span in self._spans(view.text, seg.start, seg.end):
                start, end = seg.start + span.start, seg.start + span.end
                if end > limit or self._seen(view, span, start):
                    continue
                value = view.text[start:end]
                message = (
                    f"{span.kind.label} '{_clip(value)}' in {seg.label}: it is part of the shared prefix, "
                    "and every request that carries a different value misses the cache from here on"
                )
                found = view.finding(
                    self.id, span.kind.latent, start, message, span.kind.fix,  # type: ignore[arg-type]
                    excerpt=make_excerpt(view.text, start),
                )  # fmt: skip
                self._reported[(span.kind.name, view.text[max(0, start - 32) : start])] = found
                new.append(found)
        return new

    def _seen(self, view: PromptView, span: VolatileSpan, start: int) -> bool:
        found = self._reported.get((span.kind.name, view.text[max(0, start - 32) : start]))
        if found is not None:
            found.count += 1
        return found is not None
