"""cache-breakpoints: explicit breakpoints the provider refuses, ignores, or cannot use.

Anthropic (cache_control): more than 4 breakpoints is a 400 error; a read walks back at most 20
content blocks from a breakpoint, so a prefix an earlier request wrote further back is never
found. OpenAI (prompt_cache_breakpoint, gpt-5.6 and later; profiles.OPENAI_BREAKPOINT_MODELS):
only the latest 4 writes a request (3 beside the implicit one); on other models the marker is
not offered and changes nothing; mode "explicit" without a marker caches nothing. Both: a
breakpoint below the model's minimum writes nothing; one after per-request content writes, at
the write price, what no later request reads (found at the end of the run, by its place).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kvcli.audit.profiles import OPENAI_BREAKPOINTS_AS_OF, Profile
from kvcli.audit.records import Finding
from kvcli.audit.rules.base import AuditContext, PromptView, Rule
from kvcli.audit.style import plural

FIX_COUNT = "Use at most 4 cache_control breakpoints per request (automatic caching takes one of them)."
FIX_LOOKBACK = (
    "Add a cache_control breakpoint within 20 content blocks after the part earlier requests "
    "wrote (e.g. at the end of the previous turn), or append fewer blocks per turn."
)
FIX_OFFERED = ("Remove prompt_cache_breakpoint / prompt_cache_options for this model (its caching is automatic), "
               "or send the request to a model that takes them (gpt-5.6 and later).")
FIX_OPENAI_COUNT = ("Keep at most 3 prompt_cache_breakpoint markers (4 with prompt_cache_options.mode "
                    "\"explicit\"): the earlier ones are not written.")
FIX_EXPLICIT = "Mark the end of the shared prefix with prompt_cache_breakpoint, or drop mode \"explicit\"."
FIX_MINIMUM = ("Move the breakpoint later, past the minimum (after the tools and system prompt, or the "
               "first turns), or drop it: a prefix below the minimum is never cached.")
FIX_UNREAD = ("Move the breakpoint to the end of the part requests share (tools, system prompt, earlier "
              "turns), before the per-request content, or remove it: every unread write is billed at "
              "the write price.")


class Breakpoints(Rule):
    id = "cache-breakpoints"
    phase = "static"
    summary = "explicit breakpoints refused, not offered, below the minimum, out of lookback, or never read"

    def check(self, view: PromptView) -> list[Finding]:
        profile, request = self.ctx.profile, view.rendered.request
        if profile.breakpoint_models and not profile.takes_breakpoints(request.model):
            return self._not_offered(view)
        if not profile.takes_breakpoints(request.model):
            return []
        found = self._count(view) + self._below_minimum(view)
        if profile.hit_model == "breakpoints" and view.breakpoint_reachable > view.cached:
            lost = view.breakpoint_reachable - view.cached
            message = (
                f"an earlier request wrote a {view.breakpoint_reachable}-token prefix of this prompt, but it is "
                f"more than {profile.lookback_blocks} blocks before every breakpoint: {lost} tokens are not read"
            )
            found.append(view.finding(self.id, "warning", None, message, FIX_LOOKBACK, stake=lost))
        if profile.hit_model != "breakpoints" and request.cache_mode == "explicit" and not view.breakpoints:
            message = "prompt_cache_options.mode is \"explicit\" and no block has a prompt_cache_breakpoint: nothing is cached"
            found.append(view.finding(self.id, "warning", None, message, FIX_EXPLICIT, stake=view.tokens))
        return found

    def _not_offered(self, view: PromptView) -> list[Finding]:
        request = view.rendered.request
        markers = sum(s.breakpoint for s in view.rendered.segments)
        if not markers and request.cache_mode is None:
            return []
        what = f"{markers} prompt_cache_breakpoint marker(s)" if markers else "prompt_cache_options"
        model = request.model or "a request without a model"
        message = (f"{what} on {model}: explicit breakpoints are not offered for it (OpenAI: gpt-5.6 and later, "
                   f"as of {OPENAI_BREAKPOINTS_AS_OF}; --provider-rules adds a model): caching stays automatic")
        return [view.finding(self.id, "warning", None, message, FIX_OFFERED)]

    def _count(self, view: PromptView) -> list[Finding]:
        profile, request = self.ctx.profile, view.rendered.request
        if profile.hit_model == "breakpoints":
            if profile.max_breakpoints and view.breakpoints > profile.max_breakpoints:
                message = f"{view.breakpoints} cache_control breakpoints; the API accepts at most {profile.max_breakpoints}"
                return [view.finding(self.id, "error", None, message, FIX_COUNT)]
            return []
        written = profile.max_breakpoints - (request.cache_mode != "explicit")
        if view.breakpoints <= written:
            return []
        message = (f"{view.breakpoints} prompt_cache_breakpoint markers; OpenAI writes only the latest {written} "
                   f"of them{' beside the implicit breakpoint' if written < profile.max_breakpoints else ''}")
        return [view.finding(self.id, "warning", None, message, FIX_OPENAI_COUNT)]

    def _below_minimum(self, view: PromptView) -> list[Finding]:
        short = [(label, end) for label, end in view.breakpoint_marks if end < view.min_tokens]
        if not short:
            return []
        where = ", ".join(f"{label} ({end:,} tokens)" for label, end in short[:3])
        model = view.rendered.request.model or self.ctx.profile.name
        message = (f"{len(short)} breakpoint(s) below {model}'s minimum cacheable prefix of {view.min_tokens:,} "
                   f"tokens, which write nothing: {where}")
        return [view.finding(self.id, "warning", None, message, FIX_MINIMUM)]


def unread_findings(cache: Any, profile: Profile, ctx: AuditContext) -> list[Finding]:
    """A breakpoint after per-request content: explicit breakpoints at one place (segment label),
    in two or more requests, never read there, whose prefix up to the part they mark a later request had as well (so the
    marked part is what differs; a conversation's last turn, which no later request extends, is
    not one)."""
    by_label: dict[str, list[tuple[int, str, str, int]]] = defaultdict(list)
    for key, entry in cache.unread.items():
        if entry[2] and key in cache.shared_before:
            by_label[entry[2]].append(entry)
    found = []
    for label, entries in by_label.items():
        if len(entries) < 2 or cache.read_at[label]:  # a pattern of the input, not a one-off
            continue
        first = min(entries, key=lambda e: e[3])
        tokens = sum(e[0] for e in entries)
        message = (f"a breakpoint after per-request content: at {label}, {plural(len(entries), 'request')} wrote "
                   f"{tokens:,} tokens (billed as cache writes) that no later request read, though later requests "
                   f"had the prompt up to it; first {first[1]}")
        found.append(Finding("cache-breakpoints", "warning", first[3], None, message, FIX_UNREAD,
                             prompt_id=ctx.id_of(first[3]), segment=label, count=len(entries)))
    return found
