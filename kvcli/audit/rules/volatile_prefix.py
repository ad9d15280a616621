"""volatile-prefix: timestamps, dates, ids, nonces or counters that vary between prompts early in them.

At a divergence: the first differing character sits inside such a value (error when
the texts agree again right after it: the value alone breaks the shared prefix).
In tools/system text: such a value that does not vary yet is a latent break
(reported once per place, warning for times and ids, info for plain dates).
"""

from __future__ import annotations

from kvcli.audit.contrast import Contrast
from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Finding, Segment
from kvcli.audit.rules.base import STABLE_KINDS, AuditContext, PromptView, Rule, prompt_name
from kvcli.audit.rules.patterns import LATENT_KINDS, VolatileSpan, span_covering, spans_in
from kvcli.audit.style import plural


def _clip(value: str, limit: int = 48) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


SLACK = 2  # the differing text may run a character or two past the value (a changed separator)


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
        alone = contrast.region is not None and contrast.start + contrast.region[0] <= span.end + SLACK
        if not alone and not view.in_stable_segment(contrast.start):
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
        if alone:
            more = f" (and {plural(values - 1, 'more varying value')} after it)" if values > 1 else ""
            message += f"; without it{more} the texts agree again: ~{stake} more tokens could be cached"
        severity = "error" if alone else "warning"
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
            span = span_covering(contrast.this, start)
            if span is None or start + x > span.end + SLACK:
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
        self._memo: dict[int, list[tuple[VolatileSpan, str]]] = {}
        self._segment_memo: dict[tuple[int, str], list[VolatileSpan]] = {}

    def _stable_spans(self, view: PromptView) -> list[tuple[VolatileSpan, str]]:
        """Latent values in the tools/schema/system segments, with their segment's label. Memoized
        on the text of the stable region: nearly every prompt repeats the previous one's."""
        segments = [s for s in view.rendered.segments if s.kind in STABLE_KINDS]
        if not segments:
            return []
        lo, hi = segments[0].start, segments[-1].end
        key = hash((lo, view.text[lo:hi]))  # equality within one run is all this memo needs
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            found = self._memo[key] = [(span, seg.label) for seg in segments for span in self._segment_spans(view, seg)]
        return found

    def _segment_spans(self, view: PromptView, seg: Segment) -> list[VolatileSpan]:
        """One segment's latent values (memoized too: when a timestamp changes the system prompt,
        the tool definitions around it are not scanned again)."""
        key = (seg.start, view.text[seg.start : seg.end])
        found = self._segment_memo.get(key)
        if found is None:
            if len(self._segment_memo) >= self.MEMO_LIMIT:
                self._segment_memo.clear()
            found = self._segment_memo[key] = spans_in(view.text, seg.start, seg.end, LATENT_KINDS)
        return found

    def check(self, view: PromptView) -> list[Finding]:
        limit = view.divergence.char if view.divergence else len(view.text)
        new: list[Finding] = []
        for span, label in self._stable_spans(view):
            if span.end > limit or self._seen(view, span):
                continue
            message = (
                f"{span.kind.label} '{_clip(view.text[span.start : span.end])}' in {label}: it is part of "
                "the shared prefix, and every request that carries a different value misses the cache from here on"
            )
            found = view.finding(
                self.id, span.kind.latent, span.start, message, span.kind.fix,  # type: ignore[arg-type]
                excerpt=make_excerpt(view.text, span.start),
            )  # fmt: skip
            self._reported[self._key(view, span)] = found
            new.append(found)
        return new

    @staticmethod
    def _key(view: PromptView, span: VolatileSpan) -> tuple[str, str]:
        """The same value slot: its kind and the text just before it."""
        return span.kind.name, view.text[max(0, span.start - 32) : span.start]

    def _seen(self, view: PromptView, span: VolatileSpan) -> bool:
        found = self._reported.get(self._key(view, span))
        if found is not None:
            found.count += 1
        return found is not None
