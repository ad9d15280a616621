"""Render chat templates exactly as transformers' `apply_chat_template(tokenize=False)`.

Torch-free and transformers-free: the Jinja environment below mirrors
transformers.utils.chat_template_utils (sandboxed, trim_blocks, lstrip_blocks,
loop controls, a no-op `{% generation %}` tag, `raise_exception`,
`strftime_now`, a non-HTML-escaping `tojson`, guarded `dict` and `namespace`),
and messages go through the same clean-up (None-valued keys dropped, values
reduced to plain JSON types, reasoning fields aliased) before rendering, so a
prompt rendered here tokenizes to the same ids as one rendered by transformers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# transformers refuses older jinja2: earlier releases have known sandbox escapes.
_MIN_JINJA = (3, 1, 6)
# Names a message's reasoning travels under; templates read the first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; rendering is unchanged."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """`dict(...)` for templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore names, as transformers' does."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace: {name!r}"
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson escapes <, >, & and '; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in transformers' sandboxed environment (cached)."""
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < _MIN_JINJA:
        raise ImportError(f"chat templates need jinja2>=3.1.6, found {jinja2.__version__}")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def plain_data(value: Any) -> Any:
    """Rebuild `value` from plain JSON types; anything else becomes "<TypeName>".

    The sandbox does not know which methods of rich objects are dangerous, so
    (like transformers) templates only ever see strings, numbers, lists and dicts.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    if callable(getattr(value, "model_dump", None)):
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalize_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages: expected a list of message dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages: the conversation is empty; give at least one message")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{index}]: expected a dict, got {type(message).__name__}")
        # Templates handle a missing key but often render a None value as "None".
        message = plain_data({key: value for key, value in message.items() if value is not None})
        reasoning = next(
            (message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None
        )
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        normalized.append(message)
    return normalized


def _check_tools(tools: Sequence[Any] | None) -> list[Any] | None:
    if tools is None:
        return None
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(
                f"tools[{index}]: expected a JSON-schema dict, got {type(tool).__name__}"
            )
    return plain_data(list(tools))


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    **template_kwargs: Any,
) -> str:
    """The prompt text `template` renders for `messages` (and optional `tools`).

    `special_tokens` are the tokenizer's named tokens (bos_token, eos_token, ...),
    which transformers passes to every template; `template_kwargs` (such as
    Qwen3's enable_thinking) override them.
    """
    chat = _normalize_messages(messages)
    kwargs = plain_data({**(special_tokens or {}), **template_kwargs})
    return compile_template(template).render(
        messages=chat,
        tools=_check_tools(tools),
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
