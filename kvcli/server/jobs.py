"""The batch worker of ``kvcli serve``: one thread runs the batches on the loaded engine, oldest first.

Each batch moves ``validating -> in_progress -> finalizing -> completed`` (or ``failed``,
``cancelling -> cancelled``, ``expired``); every state is written to the database before
the work of the next one starts, so a server killed at any point picks the batch up where
it was: validation again, the run resumed from its result files (kvcli/server/execute.py),
the finalisation redone (it only reads the files). One log line per state change.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvcli.batch.output import dumps_line
from kvcli.batch.resume import result_key
from kvcli.batch.source import iter_lines
from kvcli.batch.writer import FdSink
from kvcli.server.execute import BatchRun, Progress, open_append, scan_results
from kvcli.server.files import FileDir, new_id
from kvcli.server.objects import file_object, now, usage
from kvcli.server.store import Store
from kvcli.server.validate import validate_input

_EXPIRED = {"code": "batch_expired", "message": "This request could not be executed before the "
            "completion window expired."}


# The state each final one is reached from: a second finalisation (the worker and a cancel
# racing) finds the batch moved on and changes nothing.
_FINALIZED_FROM = {"completed": ("finalizing",), "cancelled": ("cancelling",),
                   "expired": ("in_progress",)}


class BatchStop:
    """What the job polls between engine steps (kvcli/batch/job.py's ``stop``): truthy once the
    batch is cancelled, passes its ``expires_at``, or the server shuts down."""

    def __init__(self, expires_at: float | None) -> None:
        self.reason: str | None = None
        self.expires_at = expires_at

    def __bool__(self) -> bool:
        if self.reason is None and self.expires_at is not None and time.time() >= self.expires_at:
            self.reason = "expired"
        return self.reason is not None

    @property
    def name(self) -> str:
        return self.reason or ""

    @property
    def exit_code(self) -> int:
        return 1

    def __enter__(self) -> BatchStop:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@dataclass(slots=True)
class Limits:
    max_lines: int
    max_line_bytes: int
    file_retention_s: int | None = None  # files are deleted this long after creation


class Worker:
    def __init__(self, store: Store, files: FileDir, run: BatchRun, limits: Limits,
                 log: Callable[[str], None]) -> None:
        self.store, self.files, self.run, self.limits, self.log = store, files, run, limits, log
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._current: tuple[str, BatchStop] | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="kvcli-batches", daemon=True)

    # ------------------------------------------------------- from the server
    def start(self) -> None:
        self._thread.start()

    def notify(self) -> None:
        self._wake.set()

    def close(self, timeout: float = 60.0) -> None:
        """Stop after the engine step in progress; a running batch stays in_progress (resumed
        by the next start)."""
        with self._lock:
            self._closing = True
            if self._current is not None:
                self._current[1].reason = "shutdown"
        self._wake.set()
        self._thread.join(timeout)

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        obj = self.store.update_batch(batch_id, only_if=("validating", "in_progress"),
                                      status="cancelling", cancelling_at=now())
        if obj is None:
            return None
        self.log(f"{batch_id}: cancelling")
        with self._lock:
            running = self._current is not None and self._current[0] == batch_id
            if running:
                self._current[1].reason = "cancelled"  # type: ignore[index]
        if not running and obj["in_progress_at"] is None:
            # Still queued: nothing ran, nothing to wait for (the worker, should it pick the
            # batch meanwhile, only moves it on from "validating").
            return self._finalize(obj, "cancelled") or obj
        self._wake.set()
        return obj

    # ------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while not self._closing:
            self._sweep()
            batch = self.store.next_unfinished()
            if batch is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._advance(batch)
            except Exception as err:  # one batch's failure must not stop the server
                traceback.print_exc(file=sys.stderr)
                self._set(batch["id"], "failed", errors=_errors(
                    [{"code": "server_error", "message": f"{type(err).__name__}: {err}",
                      "param": None, "line": None}]))

    def _sweep(self) -> None:
        """Delete the files past their retention (between batches: an indexed query), except
        the input of a batch that has not finished."""
        for file_id in self.store.expired_files(now()):
            if self.store.batch_using(file_id) is None:
                self.store.delete_file(file_id)
                self.files.remove(file_id)
                self.log(f"{file_id}: deleted (past --file-retention)")

    def _advance(self, batch: dict[str, Any]) -> None:
        status = batch["status"]
        if status == "validating" and time.time() >= batch["expires_at"]:  # queued too long
            self._set(batch["id"], "expired", ("validating",))
        elif status == "validating":
            self._validate(batch)
        elif status == "in_progress":
            self._execute(batch)
        elif status == "finalizing":
            self._finalize(batch, "completed")
        elif status == "cancelling":
            self._finalize(batch, "cancelled")

    def _set(self, batch_id: str, status: str, only_if: tuple[str, ...] | None = None,
             **changes: Any) -> dict[str, Any] | None:
        obj = self.store.update_batch(batch_id, only_if, status=status,
                                      **{f"{status}_at": now()}, **changes)
        if obj is not None:
            counts = obj["request_counts"]
            self.log(f"{batch_id}: {status} ({counts['completed']} completed, "
                     f"{counts['failed']} failed of {counts['total']})")
        return obj

    # ------------------------------------------------------------- states
    def _validate(self, batch: dict[str, Any]) -> None:
        path = self.files.path(batch["input_file_id"])
        if not path.exists():
            self._set(batch["id"], "failed", ("validating",), errors=_errors([{
                "code": "invalid_file", "message": "the input file was deleted",
                "param": "input_file_id", "line": None}]))
            return
        result = validate_input(path, batch["endpoint"], set(self.run.model_names),
                                self.limits.max_lines, self.limits.max_line_bytes)
        counts = {"total": result.lines, "completed": 0, "failed": 0}
        if result.errors:
            errors = result.errors
            if result.more_errors:
                errors = [*errors, {"code": "more_errors", "param": None, "line": None,
                                    "message": f"{result.more_errors} more errors not listed"}]
            self._set(batch["id"], "failed", ("validating",), errors=_errors(errors),
                      request_counts=counts)
        else:
            self._set(batch["id"], "in_progress", ("validating",), request_counts=counts)

    def _execute(self, batch: dict[str, Any]) -> None:
        batch_id, total = batch["id"], batch["request_counts"]["total"]
        stop = BatchStop(batch["expires_at"])
        with self._lock:
            if self._closing:
                return
            self._current = (batch_id, stop)
        if self.store.get_batch(batch_id)["status"] != "in_progress":  # cancelled meanwhile
            stop.reason = "cancelled"
        out, err = self._result_paths(batch_id)

        def publish(p: Progress) -> None:
            self.store.update_batch(batch_id, request_counts=_counts(total, p),
                                    usage=usage(p.input_tokens, p.cached_tokens, p.output_tokens))

        try:
            outcome, _ = self.run.run(self.files.path(batch["input_file_id"]), out, err, stop,
                                      publish)
        finally:
            with self._lock:
                self._current = None
        if stop.reason == "shutdown":
            return
        if stop.reason == "expired":
            self._expire_rest(batch, out, err)
            self._finalize(self.store.get_batch(batch_id), "expired")
        elif stop.reason == "cancelled":
            self._finalize(self.store.get_batch(batch_id), "cancelled")
        elif outcome.status == "completed":
            if self._set(batch_id, "finalizing", ("in_progress",)) is not None:
                self._finalize(self.store.get_batch(batch_id), "completed")
        else:  # the output could not be written (disk full) or the input not read
            self._set(batch_id, "failed", errors=_errors([{
                "code": "server_error", "message": outcome.status, "param": None, "line": None}]))

    def _expire_rest(self, batch: dict[str, Any], out: Path, err: Path) -> None:
        """OpenAI's expiry: every request not answered gets a ``batch_expired`` error line."""
        done, _ = scan_results(out, err)
        sink = FdSink(open_append(err), err.name, exclusive=True)
        try:
            with open(self.files.path(batch["input_file_id"]), "rb") as f:
                for raw in iter_lines(f, self.limits.max_line_bytes):
                    key = result_key(raw.data or b"")
                    if key is not None and key not in done:
                        sink.write(dumps_line({"id": new_id("batch_req_"), "custom_id": key,
                                               "response": None, "error": _EXPIRED}))
        finally:
            sink.close()

    def _finalize(self, batch: dict[str, Any], final: str) -> dict[str, Any] | None:
        """Register the result files as ``batch_output`` files (empty ones dropped), with
        counts and usage read from the files themselves (exact after any kill)."""
        batch_id = batch["id"]
        out, err = self._result_paths(batch_id)
        _, p = scan_results(out, err)
        ids = {}
        for kind, path in (("output", out), ("error", err)):
            size = path.stat().st_size if path.exists() else 0
            if size == 0:
                path.unlink(missing_ok=True)
                ids[f"{kind}_file_id"] = None
                continue
            file_id = path.name
            self.store.put_file(file_object(file_id, f"{batch_id}_{kind}.jsonl", size,
                                            "batch_output", self.limits.file_retention_s))
            ids[f"{kind}_file_id"] = file_id
        total = batch["request_counts"]["total"]
        return self._set(batch_id, final, _FINALIZED_FROM[final], request_counts=_counts(total, p),
                         usage=usage(p.input_tokens, p.cached_tokens, p.output_tokens), **ids)

    def _result_paths(self, batch_id: str) -> tuple[Path, Path]:
        private = self.store.get_private(batch_id)
        return self.files.path(private["output_file_id"]), self.files.path(private["error_file_id"])


def _counts(total: int, p: Progress) -> dict[str, int]:
    return {"total": total, "completed": p.completed, "failed": p.failed}


def _errors(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": data}
