"""`kvcli audit`: why prompts miss the prefix cache, and exactly where.

Torch-free by design: this package imports tiktoken, orjson and kvcli.hashing only;
--model loads kvcli.tokenizer (tokenizers + jinja2) lazily.
"""

from __future__ import annotations

from kvcli.audit.auditor import AuditConfig, Auditor, Summary
from kvcli.audit.hits import predict_cached_tokens
from kvcli.audit.profiles import PROFILES, Profile, get_profile
from kvcli.audit.records import Divergence, Finding, PromptRequest, PromptResult
from kvcli.audit.tokenizers import load_tokenizer

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
