"""One writer per output file: ``-o FILE`` is locked for the whole run, ``--resume`` included.

Two runs appending to one file would each write every result (duplicate ids), and two
``--resume`` runs would each read the same done set. So the run takes an exclusive
``flock`` on the output before it reads the resume state, and keeps it until it exits; a
second run fails at once (before loading the model) naming the file and, where Linux's
``/proc/locks`` tells it, the holder's pid. ``flock`` belongs to the open file, so the
resume scan may open and close the file again without dropping the lock, and the kernel
drops it when the holder dies (``kill -9`` included): no stale lock files.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass


class OutputLocked(Exception):
    """Another process holds the output's lock."""

    def __init__(self, path: str, holder: int | None) -> None:
        who = f"another process (pid {holder})" if holder else "another process"
        super().__init__(f"{path} is being written by {who}; wait for that run to finish, "
                         "or write to another file")
        self.holder = holder


@dataclass(slots=True)
class OutputLock:
    fd: int  # O_WRONLY | O_APPEND, the run writes its results through it
    path: str
    created: bool  # the file did not exist before this run

    def release(self) -> None:
        """Drop the lock; a file this run created and left empty is removed, as if never made."""
        if self.fd < 0:
            return
        try:
            if self.created and os.fstat(self.fd).st_size == 0 and _same_file(self.fd, self.path):
                os.unlink(self.path)  # still locked: no other run can be writing to it
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def lock_output(path: str) -> OutputLock:
    """Open (creating) ``path`` for appending and lock it, or raise :class:`OutputLocked`."""
    while True:
        existed = os.path.exists(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = holder_pid(fd)
            os.close(fd)
            raise OutputLocked(path, holder) from None
        except OSError:
            os.close(fd)
            raise
        if _same_file(fd, path):
            return OutputLock(fd, path, created=not existed)
        # The holder removed the file (it was empty) between our open and our lock: the
        # inode we locked is gone, so lock whatever the path names now.
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def holder_pid(fd: int, locks_file: str = "/proc/locks") -> int | None:
    """The pid holding a ``flock`` on ``fd``'s file, from Linux's /proc/locks (else None)."""
    st = os.fstat(fd)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(locks_file) as f:
            rows = f.read().splitlines()
    except OSError:
        return None
    for row in rows:
        # "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"; "->" rows are waiters
        parts = row.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == inode and parts[4].isdigit():
            return int(parts[4])
    return None
