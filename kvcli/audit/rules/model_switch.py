"""model-switch: the model changes between requests of one conversation (caches are per model)."""

from __future__ import annotations

from kvcli.audit.records import Finding
from kvcli.audit.rules.base import PromptView, Rule, prompt_name

FIX = (
    "Keep one model per conversation; if you route between models, route whole sessions, "
    "not single turns."
)


class ModelSwitch(Rule):
    id = "model-switch"
    phase = "structure"
    summary = "the model changes within a conversation, so its cache starts cold"

    def check(self, view: PromptView) -> list[Finding]:
        shape = view.shape
        prev = self.ctx.conversations.previous(shape) if shape else None
        if shape is None or prev is None or not prev.model or not shape.model or prev.model == shape.model:
            return []
        scope = f"session '{shape.session}'" if shape.session is not None else "the same conversation"
        stake = min(view.tokens, view.lcp)
        message = (
            f"model changed from '{prev.model}' to '{shape.model}' since {prompt_name(self.ctx, prev.index)} "
            f"({scope}); each model has its own cache, so ~{stake} tokens of shared history are recomputed"
        )
        return [view.finding(self.id, "warning", None, message, FIX, against=prev.index, stake=stake)]
