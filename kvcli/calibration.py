"""A machine's measured prefill and decode rates, stored once per model + CPU + dtype (torch-free).

`kvcli bench --calibrate` measures them (kvcli/bench/calibrate.py) and writes one JSON file under
$KVCLI_HOME/calibration/; `kvcli audit` reads it to turn the prefill tokens a cache saves into
seconds when --prefill-tok-s is not given. The key is the model's directory, the CPU model and
the dtype: a rate measured on another CPU, or in another dtype, is not this machine's.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvcli.paths import calibration_dir


@dataclass(frozen=True, slots=True)
class Calibration:
    model: str  # the resolved model directory (what --model named)
    cpu: str  # cpu_model() where it was measured
    dtype: str  # generate's --dtype
    prefill_tok_s: float  # prompt tokens computed per second, no prefix cache, one batch
    decode_tok_s: float  # new tokens per second of one sequence after its first
    measured_at: str  # ISO 8601, UTC
    prompt_tokens: int  # each measured prompt's length
    threads: int | None = None
    load_avg: tuple[float, ...] | None = None  # the 1/5/15-minute load when measured

    @property
    def date(self) -> str:
        return self.measured_at[:10]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo): matmul routing and kernel speed depend on it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_path(model_dir: str | Path, dtype: str, cpu: str | None = None, home: Path | None = None) -> Path:
    """Where the rate of this model, CPU and dtype is kept: a readable name and a digest of the key."""
    model = str(Path(model_dir).resolve())
    cpu = cpu if cpu is not None else cpu_model()
    digest = hashlib.sha256(f"{model}\0{cpu}\0{dtype}".encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name) or "model"
    return calibration_dir(home) / f"{name}-{dtype}-{digest}.json"


def save_calibration(cal: Calibration, home: Path | None = None) -> Path:
    """Written whole then renamed: a reader never sees half a file."""
    path = calibration_path(cal.model, cal.dtype, cal.cpu, home)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(asdict(cal), indent=2) + "\n", encoding="utf-8")
    staged.replace(path)
    return path


def load_calibration(model_dir: str | Path | None, dtype: str, home: Path | None = None) -> Calibration | None:
    """This machine's stored rate for the model and dtype; None when never measured (or unreadable:
    a damaged file is as good as none, and `kvcli bench --calibrate` rewrites it)."""
    if model_dir is None:
        return None
    path = calibration_path(model_dir, dtype, None, home)
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        load = data.get("load_avg")
        cal = Calibration(**{**data, "load_avg": tuple(load) if load is not None else None})
    except (OSError, ValueError, TypeError):
        return None
    if not (isinstance(cal.prefill_tok_s, (int, float)) and cal.prefill_tok_s > 0):
        return None
    return cal
