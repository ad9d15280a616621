"""Everything the job says on stderr: per-line errors, warnings, the progress bar.

The bar (tqdm: requests done, generated tok/s, prefix-cache hit rate) is shown
when stderr is a terminal, or with ``--progress``; never with ``--quiet``.
Errors and warnings are always printed (through tqdm so they do not tear the bar).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from kvcli.batch.summary import RunCounters

_POSTFIX_EVERY_S = 0.5


class Reporter:
    def __init__(self, *, show_progress: bool, quiet: bool, total: int | None = None) -> None:
        self.quiet = quiet
        self._bar: Any = None
        self._last_postfix = 0.0
        if show_progress and not quiet:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True,
                             desc="generate", smoothing=0.1)

    def error(self, text: str) -> None:
        """Per-line errors and warnings: printed even with --quiet."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def info(self, text: str) -> None:
        if not self.quiet:
            self.error(text)

    def advance(self, counters: RunCounters, n: int = 1) -> None:
        if self._bar is None:
            return
        self._bar.update(n)
        now = time.monotonic()
        if now - self._last_postfix >= _POSTFIX_EVERY_S:
            self._last_postfix = now
            elapsed = max(counters.elapsed, 1e-9)
            self._bar.set_postfix(
                failed=counters.failed, gen_tok_s=f"{counters.generated_tokens / elapsed:.1f}",
                hit=f"{100 * counters.hit_rate:.0f}%", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
