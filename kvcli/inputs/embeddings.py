"""Embeddings request bodies: OpenAI's ``/v1/embeddings`` (a Batch line's body) and the plain
``{"input": ..., "task": "embed"}`` line.

``input`` is read as OpenAI reads it: one string, a list of strings, one list of token ids or a
list of token-id lists; each becomes one :class:`Prompt` (text is encoded with the tokenizer's
special tokens, as sentence-transformers and vLLM do; no chat template). ``encoding_format``
is ``float`` (default) or ``base64`` (little-endian float32, as OpenAI and vLLM write it);
``dimensions`` is checked against the model later (kvcli/checkpoint/pooling.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcli.inputs.errors import LineError, show_value, type_name
from kvcli.inputs.prompt import Prompt, check_text, check_token_ids

EMBEDDINGS_URL = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's limit of inputs in one embeddings request
ENCODING_FORMATS = ("float", "base64")
# Accepted and ignored, as by the OpenAI endpoint's offline equivalent: they change nothing
# an embedding computes.
_IGNORED = ("model", "user", "metadata")
EMBEDDING_FIELDS = (*_IGNORED, "input", "encoding_format", "dimensions", "cache_salt")
PLAIN_EMBED_FIELDS = (*EMBEDDING_FIELDS, "task")


@dataclass(slots=True)
class EmbedRequest:
    inputs: list[Prompt] = field(default_factory=list)
    encoding_format: str = "float"
    dimensions: int | None = None


def is_embed_line(body: dict[str, Any]) -> bool:
    """A plain line asking for embeddings: ``task`` names it (``input`` alone is Responses)."""
    return body.get("task") == "embed" or ("task" in body and "input" in body)


def embeddings_body(body: dict[str, Any], prefix: str) -> EmbedRequest:
    if "task" in body and body["task"] != "embed":
        raise LineError(f"{prefix}task", f"expected \"embed\", got {show_value(body['task'])}")
    fmt = body.get("encoding_format", "float")
    if fmt not in ENCODING_FORMATS:
        raise LineError(f"{prefix}encoding_format", "expected \"float\" or \"base64\", got "
                        f"{show_value(fmt)}")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise LineError(f"{prefix}dimensions", f"expected an integer >= 1, got {show_value(dims)}")
    return EmbedRequest(read_inputs(body.get("input"), f"{prefix}input"), fmt, dims)


def read_inputs(value: Any, name: str) -> list[Prompt]:
    """OpenAI's four shapes of ``input``; every item must be non-empty."""
    if isinstance(value, str):
        return [Prompt(text=check_text(value, name), source=name)]
    if not isinstance(value, list) or not value:
        raise LineError(name, "expected a string, a list of strings, a list of token ids or a "
                        f"list of token-id lists, got {_shape(value)}")
    if len(value) > MAX_INPUTS:
        raise LineError(name, f"{len(value)} inputs; at most {MAX_INPUTS} in one request")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return [Prompt(token_ids=check_token_ids(value, name), source=name)]
    if all(isinstance(v, str) for v in value):
        return [Prompt(text=check_text(v, f"{name}[{i}]"), source=f"{name}[{i}]")
                for i, v in enumerate(value)]
    if all(isinstance(v, list) for v in value):
        return [Prompt(token_ids=check_token_ids(v, f"{name}[{i}]"), source=f"{name}[{i}]")
                for i, v in enumerate(value)]
    kinds = sorted({type_name(v) for v in value})
    raise LineError(name, f"expected items of one kind (strings, token ids or token-id lists), "
                    f"got {', '.join(kinds)}")


def _shape(value: Any) -> str:
    return "an empty list" if value == [] else type_name(value)
