"""llama.cpp's server cache: each slot keeps the tokens of the last prompt it ran, and a new
prompt reuses only its longest common prefix with the slot it lands in.

Slot choice follows llama-server's get_available_slot: among idle slots, the one sharing the
longest prefix, if that prefix is more than `similarity` of the new prompt
(--slot-prompt-similarity, 0.1 in common/common.h of 2025 builds, 0.5 before); else the
least recently used slot. Prompts run one at a time, so every slot is idle. Not modelled:
the RAM prompt cache of newer builds (--cache-ram, which can restore other prompts into a
slot: run the server with --cache-ram 0 to match) and the generated tokens a slot also keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcli.audit.prefix_index import common_prefix_length


@dataclass(slots=True)
class SlotCache:
    slots: int = 1
    similarity: float = 0.1
    _tokens: list[bytes] = field(default_factory=list)  # per slot: its last prompt (uint32 bytes)
    _used: list[int] = field(default_factory=list)  # per slot: when it last ran a prompt
    _clock: int = 0

    def __post_init__(self) -> None:
        self._tokens = [b""] * self.slots
        self._used = [-1] * self.slots

    def step(self, raw: bytes) -> int:
        """Run one prompt (token ids as uint32 bytes); the tokens its slot already had."""
        shared = [common_prefix_length(cached, raw) // 4 for cached in self._tokens]
        n = len(raw) // 4
        best = max(range(self.slots), key=lambda s: (shared[s], -s))
        if not (shared[best] and shared[best] > self.similarity * n):
            best = min(range(self.slots), key=lambda s: self._used[s])
        self._tokens[best] = raw
        self._used[best] = self._clock
        self._clock += 1
        return shared[best]
