"""The cheap checks of ``kvcli generate`` before the (slow) model load.

A bad path, an output that would be clobbered or is being written by another run, or an
unreadable ``--resume`` file fail here in milliseconds with exit status 2
(:class:`BatchUsageError`); nothing has been loaded or written yet.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from typing import BinaryIO

from kvcli.batch.config import GenerateConfig
from kvcli.batch.lock import OutputLock, OutputLocked, lock_output
from kvcli.batch.resume import ResumeState, scan_output
from kvcli.batch.source import InputFiles, RawLine, open_input
from kvcli.compression import CompressionError, check_writable_kind, strip_suffix, suffix_kind


class BatchUsageError(Exception):
    """Bad paths or input before anything ran: exit status 2."""


def input_files(cfg: GenerateConfig) -> InputFiles | None:
    """Several INPUTs: each checked readable now (exit 2 before the model loads)."""
    if not cfg.more_inputs:
        return None
    paths = [cfg.input, *cfg.more_inputs]
    for path in paths:
        open_path(path).close()
    return InputFiles(paths, cfg.max_line_bytes)


def check_paths(cfg: GenerateConfig) -> None:
    if cfg.more_inputs and "-" in (cfg.input, *cfg.more_inputs):
        raise BatchUsageError("- (stdin) cannot be combined with other INPUT files")
    if cfg.more_inputs and cfg.input_order == "prefix":
        raise BatchUsageError("--input-order prefix takes one INPUT file")
    if cfg.input_order == "prefix" and not _is_regular(cfg.input):
        raise BatchUsageError("--input-order prefix reads the input twice: it needs a regular "
                              "file, not stdin or a pipe")
    if cfg.resume and cfg.to_stdout:
        raise BatchUsageError("--resume needs -o FILE (it reads the results already there)")
    if cfg.to_stdout:
        return
    out = str(cfg.output)
    _check_compressed_output(out, cfg.resume)
    if os.path.isdir(out):
        raise BatchUsageError(f"-o {out}: is a directory")
    for path in (cfg.input, *cfg.more_inputs):
        if os.path.exists(out) and os.path.exists(path) and os.path.samefile(out, path):
            raise BatchUsageError("-o names an input file; write the results elsewhere")


def _check_compressed_output(out: str, resume: bool) -> None:
    kind = suffix_kind(out)
    if kind is None:
        return
    if resume:
        raise BatchUsageError(
            f"--resume cannot continue a compressed output (-o {out}): a {kind} stream cut by "
            "a kill cannot be cut back to its last whole result, nor appended to; write plain "
            f"-o {strip_suffix(out)} (resumable) and compress it when the run is done")
    try:
        check_writable_kind(kind)
    except CompressionError as err:
        raise BatchUsageError(str(err)) from None


def _is_regular(path: str) -> bool:
    try:
        return path != "-" and stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # let the open report it


def lock_output_file(cfg: GenerateConfig) -> OutputLock | None:
    """Lock ``-o FILE`` for this run (kvcli/batch/lock.py); a second writer stops here."""
    if cfg.to_stdout:
        return None
    try:
        lock = lock_output(str(cfg.output))
    except OutputLocked as err:
        raise BatchUsageError(str(err)) from None
    except OSError as err:
        raise BatchUsageError(f"cannot write {cfg.output}: {err.strerror or err}") from None
    # Checked under the lock: a run that just finished may have written it.
    if not (cfg.resume or cfg.overwrite) and os.fstat(lock.fd).st_size > 0:
        lock.release()
        raise BatchUsageError(f"{cfg.output} already has results; continue it with --resume, or "
                              "replace it with --overwrite")
    return lock


def open_path(path: str) -> BinaryIO:
    try:
        return open_input(path)
    except IsADirectoryError:
        raise BatchUsageError(f"{path}: is a directory, expected a JSONL file") from None
    except OSError as err:
        raise BatchUsageError(f"cannot read {path}: {err.strerror or err}") from None


def first_line(lines: Iterator[RawLine], path: str) -> RawLine | None:
    """The input's first request line; None when it has none (an empty input is no error)."""
    try:
        return next(lines, None)
    except OSError as err:  # a compressed input's damage too (kvcli/compression.py)
        raise BatchUsageError(f"cannot read {path}: {err.strerror or err}") from None


def resume_state(cfg: GenerateConfig) -> ResumeState:
    if not cfg.resume:
        return ResumeState()
    try:
        state = scan_output(str(cfg.output))
    except OSError as err:
        raise BatchUsageError(f"cannot resume {cfg.output}: {err.strerror or err}") from None
    for line_no in state.unreadable[:5]:
        print(f"kvcli generate: {cfg.output}:{line_no}: not a result line (kept, ignored)",
              file=sys.stderr)
    if state.truncated_bytes and not cfg.quiet:
        print(f"kvcli generate: {cfg.output}: removed a partial last line "
              f"({state.truncated_bytes} bytes) left by an interrupted run", file=sys.stderr)
    if not cfg.quiet:
        n = len(state.done)
        print(f"kvcli generate: resuming: {n} request{'s' if n != 1 else ''} already in {cfg.output}",
              file=sys.stderr)
    return state
