"""Compile each distinct constraint once per run and share it by every request that uses it.

Keyed by the constraint's canonical JSON (:attr:`StructuredOutputsParams.key`), so
50,000 lines with one schema compile it once. Compiling has two parts. Turning the
constraint into a grammar is quick and happens when the request is admitted: a constraint
xgrammar cannot handle (an unsupported schema feature, a regex that does not parse, a
grammar that accepts nothing) is a ``ValueError`` naming the input field, so that line
fails, never silently unconstrained. Compiling the grammar against the 50-150k-token
vocabulary takes 0.02-0.4 s for a typical schema, but minutes for a huge enum, so it runs
on a worker thread with a time limit (:mod:`kvcli.structured.compile_worker`) while the
engine keeps stepping the other rows. A large constraint (over 16 KiB of canonical JSON) is
also checked for accepting some output there, after its compile, since that check costs a
compile of its own (seconds for a 10,000-value enum); a small one is checked at admission.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

from kvcli.structured.compile_worker import CompileWorker
from kvcli.structured.params import StructuredOutputsParams, embedded_schemas
from kvcli.structured.schema_check import patterns, with_string_lengths_as_patterns
from kvcli.structured.vocab import tokenizer_info

_CPP_PREFIX = re.compile(r"\[[0-9:]+\] \S+\.cc:\d+: ")
INLINE_CHECK_BYTES = 16 << 10  # constraints up to this size are checked at admission (ms)


class GrammarCache:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...],
                 compile_timeout: float | None) -> None:
        import xgrammar as xgr

        if not stop_token_ids:
            raise ValueError("structured_outputs: the model has no end-of-sequence token, so a "
                             "constrained output could never end")
        self.info = tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        # One compile thread: the engine's own threads are busy with the model.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        # Every string is a sequence of bytes: a grammar that allows no first byte and no end
        # over this 257-token vocabulary accepts nothing (checked in milliseconds).
        byte_vocab = xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b""],
                                       vocab_size=257, stop_token_ids=[256])
        self._probe = xgr.GrammarCompiler(byte_vocab, max_threads=1, cache_enabled=False)
        self.worker = CompileWorker(compile_timeout)
        self._compiled: dict[str, Future] = {}
        self.compile_s = 0.0  # total time spent compiling (reported next to the run's wall time)
        self.num_compiled = 0

    def get(self, params: StructuredOutputsParams) -> Future:
        """The compiled grammar of ``params``, as a future (compiling in the background on
        first use); raises ``ValueError("field: reason")`` when there can be no grammar."""
        key = params.key
        future = self._compiled.get(key)
        if future is None:
            grammar = self._grammar(params)
            if len(key.encode()) <= INLINE_CHECK_BYTES:
                self._check_accepts_something(grammar, params)
                job = partial(self._compile, grammar)
            else:
                job = partial(self._compile_checked, grammar, params)
            future = self._compiled[key] = self.worker.submit(job, params.path)
        return future

    def expire(self) -> None:
        """Fail a compile that is past its time limit (the lines waiting for it fail)."""
        self.worker.expire()

    def _compile(self, grammar: Any) -> Any:
        t0 = time.perf_counter()
        compiled = self.compiler.compile_grammar(grammar)
        self.compile_s += time.perf_counter() - t0
        self.num_compiled += 1
        return compiled

    def _compile_checked(self, grammar: Any, params: StructuredOutputsParams) -> Any:
        """Compile, then check the first step allows some token (on the worker thread)."""
        import xgrammar as xgr

        compiled = self._compile(grammar)
        mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(mask, 0)
        if not bool(mask.any()):
            raise ValueError(f"{params.path}: the grammar accepts no output")
        return compiled

    def _grammar(self, params: StructuredOutputsParams) -> Any:
        import xgrammar as xgr

        kind = params.kind
        spaces = not params.disable_any_whitespace
        try:
            if kind == "json":
                _check_patterns(params.json, params.path)
                schema = with_string_lengths_as_patterns(params.json)
                return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=spaces,
                                                    strict_mode=True)
            if kind == "json_object":  # any JSON object (not any JSON value), as in OpenAI's API;
                # not strict, which would allow only {} (no properties declared)
                return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=spaces,
                                                    strict_mode=False)
            if kind == "structural_tag":
                for schema in embedded_schemas(params.structural_tag):
                    _check_patterns(schema, params.path)
                return xgr.Grammar.from_structural_tag(json.dumps(_tag_for_xgrammar(
                    params.structural_tag)))
            if kind == "regex":
                return xgr.Grammar.from_regex(params.regex)
            if kind == "choice":
                return xgr.Grammar.from_ebnf(choice_grammar(params.choice))
            return xgr.Grammar.from_ebnf(params.grammar)
        except ValueError:
            raise
        except Exception as err:  # xgrammar raises RuntimeError / its own errors from C++
            raise ValueError(f"{params.path}: cannot be compiled into a grammar: "
                             f"{_reason(err)}") from None

    def _check_accepts_something(self, grammar: Any, params: StructuredOutputsParams) -> None:
        """A grammar whose first step allows no byte (and not the end) can never finish."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(self._probe.compile_grammar(grammar))
        mask = xgr.allocate_token_bitmask(1, 257)
        matcher.fill_next_token_bitmask(mask, 0)
        if not bool(mask.any()):
            raise ValueError(f"{params.path}: the grammar accepts no output")


def _check_patterns(schema: Any, path: str) -> None:
    import xgrammar as xgr

    for where, pattern in patterns(schema, path):
        try:
            xgr.Grammar.from_regex(pattern)
        except Exception as err:
            raise ValueError(f"{where}: {_reason(err)}") from None


def _tag_for_xgrammar(node: Any) -> Any:
    """A structural tag with its JSON Schemas rewritten as for a plain schema."""
    if isinstance(node, list):
        return [_tag_for_xgrammar(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema":
        return {**node, "json_schema": with_string_lengths_as_patterns(node.get("json_schema"))}
    return {key: _tag_for_xgrammar(value) for key, value in node.items()}


def choice_grammar(choices: list[str]) -> str:
    """EBNF for "exactly one of these strings" (JSON string escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _reason(err: Exception) -> str:
    """xgrammar's message without its "[12:00:00] /project/cpp/file.cc:94: " prefix."""
    text = " ".join(str(err).split())
    return _CPP_PREFIX.sub("", text)[:240] or type(err).__name__
