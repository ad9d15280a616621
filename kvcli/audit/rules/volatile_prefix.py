"""volatile-prefix: timestamps, dates, ids, nonces or counters that vary between prompts early in them.

At a divergence: the first differing character sits inside such a value (error when
the texts agree again right after it: the value alone breaks the shared prefix).
In tools/system text: such a value that does not vary yet is a latent break
(reported once per place, warning for times and ids, info for plain dates).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcli.audit.contrast import RESYNC
from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Finding, Segment
from kvcli.audit.rules.base import STABLE_KINDS, AuditContext, PromptView, Rule, prompt_name
from kvcli.audit.rules.patterns import LATENT_KINDS, VolatileSpan, span_covering, spans_in
from kvcli.audit.style import plural
from kvcli.audit.tokenizers import common_prefix_length


def _clip(value: str, limit: int = 48) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


@dataclass(slots=True)
class VolatileRun:
    """Varying values met one after another from the divergence, on both sides."""

    values: int = 0  # how many
    chars: int = 0  # characters the prompts would share without them
    alone: bool = False  # past the last one the texts agree again (or both end)
    other: VolatileSpan | None = None  # the other prompt's first value


def volatile_run(this: str, other: str, start: int, limit: int = 8) -> VolatileRun:
    """Skip value after value (a timestamp, then a request id...) while both sides hold one
    at the point where they differ; `alone` when what follows the last one agrees."""
    run = VolatileRun()
    a = b = start
    for _ in range(limit):
        mine, theirs = span_covering(this, a), span_covering(other, b)
        if mine is None or theirs is None:
            break
        run.other = run.other or theirs
        shared = common_prefix_length(this[mine.end :], other[theirs.end :])
        run.values += 1
        run.chars += mine.end - a + shared
        a, b = mine.end + shared, theirs.end + shared
        if shared >= RESYNC or a >= len(this) or b >= len(other):
            run.alone = True
            break
    return run


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
        run = volatile_run(contrast.this, contrast.other, contrast.start)
        if not run.alone and not view.in_stable_segment(contrast.start):
            return []  # the prompts differ anyway from here: the value is not what breaks them
        this_value = contrast.this[span.start : span.end]
        other_value = contrast.other[run.other.start : run.other.end] if run.other else contrast.other_diff
        stake = view.tokens_in(run.chars) if run.alone else 0
        seg = view.rendered.segment_at(contrast.start)
        where = f" in {seg.label}" if seg else ""
        message = (
            f"{span.kind.label} '{_clip(this_value)}'{where} differs from {prompt_name(self.ctx, contrast.against)}"
            f" ('{_clip(other_value)}'): the shared prefix ends at token {view.lcp}"
        )
        if run.alone:
            more = f" (and {plural(run.values - 1, 'more varying value')} after it)" if run.values > 1 else ""
            message += f"; without it{more} the texts agree again: ~{stake} more tokens could be cached"
        return [
            view.finding(
                self.id, "error" if run.alone else "warning", contrast.start, message, span.kind.fix,
                against=contrast.against, stake=stake, excerpt=view.contrast_excerpt(contrast),
            )
        ]  # fmt: skip


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
