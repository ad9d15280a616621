"""kvcli: offline LLM batch generation and prompt-cache auditing.

The engine is imported lazily so that `import kvcli` (and `kvcli --help`,
`kvcli audit`) never pull in torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Thread-pool manners, set before torch or NumPy load (a user's own setting wins). Element-wise
# ops and oneDNN's matmuls run on torch's OpenMP pool, the native kernels on kvcli's own
# threads (native/pool.c), NumPy's matmuls on OpenBLAS's: all on the same few cores. OpenMP
# threads spin GOMP_SPINCOUNT = 30,000 pauses (~1-2 ms) after a parallel region, then sleep:
# sleeping at once (OMP_WAIT_POLICY=PASSIVE, the rule until 2026-12-07) left each of a prefill
# layer's ~14 torch calls waiting for a woken thread, 28% of two cores idle in fast's prefill
# (distinct 7.1-7.4 -> 6.3-6.6 s, paired; exact and decode-1 unchanged); spinning without bound
# (libgomp's ACTIVE) made decode steps 4-20x slower on 2 cores. A user's OMP_WAIT_POLICY keeps
# libgomp's own spin for it. OpenBLAS threads spin 2^20 cycles (~0.3 ms) instead of its
# default 2^28 (~0.1 s), long enough to bridge one layer's matmuls but not to steal a core from
# the attention kernel between layers (its in-situ time halved: docs/BENCHMARKS.md).
THREAD_ENV_DEFAULTS = {"GOMP_SPINCOUNT": "30000", "OPENBLAS_THREAD_TIMEOUT": "20"}
for _key, _value in THREAD_ENV_DEFAULTS.items():
    if _key != "GOMP_SPINCOUNT" or "OMP_WAIT_POLICY" not in os.environ:
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
