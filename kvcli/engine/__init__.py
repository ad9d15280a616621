"""kvcli's inference engine (the thread-pool environment it needs is set in kvcli/__init__.py)."""

from __future__ import annotations

import gc
import sys
from typing import Any


def engine_class() -> Any:
    """The engine's class, for the processes that run it (`kvcli generate`, serve, perplexity,
    the bench's own rows, Ray's engine workers). The first import of torch makes ~10^6 objects that live as long as the process;
    the collector's full passes over them (3 while importing, 0.2-0.3 s of start-up, and ~0.3 s
    more over a 9 s batch) find nothing, so they are collected never: paused for the import,
    then frozen (only reference cycles made by the import itself are never freed)."""
    first = "torch" not in sys.modules
    if first:
        gc.disable()
    try:
        from kvcli.engine.llm_engine import LLMEngine
    finally:
        if first:
            gc.freeze()
            gc.enable()
    return LLMEngine
