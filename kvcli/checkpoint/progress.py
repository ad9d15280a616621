"""What preparing a model (a GGUF conversion, a hub download) prints on stderr.

On a terminal: one line per phase plus the libraries' own progress bars. Elsewhere (a log
file, a pipe, CI): one line per phase and no bars; transformers' bars used to write hundreds
of carriage-return updates into logs. Quiet (`--quiet`): nothing; errors are exceptions,
which the command reports. Importing this module loads neither torch nor transformers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class ModelProgress:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.bars = not quiet and _isatty(self.stream)

    def phase(self, text: str) -> None:
        if not self.quiet:
            print(f"kvcli: {text}", file=self.stream, flush=True)

    @contextmanager
    def library_output(self, transformers: bool = True) -> Iterator[None]:
        """huggingface_hub's bars (downloads) and, with `transformers`, transformers' (a
        conversion) only on a terminal; with quiet, transformers' warnings too."""
        if self.bars:
            yield
            return
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )

        hub_bars = not are_progress_bars_disabled()
        disable_progress_bars()
        try:
            if transformers:
                with self._transformers_quiet():
                    yield
            else:
                yield
        finally:
            if hub_bars:
                enable_progress_bars()

    @contextmanager
    def _transformers_quiet(self) -> Iterator[None]:
        from transformers.utils import logging as hf_logging

        was_enabled, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()
        if self.quiet:
            hf_logging.set_verbosity_error()
        try:
            with _gguf_bar_off():
                yield
        finally:
            hf_logging.set_verbosity(verbosity)
            if was_enabled:
                hf_logging.enable_progress_bar()


@contextmanager
def _gguf_bar_off() -> Iterator[None]:
    # transformers' GGUF reader calls tqdm.auto directly, past its own progress-bar switch:
    # its module-level name is swapped for a disabled bar while kvcli converts.
    from functools import partial

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = gguf_utils.tqdm
    gguf_utils.tqdm = partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
