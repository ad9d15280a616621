"""Write-behind: blocks are published by one background thread, never inside an engine step.

The engine hands over a copy of each newly full block; the thread checksums it,
writes it and renames it into place (file I/O and CRC-32 release the GIL). The
queue is bounded in bytes: when the disk cannot keep up, further blocks are
dropped (counted), so writing never stalls a step. The first OSError (disk full,
read-only directory, quota) stops all writing with one warning; reads go on and
results are unaffected. The size bound is enforced here too: when the directory
grows past it, the least recently used blocks are deleted.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable

from kvcli.kvstore.directory import prune, remove_stale_tmp, total_bytes
from kvcli.kvstore.safety import NotAKVCacheError
from kvcli.kvstore.store import ModelStore

log = logging.getLogger("kvcli.kvstore")

DEFAULT_MAX_PENDING_BYTES = 256 << 20

# block hash, payload, called once the payload's memory is no longer needed
_Item = tuple[bytes, memoryview, Callable[[], None] | None]


class WriteBehind:
    def __init__(self, store: ModelStore, max_bytes: int,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes
        self.stopped = False  # writing gave up (an OSError)
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._total: int | None = None  # bytes in the directory, scanned by the thread
        self._thread = threading.Thread(target=self._run, name="kvcli-kv-writer", daemon=True)
        self._thread.start()
        # Finish queued writes at exit, so the next run finds this run's last blocks.
        atexit.register(self.close)

    def has_room(self, nbytes: int) -> bool:
        """Whether a block of ``nbytes`` would be accepted (checked before copying it out)."""
        if self.stopped:
            return False
        with self._lock:
            return self._pending_bytes + nbytes <= self.max_pending_bytes

    def count_dropped(self, n: int) -> None:
        """Blocks not written; under the lock, as both threads count them."""
        with self._lock:
            self.store.stats.dropped_blocks += n

    def offer(self, block_hash: bytes, payload: memoryview,
              done: Callable[[], None] | None = None) -> bool:
        """Queue one block; False (counted as dropped) when stopped or the queue is full.

        ``done`` runs on the writer thread after the block is written or dropped (never when
        False is returned), so the caller may recycle the payload's buffer.
        """
        if not self.has_room(len(payload)):
            self.count_dropped(1)
            return False
        with self._lock:
            self._pending_bytes += len(payload)
        self._queue.put((block_hash, payload, done))
        return True

    def flush(self) -> None:
        """Wait until every queued block is written (or dropped)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, stop the thread and log the run's counts (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
            self.store.record_run()
        atexit.unregister(self.close)

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        try:
            remove_stale_tmp(self.store.root)  # what writers killed mid-write left behind
        except OSError:  # an unreadable tmp/: the first write says so
            pass
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._write(item[0], item[1])
            finally:
                if item is not None:
                    with self._lock:
                        self._pending_bytes -= len(item[1])
                    if item[2] is not None:
                        item[2]()
                self._queue.task_done()

    def _write(self, block_hash: bytes, payload: memoryview) -> None:
        if self.stopped:
            self.count_dropped(1)
            return
        try:
            if self._total is None:
                self._total = total_bytes(self.store.root)
            self._total += self.store.write(block_hash, payload)
            if self._total > self.max_bytes:
                result = prune(self.store.root, self.max_bytes)
                self.store.stats.evicted_blocks += result.removed_files
                self._total = result.kept_bytes
        except (OSError, NotAKVCacheError) as err:  # full, read-only, or a link appeared
            why = (err.strerror if isinstance(err, OSError) else None) or str(err)
            self.stopped = True
            self.count_dropped(1)
            self.store.stats.write_error = why
            log.warning("kvcli: cannot write the KV cache in %s (%s); caching to disk stops for "
                        "this run, results are not affected", self.store.root, why)
