"""What one engine would have cached for the same requests in the same order (the audit's rule).

The same computation as :func:`kvcli.audit.hits.predict_cached_tokens` (leading
hits against every block hash seen so far, at least one token computed), fed one
request at a time so the driver never holds the input's token ids. Only the block
hashes are kept; past ``max_blocks`` distinct blocks the prediction is given up
(``None``) rather than letting the driver's memory grow with the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvcli.audit.hits import leading_hits, usable_blocks

MAX_BLOCKS = 1 << 19  # ~50 MB of hashes: 8M distinct prompt tokens at 16 per block


@dataclass(slots=True)
class SingleEnginePrediction:
    block_size: int
    max_blocks: int = MAX_BLOCKS
    given_up: bool = False
    _seen: set[bytes] = field(default_factory=set)

    def add(self, block_hashes: Sequence[bytes], num_tokens: int) -> int | None:
        """Predicted cached tokens of the next request (None once the prediction is given up)."""
        if self.given_up:
            return None
        matched = leading_hits(block_hashes, self._seen)
        self._seen.update(block_hashes)
        if len(self._seen) > self.max_blocks:
            self.given_up = True
            self._seen = set()
            return None
        return usable_blocks(matched, num_tokens, self.block_size, True) * self.block_size
