"""A kvcli row of `kvcli bench` in a process of its own (--isolate), as the peers run.

In the bench's process every kvcli row shares one address space, so the peak RSS of any run
is that of all the engines loaded at once (6.6 GB for six, docs/BENCHMARKS.md). Here each row
runs kvcli_runner.py under this interpreter, through the peers' machinery (peer_process.py),
and its peak RSS is its own: its model, KV pool, activations and Python with torch, as a
peer's peak is its process's. Loading is the bench's own (kvcli_rows.load_row) and happens
before any timed run; every run is KvcliSystem.run in the child (a fresh prefix cache), timed
here around the request like the peers' (the pipe adds well under a millisecond a run).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kvcli
from kvcli.bench.kvcli_rows import KvcliRow
from kvcli.bench.peer_process import PeerProcess, PeerUnavailable
from kvcli.bench.systems import RunResult
from kvcli.bench.workloads import BenchConfigError, Workload

RUNNER = "kvcli.bench.kvcli_runner"
# The kvcli this bench runs, first on the child's path, so both run the same code.
KVCLI_ROOT = str(Path(kvcli.__file__).resolve().parent.parent)


def child_env() -> dict[str, str]:
    """This environment (kvcli's thread settings included: the row runs as it would here),
    with this kvcli first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (KVCLI_ROOT, env.get("PYTHONPATH")) if p)
    return env


@dataclass(slots=True)
class KvcliProcessSystem:
    """One kvcli row's engine in its child: load once (start), then any number of runs."""

    row: KvcliRow
    threads: int | None = None  # --threads; None: torch's default there, as here
    exact: bool = True
    precision: str = ""
    weights_kind: str = ""
    max_model_len: int = 0
    load_s: float = 0.0
    load_rss_mb: float | None = None  # the child's RSS after load: model and runtime
    _peer: PeerProcess | None = field(default=None, init=False)

    @property
    def name(self) -> str:
        return self.row.name

    def start(self) -> KvcliProcessSystem:
        self._peer = PeerProcess(self.name, Path(sys.executable), RUNNER, "--isolate", "kvcli",
                                 "this interpreter must import the kvcli that runs the bench")
        ready = self._checked(self._peer.start({"row": asdict(self.row),
                                                "threads": self.threads}, child_env()))
        self.exact, self.precision = bool(ready["exact"]), str(ready["precision"])
        self.weights_kind = str(ready["weights_kind"])
        self.max_model_len = int(ready["max_model_len"])
        self.load_s, self.load_rss_mb = float(ready["load_s"]), ready.get("load_rss_mb")
        return self

    def _checked(self, reply: dict[str, Any]) -> dict[str, Any]:
        if "usage_error" in reply:  # the child's BenchConfigError
            self.close()
            raise BenchConfigError(reply["usage_error"])
        return reply

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._peer is None:
            raise PeerUnavailable(f"{self.name} process: not started")
        return self._checked(self._peer.request(message))

    def workload(self, name: str, **options: Any) -> Workload:
        """Workload ``name`` tokenized in the child, by the tokenizer its engine loaded."""
        return Workload(**self._request({"workload": {"name": name, **options}})["workload"])

    def prepare(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Untimed: the child's KV pool sized for the workload (KvcliSystem.prepare)."""
        self._request({"prepare": {"prompts": prompts, "max_new_tokens": max_new_tokens}})

    def run(self, prompts: list[list[int]], max_new_tokens: int) -> RunResult:
        reply = self._request({"prompts": prompts, "max_new_tokens": max_new_tokens})
        result = RunResult(**reply["result"])
        result.details.update(engine_wall_s=round(reply["wall_s"], 5), load_s=self.load_s,
                              load_rss_mb=self.load_rss_mb, process="own")
        return result

    def close(self) -> None:
        if self._peer is not None:
            self._peer.close()
