"""A CI baseline: each prompt's stable prefix (its leading system, tools and schema parts) as
block hashes, written once (--write-baseline) and checked later (--baseline).

A prompt is named by its id (custom_id, id, request_id), else by file:line. Its stable
prefix is the full blocks that lie entirely inside the leading run of tools/schema/system
parts: what a template change moves. Prompts share stable prefixes, so each distinct one
is stored once, with its text, so that a moved prefix can be shown with both sides.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvcli.audit.excerpt import make_excerpt
from kvcli.audit.records import Excerpt, PromptResult, RenderedPrompt
from kvcli.audit.rules.base import STABLE_KINDS
from kvcli.audit.rules.patterns import span_covering
from kvcli.audit.tokenizers import AuditTokenizer, common_prefix_length

FORMAT = 1
SHORT = 8  # bytes of each block hash kept (16 hex digits)
NEAR = 64  # characters between the change and a finding that explains it


def prompt_key(prompt: RenderedPrompt) -> str:
    return prompt.request.id or prompt.request.source


def stable_end(prompt: RenderedPrompt) -> int:
    """Character where the leading run of tools/schema/system parts ends (0: none)."""
    end = 0
    for seg in prompt.segments:
        if seg.kind not in STABLE_KINDS:
            break
        end = seg.end
    return end


def stable_blocks(tokenizer: AuditTokenizer, prompt: RenderedPrompt, ids: array, full: int, block_size: int) -> int:
    """Full blocks ending at or before the stable end (binary search on block ends)."""
    end, lo, hi = stable_end(prompt), 0, full
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokenizer.char_offset(prompt.text, ids, mid * block_size) <= end:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(slots=True)
class Moved:
    key: str
    prompt: int
    block: int
    char: int
    segment: str | None
    was_blocks: int
    now_blocks: int
    excerpt: Excerpt
    explained_by: str | None = None  # a finding of this run at that place

    def message(self, block_size: int) -> str:
        where = f"block {self.block} (tokens {self.block * block_size}-{(self.block + 1) * block_size}, char {self.char}"
        where += f", {self.segment})" if self.segment else ")"
        why = f"; {self.explained_by}" if self.explained_by else ""
        return (f'prompt "{self.key}" (prompt {self.prompt}): its stable prefix (tools, schema, system) moved at '
                f"{where}: {self.was_blocks} stable blocks in the baseline, {self.now_blocks} now, the rest "
                f"recomputed{why}")


@dataclass(slots=True)
class Baseline:
    """Written or read: the stable prefixes, deduplicated, and which prompt has which."""

    tokenizer: str
    block_size: int
    profile: str
    prefixes: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Baseline:
        try:
            raw = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as err:
            raise ValueError(f"--baseline {path}: not a kvcli audit baseline (invalid JSON: {err})") from None
        if not isinstance(raw, dict) or raw.get("kvcli_audit_baseline") != FORMAT:
            raise ValueError(f"--baseline {path}: not a kvcli audit baseline (write one with --write-baseline)")
        return cls(raw["tokenizer"], raw["block_size"], raw["profile"], raw["prefixes"], raw["prompts"])

    def write(self, path: Path) -> None:
        doc = {"kvcli_audit_baseline": FORMAT, "tokenizer": self.tokenizer, "block_size": self.block_size,
               "profile": self.profile, "prefixes": self.prefixes, "prompts": self.prompts}
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")

    def check_compatible(self, tokenizer: str, block_size: int, profile: str) -> None:
        mine = (self.tokenizer, self.block_size, self.profile)
        if mine != (tokenizer, block_size, profile):
            raise ValueError(f"--baseline: written with tokenizer {mine[0]}, block {mine[1]}, profile {mine[2]}; "
                             f"this run uses {tokenizer}, block {block_size}, profile {profile}")


@dataclass(slots=True)
class BaselineObserver:
    """Fed every prompt by the auditor: records stable prefixes, or checks them against `expected`."""

    tokenizer: AuditTokenizer
    baseline: Baseline
    expected: Baseline | None = None  # checking when set
    moved: list[Moved] = field(default_factory=list)
    checked: int = 0
    unknown: int = 0  # prompts the baseline does not name

    def __call__(self, prompt: RenderedPrompt, ids: array, hashes: list[bytes], result: PromptResult) -> None:
        n = stable_blocks(self.tokenizer, prompt, ids, len(hashes), self.baseline.block_size)
        short = [h[:SHORT].hex() for h in hashes[:n]]
        if self.expected is None:
            self._record(prompt, short)
        else:
            self._check(prompt, short, result)

    def _record(self, prompt: RenderedPrompt, short: list[str]) -> None:
        key = prompt_key(prompt)
        if key in self.baseline.prompts or not short:
            return
        text = prompt.text[: stable_end(prompt)]
        self.baseline.prefixes.setdefault(short[-1], {"hashes": short, "text": text})
        self.baseline.prompts[key] = short[-1]

    def _check(self, prompt: RenderedPrompt, short: list[str], result: PromptResult) -> None:
        assert self.expected is not None
        name = self.expected.prompts.get(prompt_key(prompt))
        if name is None:
            self.unknown += 1
            return
        self.checked += 1
        old = self.expected.prefixes[name]
        was = old["hashes"]
        j = next((i for i, (a, b) in enumerate(zip(was, short, strict=False)) if a != b), min(len(was), len(short)))
        if j >= len(was):
            return  # every baseline block is still there (the stable prefix may have grown)
        char = common_prefix_length(old["text"], prompt.text)
        seg = prompt.segment_at(char)
        excerpt = make_excerpt(prompt.text, char, old["text"], char)
        self.moved.append(Moved(prompt_key(prompt), prompt.index, j, char, seg.label if seg else None,
                                len(was), len(short), excerpt, _why(prompt.text, old["text"], char, result)))


def _why(now: str, was: str, char: int, result: PromptResult) -> str | None:
    """A volatile value at the change (both values), else a finding of this run next to it."""
    span, before = span_covering(now, char), span_covering(was, char)
    if span is not None:
        then = f" (was '{was[before.start:before.end]}')" if before is not None else ""
        return f"a {span.kind.label} '{now[span.start:span.end]}'{then} in the stable prefix"
    near = [f for f in result.findings if f.char is not None and abs(f.char - char) < NEAR]
    return f"{near[0].rule}: {near[0].message}" if near else None
