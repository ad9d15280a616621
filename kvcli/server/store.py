"""SQLite metadata of ``kvcli serve``: every file and batch, so a restarted server finds them.

One connection in WAL mode, used under one lock (one writer; the requests it serves are
a few rows each, so the lock is held for well under a millisecond). A batch row keeps its
whole OpenAI object as JSON (what GET returns) next to the columns queries need, and a
``private`` JSON of what only the worker reads (the file ids its results go to).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import orjson

UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, purpose TEXT NOT NULL,
    expires_at INTEGER, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS files_expiry ON files (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, status TEXT NOT NULL,
    input_file_id TEXT NOT NULL, data BLOB NOT NULL, private BLOB NOT NULL);
"""


class Store:
    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives the process being killed (the WAL is in the OS's
            # page cache); only a power cut may lose the last ones.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    # ------------------------------------------------------------------ files
    def put_file(self, obj: dict[str, Any]) -> None:
        """Insert, or replace a row with the same id (a re-run finalisation)."""
        self._run("INSERT INTO files (id, purpose, expires_at, data) VALUES (?, ?, ?, ?) "
                  "ON CONFLICT(id) DO UPDATE SET data = excluded.data",
                  (obj["id"], obj["purpose"], obj["expires_at"], orjson.dumps(obj)))

    def get_file(self, file_id: str) -> dict[str, Any] | None:
        rows = self._all("SELECT data FROM files WHERE id = ?", (file_id,))
        return orjson.loads(rows[0][0]) if rows else None

    def expired_files(self, at: int) -> list[str]:
        """Files past their retention (``expires_at``), oldest first."""
        return [r[0] for r in self._all("SELECT id FROM files WHERE expires_at IS NOT NULL AND "
                                        "expires_at <= ? ORDER BY seq", (at,))]

    def delete_file(self, file_id: str) -> bool:
        return self._run("DELETE FROM files WHERE id = ?", (file_id,)) > 0

    def list_files(self, purpose: str | None, after: str | None, limit: int,
                   ascending: bool) -> tuple[list[dict[str, Any]], bool]:
        where, args = [], []
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        return self._page("files", where, args, after, limit, ascending)

    # ---------------------------------------------------------------- batches
    def add_batch(self, obj: dict[str, Any], private: dict[str, Any]) -> None:
        self._run("INSERT INTO batches (id, status, input_file_id, data, private) "
                  "VALUES (?, ?, ?, ?, ?)", (obj["id"], obj["status"], obj["input_file_id"],
                                             orjson.dumps(obj), orjson.dumps(private)))

    def get_batch(self, batch_id: str) -> dict[str, Any] | None:
        rows = self._all("SELECT data FROM batches WHERE id = ?", (batch_id,))
        return orjson.loads(rows[0][0]) if rows else None

    def get_private(self, batch_id: str) -> dict[str, Any]:
        rows = self._all("SELECT private FROM batches WHERE id = ?", (batch_id,))
        return orjson.loads(rows[0][0]) if rows else {}

    def update_batch(self, batch_id: str, only_if: tuple[str, ...] | None = None,
                     **changes: Any) -> dict[str, Any] | None:
        """Merge ``changes`` into the batch's object (read-modify-write under the lock); with
        ``only_if`` only while its status is one of those. The object after, or None."""
        with self._lock:
            rows = self._db.execute("SELECT data FROM batches WHERE id = ?",
                                    (batch_id,)).fetchall()
            if not rows:
                return None
            obj = orjson.loads(rows[0][0])
            if only_if is not None and obj["status"] not in only_if:
                return None
            obj.update(changes)
            self._db.execute("UPDATE batches SET status = ?, data = ? WHERE id = ?",
                             (obj["status"], orjson.dumps(obj), batch_id))
            return obj

    def list_batches(self, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        return self._page("batches", [], [], after, limit, ascending=False)

    def next_unfinished(self) -> dict[str, Any] | None:
        """The oldest batch not yet in a final state (FIFO; a restart picks up where it was)."""
        marks = ",".join("?" * len(UNFINISHED))
        rows = self._all(f"SELECT data FROM batches WHERE status IN ({marks}) "
                         "ORDER BY seq LIMIT 1", UNFINISHED)
        return orjson.loads(rows[0][0]) if rows else None

    def batch_using(self, file_id: str) -> str | None:
        """An unfinished batch that reads ``file_id`` (the file cannot be deleted meanwhile)."""
        marks = ",".join("?" * len(UNFINISHED))
        rows = self._all(f"SELECT id FROM batches WHERE input_file_id = ? AND status IN "
                         f"({marks}) LIMIT 1", (file_id, *UNFINISHED))
        return rows[0][0] if rows else None

    # ------------------------------------------------------------- pagination
    def _page(self, table: str, where: list[str], args: list[Any], after: str | None,
              limit: int, ascending: bool) -> tuple[list[dict[str, Any]], bool]:
        """Cursor pagination as OpenAI's: ``after`` is the last id of the previous page."""
        if after is not None:
            # An unknown cursor matches no row: the page is empty, as for a cursor past the end.
            where.append(f"seq {'>' if ascending else '<'} "
                         f"COALESCE((SELECT seq FROM {table} WHERE id = ?), "
                         f"{'1e18' if ascending else '-1'})")
            args.append(after)
        sql = (f"SELECT data FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
               + f" ORDER BY seq {'ASC' if ascending else 'DESC'} LIMIT ?")
        rows = self._all(sql, (*args, limit + 1))
        return [orjson.loads(r[0]) for r in rows[:limit]], len(rows) > limit
