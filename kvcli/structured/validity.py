"""Did a constrained output end inside its language? An independent check of finished outputs.

Counted in the run's summary: lines under a constraint, how many ended by the grammar
(end-of-sequence), and how many of those fail an independent check (must be 0): a JSON
Schema output is parsed and validated with ``jsonschema``, a JSON object parsed, a choice
looked up, a regex matched with Python's ``re``; a grammar or a structural tag has no
second implementation here, so its own matcher (which must have reached its end) decides.
Outputs cut by a stop string or ``max_tokens`` are counted apart, never validated.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from kvcli.structured.params import StructuredOutputsParams


@dataclass(slots=True)
class StructuredStats:
    requests: int = 0  # finished samples under a constraint
    completed: int = 0  # ended by the grammar (end-of-sequence)
    cut: int = 0  # ended by a stop string, max_tokens or an error: not validated
    invalid: int = 0  # completed but failing the independent check (never expected)
    grammars_compiled: int = 0
    compile_s: float = 0.0
    mask_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["compile_s"], out["mask_s"] = round(self.compile_s, 4), round(self.mask_s, 4)
        return out


def is_valid(params: StructuredOutputsParams, text: str, matcher_done: bool) -> bool:
    """``text`` (a completed output) checked against its constraint."""
    kind = params.kind
    if kind in ("json", "json_object"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return False
        if kind == "json_object":
            return isinstance(value, dict)
        import jsonschema

        return jsonschema.validators.validator_for(params.json)(params.json).is_valid(value)
    if kind == "choice":
        return text in params.choice
    if kind == "regex":
        try:
            return re.fullmatch(params.regex, text) is not None
        except re.error:  # a syntax Python's re lacks: the matcher decides
            return matcher_done
    return matcher_done
