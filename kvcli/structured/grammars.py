"""Compile each distinct constraint once per run and share it by every request that uses it.

Keyed by the constraint's canonical JSON (:attr:`StructuredOutputsParams.key`), so
50,000 lines with one schema compile it once. A constraint xgrammar cannot compile
(an unsupported schema feature, a regex that does not parse, a grammar that accepts
nothing) is a ``ValueError`` naming the input field: that line fails, never silently
unconstrained.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from kvcli.structured.params import StructuredOutputsParams, embedded_schemas
from kvcli.structured.schema_check import patterns, with_string_lengths_as_patterns
from kvcli.structured.vocab import tokenizer_info

_CPP_PREFIX = re.compile(r"\[[0-9:]+\] \S+\.cc:\d+: ")


class GrammarCache:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> None:
        import xgrammar as xgr

        if not stop_token_ids:
            raise ValueError("structured_outputs: the model has no end-of-sequence token, so a "
                             "constrained output could never end")
        self.info = tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        # One compile thread: the engine's own threads are busy with the model.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._compiled: dict[str, Any] = {}
        self.compile_s = 0.0  # total time spent compiling (reported next to the run's wall time)
        self.num_compiled = 0

    def get(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``params`` (compiled on first use)."""
        key = params.key
        compiled = self._compiled.get(key)
        if compiled is None:
            t0 = time.perf_counter()
            compiled = self._compile(params)
            self.compile_s += time.perf_counter() - t0
            self.num_compiled += 1
            self._check_accepts_something(compiled, params)
            self._compiled[key] = compiled
        return compiled

    def _compile(self, params: StructuredOutputsParams) -> Any:
        kind = params.kind
        try:
            if kind == "json":
                _check_patterns(params.json, params.path)
                schema = with_string_lengths_as_patterns(params.json)
                return self.compiler.compile_json_schema(json.dumps(schema),
                                                         any_whitespace=True, strict_mode=True)
            if kind == "json_object":  # any JSON object (not any JSON value), as in OpenAI's API;
                # not strict, which would allow only {} (no properties declared)
                return self.compiler.compile_json_schema('{"type": "object"}',
                                                         any_whitespace=True, strict_mode=False)
            if kind == "regex":
                return self.compiler.compile_regex(params.regex)
            if kind == "structural_tag":
                for schema in embedded_schemas(params.structural_tag):
                    _check_patterns(schema, params.path)
                return self.compiler.compile_structural_tag(json.dumps(_tag_for_xgrammar(
                    params.structural_tag)))
            if kind == "choice":
                return self.compiler.compile_grammar(choice_grammar(params.choice))
            return self.compiler.compile_grammar(params.grammar)
        except ValueError:
            raise
        except Exception as err:  # xgrammar raises RuntimeError / its own errors from C++
            raise ValueError(f"{params.path}: cannot be compiled into a grammar: "
                             f"{_reason(err)}") from None

    def _check_accepts_something(self, compiled: Any, params: StructuredOutputsParams) -> None:
        """A grammar whose first step allows no token (not even the end) can never finish."""
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled)
        mask = xgr.allocate_token_bitmask(1, self.info.vocab_size)
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
