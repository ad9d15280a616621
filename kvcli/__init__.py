"""kvcli: offline LLM batch generation and prompt-cache auditing.

The engine is imported lazily so that `import kvcli` (and `kvcli --help`,
`kvcli audit`) never pull in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from kvcli.engine.llm import LLM
    from kvcli.engine.request import SamplingParams

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from kvcli.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvcli.engine.request import SamplingParams

        return SamplingParams
    raise AttributeError(name)
