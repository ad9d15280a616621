"""cache-breakpoints (anthropic profile): breakpoints the API refuses or cannot read through.

More than 4 cache_control breakpoints is a 400 error. A read walks back at most
20 content blocks from a breakpoint: a prefix an earlier request wrote further
back is never found (add a breakpoint closer to it, or append fewer blocks per turn).
"""

from __future__ import annotations

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule

FIX_COUNT = "Use at most 4 cache_control breakpoints per request (automatic caching takes one of them)."
FIX_LOOKBACK = (
    "Add a cache_control breakpoint within 20 content blocks after the part earlier requests "
    "wrote (e.g. at the end of the previous turn), or append fewer blocks per turn."
)


class Breakpoints(Rule):
    id = "cache-breakpoints"
    phase = "static"
    summary = "Anthropic breakpoints: more than 4, or a cached prefix beyond the 20-block lookback"

    def check(self, view: PromptView) -> list[Finding]:
        profile = self.ctx.profile
        if profile.hit_model != "breakpoints":
            return []
        found = []
        if profile.max_breakpoints and view.breakpoints > profile.max_breakpoints:
            message = f"{view.breakpoints} cache_control breakpoints; the API accepts at most {profile.max_breakpoints}"
            found.append(view.finding(self.id, "error", None, message, FIX_COUNT))
        if view.breakpoint_reachable > view.cached:
            lost = view.breakpoint_reachable - view.cached
            message = (
                f"an earlier request wrote a {view.breakpoint_reachable}-token prefix of this prompt, but it is "
                f"more than {profile.lookback_blocks} blocks before every breakpoint: {lost} tokens are not read"
            )
            found.append(view.finding(self.id, "warning", None, message, FIX_LOOKBACK, stake=lost))
        return found
