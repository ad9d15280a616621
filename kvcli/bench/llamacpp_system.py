"""llama.cpp's `llama-server` as a benchmark peer (`--compare llamacpp --llamacpp-server PATH`).

It runs the same GGUF file kvcli's gguf mode runs, on loopback, with llama.cpp's own kernels
(weights repacked at load, activations quantized to 8 bits). Per workload the server is
started with one slot per prompt (``--parallel``: every request decodes at once, as the
engines batch them), each slot with KV cells of its own (``context_size``), and restarted before each timed
run (untimed) so that every run starts with an empty prompt cache, as kvcli's and vLLM's do;
within a run its prompt cache is on. All requests are submitted at once (one thread each;
llamacpp_client.py builds and reads them). Build the binary with scripts/build_llama_server.sh.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kvcli.bench.llamacpp_client import Completion, complete, healthy
from kvcli.bench.peer_process import PeerUnavailable, peer_env
from kvcli.bench.systems import RunResult

LLAMACPP = "llamacpp"
INSTALL_HINT = ("build it with scripts/build_llama_server.sh (llama.cpp from the "
                "llama-cpp-python sdist; cmake and g++) and pass --llamacpp-server "
                "BUILD/bin/llama-server")
START_TIMEOUT_S = 120.0


class LlamaCppUnavailable(PeerUnavailable):
    """The llama.cpp peer cannot run: no binary, or the server did not come up."""


def context_size(prompts: list[list[int]], max_new_tokens: int) -> int:
    """The server's total context: one slot per prompt, each with room for the longest prompt
    plus its new tokens and a spare 16 (``-c`` is split evenly between the slots), rounded up
    to 256 per slot. Not one unified cache: there every token's attention spans every slot's
    cells (masked), 32x the work with 32 slots (shared-prefix measured 343 s against 15 s)."""
    per_slot = max(len(p) for p in prompts) + max_new_tokens + 16
    return len(prompts) * (-(-per_slot // 256) * 256)


def server_args(binary: Path, gguf: Path, port: int, threads: int, parallel: int,
                ctx: int) -> list[str]:
    """The llama-server command line (llama.cpp's defaults otherwise: its prompt cache on)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", str(parallel),
            "--no-kv-unified", "--no-webui"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


@dataclass(slots=True)
class LlamaCppSystem:
    """A llama-server process on ``gguf``, (re)started per workload and per timed run."""

    binary: Path
    gguf: Path
    threads: int
    name: str = LLAMACPP
    # llama.cpp's kernels quantize activations to 8 bits; its KV cache is float16 by default
    precision: str = "gguf weights, 8-bit activations, float16 KV"
    weights_kind: str = "quantized"
    exact: bool = False  # other arithmetic: its greedy agreement is measured, not required
    load_s: float = 0.0  # the last (untimed) start
    _proc: subprocess.Popen | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False)
    _port: int = field(default=0, init=False)
    _shape: tuple[int, int] = field(default=(0, 0), init=False)  # (slots, context)

    def check(self) -> LlamaCppSystem:
        """A clear error before any loading when the binary cannot be run."""
        if not (Path(self.binary).is_file() and os.access(self.binary, os.X_OK)):
            raise LlamaCppUnavailable(f"--llamacpp-server {self.binary}: no such executable; "
                                      f"{INSTALL_HINT}")
        return self

    def prepare(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Untimed, before a workload: a server with a slot per prompt and room for all."""
        self._shape = (len(prompts), context_size(prompts, max_new_tokens))
        self._restart()

    def before_run(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Untimed: a fresh server, so the timed run starts with an empty prompt cache."""
        self._restart()

    def _restart(self) -> None:
        self.close()
        self._port = _free_port()
        self._log = tempfile.TemporaryFile()
        args = server_args(self.binary, self.gguf, self._port, self.threads, *self._shape)
        start = time.perf_counter()
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=peer_env({}))
        while not healthy(self._port):
            if self._proc.poll() is not None or time.perf_counter() - start > START_TIMEOUT_S:
                raise LlamaCppUnavailable(f"llama-server did not start ({' '.join(args)}):\n"
                                          f"{self.log_tail()}")
            time.sleep(0.05)
        self.load_s = round(time.perf_counter() - start, 2)

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        if self._proc is None:
            raise LlamaCppUnavailable("llamacpp peer: not started")
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
            futures = [pool.submit(complete, self._port, p, max_new_tokens, started)
                       for p in prompts]
            results: list[Completion] = [f.result() for f in futures]
        computed = [r.prompt_n for r in results]
        cached = [r.cache_n for r in results]
        return RunResult(
            outputs=[r.tokens for r in results],
            prefill_tokens_computed=None if None in computed else sum(computed),
            ttfts=[r.ttft_s for r in results if r.ttft_s is not None],
            cached_tokens=None if None in cached else sum(cached),
            peak_rss_mb=_peak_rss_mb(self._proc.pid),  # since its start: load included
            details={"load_s": self.load_s, "slots": self._shape[0], "context": self._shape[1],
                     "binary": str(self.binary), "gguf": str(self.gguf)})

    def log_tail(self, chars: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "llama-server log (tail):\n" + self._log.read().decode(errors="replace")[-chars:]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
