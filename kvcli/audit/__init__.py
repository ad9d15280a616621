"""`kvcli audit`: why prompts miss the prefix cache, and exactly where.

Torch-free by design: this package imports tiktoken, orjson and kvcli.hashing only;
--model loads kvcli.tokenizer (tokenizers + jinja2) lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcli.audit.auditor import AuditConfig, Auditor, Summary
    from kvcli.audit.hits import predict_cached_tokens
    from kvcli.audit.profiles import PROFILES, Profile, get_profile
    from kvcli.audit.records import Divergence, Finding, PromptRequest, PromptResult
    from kvcli.audit.tokenizers import load_tokenizer

# Resolved on first use, so `kvcli --help` reads audit/profiles.py (the --profile names)
# without loading the auditor (tiktoken, orjson).
_HOMES = {
    "AuditConfig": "auditor", "Auditor": "auditor", "Summary": "auditor",
    "predict_cached_tokens": "hits", "PROFILES": "profiles", "Profile": "profiles",
    "get_profile": "profiles", "Divergence": "records", "Finding": "records",
    "PromptRequest": "records", "PromptResult": "records", "load_tokenizer": "tokenizers",
}
__all__ = [
    "PROFILES",
    "AuditConfig",
    "Auditor",
    "Divergence",
    "Finding",
    "Profile",
    "PromptRequest",
    "PromptResult",
    "Summary",
    "get_profile",
    "load_tokenizer",
    "predict_cached_tokens",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"kvcli.audit.{_HOMES[name]}"), name)
