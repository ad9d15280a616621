"""A benchmark peer that runs in its own Python: start its runner, talk JSON lines, fail clearly.

vLLM and OpenVINO GenAI pin their own torch and friends, so each lives in its own venv and
kvcli starts a small runner script under that interpreter (`--vllm-python`,
`--openvino-python`). The runner writes one JSON object per line: first {"ready": true,
"load_s": ...} (or {"error": ...}), then one answer per request line kvcli sends. Its stderr
goes to a temporary file whose tail is attached to every error, since that is where the
peer's own traceback and warnings end up. kvcli's own rows use the same machinery when they
run in processes of their own (kvcli_process.py): their runner is a module of kvcli, run
with `python -m` under this interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvcli import THREAD_ENV_DEFAULTS


def peer_env(defaults: dict[str, str]) -> dict[str, str]:
    """This environment plus `defaults` (a value already set wins), without kvcli's own
    threading knobs (kvcli.THREAD_ENV_DEFAULTS, and OMP_WAIT_POLICY, which decides whether
    kvcli sets GOMP_SPINCOUNT): they tune kvcli's pools, and a peer runs as it ships."""
    env = dict(os.environ)
    for key, value in defaults.items():
        env.setdefault(key, value)
    for key in ("OMP_WAIT_POLICY", *THREAD_ENV_DEFAULTS):
        env.pop(key, None)
    return env


class PeerUnavailable(RuntimeError):
    """A peer cannot run: no interpreter, its package missing there, or its runner failed."""


@dataclass(slots=True)
class PeerProcess:
    """One runner process: `start` waits for its ready line, `request` for each answer."""

    label: str  # "vllm", "openvino": names the peer in errors
    python: Path
    runner: Path | str  # the runner script, or (a str) the module `python -m` runs
    option: str  # the CLI option that chose `python`, e.g. "--vllm-python"
    module: str  # the package the runner imports; its absence earns the install hint
    install_hint: str
    error: type[PeerUnavailable] = PeerUnavailable
    _proc: subprocess.Popen | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)

    def start(self, args: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """Launch the runner with `args` (JSON in argv) and return its ready line."""
        if not Path(self.python).exists():
            raise self.error(f"{self.option} {self.python}: no such file; {self.install_hint}")
        self._log = tempfile.TemporaryFile()
        target = [str(self.runner)] if isinstance(self.runner, Path) else ["-m", self.runner]
        self._proc = subprocess.Popen(
            [str(self.python), *target, json.dumps(args)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=env, text=True)
        return self._receive()

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._proc is None or self._proc.stdin is None:
            raise self.error(f"{self.label} peer: not started")
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        return self._receive()

    def _receive(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        reply = json.loads(line) if line.strip() else {"error": "the runner exited"}
        if "error" in reply:
            self.close()
            missing = f"No module named '{self.module}'" in reply["error"]
            hint = f"; {self.install_hint}" if missing else ""
            raise self.error(f"{self.label} peer ({self.python}): {reply['error']}{hint}\n"
                             f"{self.log_tail()}")
        return reply

    def log_tail(self, chars: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "runner log (tail):\n" + self._log.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        """End the runner: closing its stdin ends its request loop."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
