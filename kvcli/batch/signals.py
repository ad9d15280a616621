"""Ctrl-C / SIGTERM during a batch: the first one asks the job to stop, a second stops at once.

The first signal only sets a flag: the job finishes the engine step it is in,
writes what finished, aborts the rest and exits 130 (SIGINT) or 143 (SIGTERM).
A second signal raises KeyboardInterrupt straight away.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopSignal:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __bool__(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 1) if self.signum is not None else 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopSignal:
        # Handlers can only be installed from the main thread (tests may run elsewhere).
        if threading.current_thread() is threading.main_thread():
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
