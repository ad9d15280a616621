"""The runner side of a peer process (see peer_process.py): the request loop and peak RSS.

The runners (vllm_runner.py, openvino_runner.py) execute under the peer's interpreter,
where kvcli is not importable; they import this file as the top-level module
`peer_serve` (a script's own directory is first on sys.path). So: standard library only.
Replies go to a duplicate of the original stdout; fd 1 is pointed at stderr so that the
peer's own prints cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def status_kib(field: str) -> int | None:
    """A kB field of /proc/self/status (VmRSS, VmHWM), None where unreadable."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak() -> bool:
    """Restart the process's peak-RSS counter (VmHWM); False where the kernel refuses."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb(measured: bool) -> float | None:
    """Peak RSS since reset_peak() in MB, None if the reset failed (the peak would be stale)."""
    peak = status_kib("VmHWM") if measured else None
    return None if peak is None else round(peak / 1024, 1)


def _failure(err: BaseException) -> dict[str, Any]:
    return {"error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}


def serve(load: Callable[[dict[str, Any]], tuple[Any, dict[str, Any]]],
          handle: Callable[[Any, dict[str, Any]], dict[str, Any]]) -> int:
    """Load with argv[1]'s JSON, say ready (load_s + what `load` adds), answer stdin's lines.

    `load` returns (engine, ready-line fields such as the version); `handle` answers one
    request. An exception in either becomes an {"error": ...} reply, which the parent raises.
    """
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def reply(obj: dict[str, Any]) -> None:
        protocol.write(json.dumps(obj) + "\n")

    try:
        start = time.perf_counter()
        engine, info = load(json.loads(sys.argv[1]))
        reply({"ready": True, "load_s": round(time.perf_counter() - start, 2), **info})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        reply(_failure(err))
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply(handle(engine, json.loads(line)))
        except Exception as err:  # noqa: BLE001
            reply(_failure(err))
    return 0
