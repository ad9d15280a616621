"""``kvcli serve`` end to end: lock the data directory, load the engine, start the worker and uvicorn."""

from __future__ import annotations

import fcntl
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kvcli.batch.config import GenerateConfig
from kvcli.batch.run import load_engine
from kvcli.server.app import ServerState, build_app
from kvcli.server.auth import BearerAuth
from kvcli.server.execute import BatchRun
from kvcli.server.files import FileDir
from kvcli.server.jobs import Limits, Worker
from kvcli.server.objects import now
from kvcli.server.store import Store


@dataclass(slots=True)
class ServeConfig:
    host: str
    port: int
    data_dir: Path
    api_key: str | None
    model_names: tuple[str, ...]  # /v1/models; the first is the one results report
    max_file_bytes: int
    max_lines: int
    expire_after_s: int
    file_retention_s: int | None
    quiet: bool
    generate: GenerateConfig  # the engine options and the per-line defaults


class ServeError(Exception):
    """Cannot start: exit status 2."""


def _lock(data_dir: Path) -> int:
    """One server per data directory (the database has one writer); the kernel drops the lock
    when the process dies, SIGKILL included."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServeError(f"{data_dir} is in use by another kvcli serve") from None
    return fd


def run_server(cfg: ServeConfig) -> int:
    import uvicorn

    def log(text: str) -> None:
        if not cfg.quiet:
            print(f"kvcli serve: {text}", file=sys.stderr, flush=True)

    try:
        lock_fd = _lock(cfg.data_dir)
    except OSError as err:
        raise ServeError(f"cannot use --data-dir {cfg.data_dir}: {err.strerror or err}") from None
    try:
        store = Store(cfg.data_dir / "kvcli.db")
        files = FileDir(cfg.data_dir)
        try:
            engine = load_engine(cfg.generate)
        except (OSError, ValueError) as err:
            raise ServeError(f"cannot load model {cfg.generate.engine.model!r}: "
                             f"{err}") from None
        run = BatchRun(engine, cfg.generate, cfg.model_names)
        limits = Limits(cfg.max_lines, cfg.generate.max_line_bytes, cfg.file_retention_s)
        worker = Worker(store, files, run, limits, log)
        state = ServerState(store, files, worker, cfg.model_names, cfg.max_file_bytes,
                            cfg.expire_after_s, cfg.file_retention_s, now(), log)
        from kvcli import startup

        startup.release()  # the model is loaded: uvicorn's own SIGINT/SIGTERM handling from here
        log(f"http://{cfg.host}:{cfg.port}/v1 serving {', '.join(map(repr, cfg.model_names))}, data in {cfg.data_dir}")
        uvicorn.run(build_app(state, BearerAuth(cfg.api_key)), host=cfg.host, port=cfg.port,
                    log_level="warning", access_log=False, lifespan="on")
        store.close()
    finally:
        os.close(lock_fd)
    return 0


