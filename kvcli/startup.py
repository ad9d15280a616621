"""Ctrl-C or SIGTERM while the kvcli command starts: exit 130 / 143 at once, never a traceback.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to
be. While kvcli starts, that is mostly inside imports and library calls (torch,
transformers, tokenizers), some of them Python code called back from C++ through pybind11,
where the exception cannot unwind: `kvcli generate` then aborted with `terminate called after
throwing an instance of 'pybind11::error_already_set'` (exit 134), printed a traceback
(exit 130 by signal), or click's "Aborted!" (exit 1). Start-up writes nothing a user keeps,
so the handler installed here, before any heavy import, raises nothing: it removes what was
registered with :func:`removed_if_interrupted` (a half-written model conversion) and leaves
with ``os._exit``. The batch job replaces it with its graceful handler while it runs
(kvcli/batch/signals.py) and puts it back afterwards. Imports only the standard library.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_to_remove: list[Path] = []


def launched_as_cli() -> bool:
    """True in the `kvcli` console script (`python -m kvcli` installs from kvcli/__main__.py)."""
    argv = getattr(sys, "argv", None) or [""]
    return os.path.basename(argv[0]) == "kvcli"


def install() -> None:
    """Exit at once on SIGINT / SIGTERM (main thread only, as Python requires)."""
    for sig in EXIT_CODES:
        signal.signal(sig, _exit_now)


def release() -> None:
    """Give Python's default handling back, for commands that handle Ctrl-C themselves
    (audit, bench, --ray). A no-op unless this module's handler is the current one."""
    if signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is _exit_now:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def is_installed() -> bool:
    return signal.getsignal(signal.SIGINT) is _exit_now


@contextmanager
def removed_if_interrupted(path: Path) -> Iterator[None]:
    """Delete `path` (a directory being written) if a signal ends the process meanwhile."""
    _to_remove.append(path)
    try:
        yield
    finally:
        _to_remove.remove(path)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    for path in list(_to_remove):
        shutil.rmtree(path, ignore_errors=True)
    name = signal.Signals(signum).name
    try:
        os.write(2, f"kvcli: stopped by {name}\n".encode())
    except OSError:  # stderr closed: the exit status still says it
        pass
    os._exit(EXIT_CODES[signum])
