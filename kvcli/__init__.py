"""kvcli: offline LLM batch generation and prompt-cache auditing.

The engine is imported lazily so that `import kvcli` (and `kvcli --help`,
`kvcli audit`) never pull in torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Thread-pool manners, set before torch or NumPy load (a user's own setting wins). CPU matmuls
# run on NumPy's OpenBLAS threads, element-wise ops on torch's OpenMP pool, decode attention on
# the native kernel's threads: all on the same few cores. Idle OpenMP threads must sleep, not
# spin (spinning made decode steps 4-20x slower on 2 cores), and OpenBLAS threads spin 2^20
# cycles (~0.3 ms) instead of its default 2^28 (~0.1 s), long enough to bridge the gaps
# between one layer's matmuls but not to steal a core from the attention kernel between layers
# (its in-situ time halved: docs/BENCHMARKS.md).
THREAD_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "20"}
for _key, _value in THREAD_ENV_DEFAULTS.items():
    os.environ.setdefault(_key, _value)

# The `kvcli` command: exit cleanly on Ctrl-C from here on, before any heavy import
# (kvcli/startup.py says why). `import kvcli` in a program of its own changes nothing.
from kvcli import startup as _startup  # noqa: E402 - after the environment, on purpose

if _startup.launched_as_cli():
    _startup.install()

if TYPE_CHECKING:
    from kvcli.engine.llm import LLM
    from kvcli.sampling_params import SamplingParams
    from kvcli.structured import StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from kvcli.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvcli.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from kvcli.structured import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(name)
