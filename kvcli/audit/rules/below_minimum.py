"""below-minimum: a shared prefix too short for the profile's minimum cacheable length.

Providers skip caching silently below a minimum (OpenAI 1024 tokens, Anthropic
1024-4096 by model). A prompt that shares a real prefix with earlier prompts but
stays under the minimum gets nothing. For the kvcli profile the minimum is one
block, so this rule only speaks for provider profiles.
"""

from __future__ import annotations

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name

FIX = (
    "Grow the stable prefix past the minimum: move static instructions, few-shot examples and "
    "tool definitions to the front, ahead of anything that varies -- or accept no caching for "
    "these prompts."
)


class BelowMinimum(Rule):
    id = "below-minimum"
    phase = "static"
    summary = "the shared prefix is shorter than the minimum the target caches"

    def check(self, view: PromptView) -> list[Finding]:
        minimum, block = view.min_tokens, self.ctx.profile.block_size
        if minimum <= block or view.cached > 0 or view.divergence is None:
            return []
        if view.lcp >= minimum or view.lcp < max(block, minimum // 8):
            return []
        short = f"; the whole prompt has only {view.tokens} tokens" if view.tokens < minimum else ""
        message = (
            f"shares {view.lcp} tokens with {prompt_name(self.ctx, view.divergence.against)}, but "
            f"{self.ctx.profile.name} caches only prefixes of at least {minimum} tokens{short}: "
            "nothing is cached"
        )
        return [view.finding(self.id, "warning", None, message, FIX, against=view.divergence.against, stake=view.lcp)]
