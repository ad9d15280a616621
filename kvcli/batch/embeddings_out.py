"""An embeddings result: OpenAI's ``CreateEmbeddingResponse`` (``object: "list"``, one
``embedding`` object per input, ``usage``), the body of a ``/v1/embeddings`` Batch output line,
and with the line's ``id`` the whole result of a plain ``{"task": "embed"}`` line.

``base64`` is the vector's little-endian float32 bytes, as OpenAI's and vLLM's servers send it
(the ``openai`` SDK decodes it with ``numpy.frombuffer(..., dtype="float32")``). kvcli's extra
``usage.prompt_tokens_details.cached_tokens`` says how many tokens the prefix cache gave.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

from kvcli.batch.records import LineRequest
from kvcli.engine.outputs import RequestOutput


def embedding_body(req: LineRequest, out: RequestOutput, model: str,
                   extra_usage: dict[str, int]) -> dict[str, Any]:
    assert req.embed is not None and out.embeddings is not None
    encode = _base64 if req.embed.encoding_format == "base64" else (lambda v: v)
    tokens = len(out.prompt_token_ids)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode(vector)}
                 for i, vector in enumerate(out.embeddings)],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                  "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens,
                                            **extra_usage}},
    }


def _base64(vector: list[float]) -> str:
    floats = array("f", vector)
    if sys.byteorder != "little":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode("ascii")
