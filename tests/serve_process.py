"""A real `kvcli serve` process on a free loopback port, for the server tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    def __init__(self, model_dir: Path, data_dir: Path, *args: str, api_key: str | None = None,
                 name: str = MODEL):
        self.model_dir, self.data_dir, self.args, self.api_key = model_dir, data_dir, args, api_key
        self.name = name
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"{data_dir.name}.log"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 180.0) -> ServeProcess:
        cmd = [sys.executable, "-m", "kvcli", "serve", "--model", str(self.model_dir),
               "--served-model-name", self.name, "--port", str(self.port),
               "--data-dir", str(self.data_dir), *self.args]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=os.environ.copy())
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvcli serve exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-3000:]}")
            request = urllib.request.Request(f"{self.base_url}/models", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=2):
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kvcli serve not ready in {timeout} s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def batch_line(custom_id: str, endpoint: str = "/v1/chat/completions", model: str = MODEL,
               max_tokens: int = 6, **body: object) -> dict[str, object]:
    if endpoint == "/v1/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": f"Tell me about {custom_id}"}])
    else:
        body.setdefault("prompt", f"Once upon a time {custom_id}")
    return {"custom_id": custom_id, "method": "POST", "url": endpoint,
            "body": {"model": model, "max_tokens": max_tokens, **body}}


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
