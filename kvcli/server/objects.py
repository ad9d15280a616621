"""OpenAI's object shapes for ``kvcli serve``: file, batch, list page, error body."""

from __future__ import annotations

import time
from typing import Any

from kvcli.inputs.openai import URLS

ENDPOINTS = URLS  # what kvcli generate answers
COMPLETION_WINDOWS = ("24h",)  # the only one OpenAI accepts


def now() -> int:
    return int(time.time())


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def file_object(file_id: str, filename: str, size: int, purpose: str,
                retention_s: int | None) -> dict[str, Any]:
    """``retention_s``: the file is deleted that long after its creation (None: kept)."""
    created = now()
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created,
            "filename": filename, "purpose": purpose, "status": "processed",
            "expires_at": created + retention_s if retention_s else None,
            "status_details": None}


def batch_object(batch_id: str, input_file_id: str, endpoint: str, window: str,
                 metadata: dict[str, str] | None, expires_at: int,
                 model: str) -> dict[str, Any]:
    return {
        "id": batch_id, "object": "batch", "endpoint": endpoint, "model": model, "errors": None,
        "input_file_id": input_file_id, "completion_window": window, "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now(),
        "in_progress_at": None, "expires_at": expires_at, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": usage(0, 0, 0), "metadata": metadata,
    }


def usage(input_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "has_more": has_more,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None}


def check_metadata(metadata: Any) -> dict[str, str] | None:
    """OpenAI's rule: at most 16 string pairs, keys <= 64 and values <= 512 characters."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise ValueError("metadata: expected an object of at most 16 string pairs")
    for key, value in metadata.items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise ValueError(f"metadata.{key}: keys are at most 64 characters and values "
                             "strings of at most 512")
    return metadata
