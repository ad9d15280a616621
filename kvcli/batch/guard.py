"""The per-line guard: an exception no check foresaw becomes that line's ``engine_error``.

Every stage one line passes through on its own (reading and validating it, compiling its
constraint's checks, encoding, ``engine.add_request``, parsing the reply, serialising the
result) runs under it, so one hostile or unlucky line never ends a batch: its result line
says what failed, the rest runs, and ``--resume`` skips it like any failed line. The
traceback is the evidence of a kvcli bug: its last frame is printed once per run, the whole
traceback of every such line with ``--debug``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvcli.batch.records import FailedLine, LineError, LineId, Style
from kvcli.inputs import clip


def internal_failure(ident: LineId, style: Style | None, stage: str,
                     err: BaseException) -> FailedLine:
    """The failed line for an exception raised while ``stage`` ran (its cause kept for the log)."""
    detail = clip(str(err).splitlines()[0] if str(err) else "", 120)
    message = f"internal error while {stage}: {type(err).__name__}" + (f": {detail}" if detail
                                                                       else "")
    return FailedLine(ident, style, LineError(None, message, "engine_error"), cause=err)


@dataclass(slots=True)
class TracebackLog:
    """Says on stderr where guarded exceptions came from: once, or in full with ``--debug``."""

    report: Callable[[str], None]
    debug: bool = False
    count: int = 0

    def log(self, where: str, err: BaseException) -> None:
        self.count += 1
        if self.debug:
            self.report(f"kvcli generate: {where}: traceback (--debug):\n"
                        + "".join(traceback.format_exception(err)).rstrip())
        elif self.count == 1:
            self.report(f"kvcli generate: {where}: unexpected {type(err).__name__}"
                        f"{_last_frame(err)}; that line failed and the batch goes on. This is a "
                        "kvcli bug: --debug prints the full traceback (said once per run)")


def _last_frame(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {'/'.join(Path(last.filename).parts[-2:])}:{last.lineno} ({last.name})"
