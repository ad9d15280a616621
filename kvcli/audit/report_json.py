"""Machine-readable output: one JSON document (--format json) or one line per prompt (jsonl)."""

from __future__ import annotations

from typing import Any

import orjson

from kvcli.audit.auditor import Summary
from kvcli.audit.profiles import Profile
from kvcli.audit.records import BlockView, Divergence, Excerpt, Finding, InputProblem, PromptResult


def divergence_dict(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"token": d.token, "block": d.block, "char": d.char, "against": d.against, "against_id": d.against_id}


def excerpt_dict(e: Excerpt | None) -> dict[str, Any] | None:
    return None if e is None else {"this": e.this, "other": e.other, "caret": e.caret, "against": e.against}


def block_dict(b: BlockView) -> dict[str, Any]:
    return {"hash": b.hash, "start": b.start, "end": b.end, "state": b.state}


def finding_dict(f: Finding) -> dict[str, Any]:
    return {
        "rule": f.rule, "severity": f.severity, "prompt": f.prompt, "prompt_id": f.prompt_id,
        "char": f.char, "segment": f.segment, "against": f.against, "message": f.message, "fix": f.fix,
        "tokens_at_stake": f.tokens_at_stake, "count": f.count, "excerpt": excerpt_dict(f.excerpt),
    }  # fmt: skip


def prompt_dict(r: PromptResult, with_findings: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": r.index, "id": r.id, "source": r.source, "session": r.session, "tokens": r.tokens,
        "cached_tokens": r.cached_tokens, "first_divergence": divergence_dict(r.divergence),
        "tokens_at_stake": r.tokens_at_stake,
    }  # fmt: skip
    if r.bounded_cached_tokens is not None:
        out["bounded_cached_tokens"] = r.bounded_cached_tokens
    if r.blocks is not None:
        out["blocks"] = [block_dict(b) for b in r.blocks]
    if with_findings:
        out["findings"] = [finding_dict(f) for f in r.findings]
    return out


def summary_dict(s: Summary) -> dict[str, Any]:
    return {
        "prompts": s.prompts, "tokens": s.tokens, "cached_tokens": s.cached_tokens,
        "hit_rate": s.hit_rate, "tokens_at_stake": s.tokens_at_stake,
        "errors": s.findings["error"], "warnings": s.findings["warning"], "infos": s.findings["info"],
    }  # fmt: skip


def profile_dict(p: Profile) -> dict[str, Any]:
    return {
        "name": p.name, "hit_model": p.hit_model, "block_size": p.block_size, "min_tokens": p.min_tokens,
        "summary": p.summary, "source": p.source, "as_of": p.as_of,
    }  # fmt: skip


def document(
    tokenizer: str,
    profile: Profile,
    summary: Summary,
    prompts: list[PromptResult],
    findings: list[Finding],
    problems: list[InputProblem],
    extra: dict[str, Any] | None = None,
) -> bytes:
    doc = {
        "tokenizer": tokenizer,
        "block_size": profile.block_size,
        "profile": profile_dict(profile),
        "summary": summary_dict(summary),
        "prompts": [prompt_dict(r) for r in prompts],
        "findings": [finding_dict(f) for f in findings],
        "input_problems": [{"where": p.where, "message": p.message} for p in problems],
        **(extra or {}),  # capacity, prefix groups, ordering
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def jsonl_line(result: PromptResult) -> bytes:
    return orjson.dumps(prompt_dict(result, with_findings=True)) + b"\n"
