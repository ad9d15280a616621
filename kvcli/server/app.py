"""The HTTP routes of ``kvcli serve``: OpenAI's Files, Batches and Models endpoints (Starlette).

Handlers only touch the database and the files directory; the engine belongs to the worker
thread (kvcli/server/jobs.py). Every error answers in OpenAI's ``{"error": {...}}`` shape
with its status code, so the official SDK raises its usual exceptions.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kvcli.server.auth import BearerAuth
from kvcli.server.files import FILE_ID, BadUpload, FileDir, UploadTooLarge, new_id
from kvcli.server.jobs import Worker
from kvcli.server.objects import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    batch_object,
    check_metadata,
    error_body,
    file_object,
    now,
    page,
)
from kvcli.server.store import Store

BATCH_ID = re.compile(r"batch_[0-9a-f]{24}\Z")
_MAX_JSON_BODY = 1 << 20  # POST /v1/batches: a few fields


@dataclass(slots=True)
class ServerState:
    store: Store
    files: FileDir
    worker: Worker
    model_names: tuple[str, ...]
    max_file_bytes: int
    expire_after_s: int
    file_retention_s: int | None
    started: int
    log: Callable[[str], None]


def json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def fail(status: int, message: str, param: str | None = None, code: str | None = None,
         kind: str = "invalid_request_error") -> Response:
    return json(error_body(message, kind, param, code), status)


def _limit(request: Request, default: int, most: int) -> int:
    try:
        value = int(request.query_params.get("limit", default))
    except ValueError:
        raise HTTPException(400, "limit: expected an integer") from None
    if not 1 <= value <= most:
        raise HTTPException(400, f"limit: expected 1 to {most}")
    return value


# ---------------------------------------------------------------------- models
async def list_models(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    return json(page([{"id": name, "object": "model", "created": s.started, "owned_by": "kvcli"}
                      for name in s.model_names], False))


# ----------------------------------------------------------------------- files
async def upload_file(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > s.max_file_bytes + (1 << 20):
        return fail(413, f"the upload is over the server's limit of {s.max_file_bytes} bytes "
                         "(kvcli serve --max-file-bytes)", "file", "file_too_large")
    try:
        upload = await s.files.receive(request.headers.get("content-type", ""),
                                       request.stream(), s.max_file_bytes)
    except UploadTooLarge as err:
        return fail(413, str(err), "file", "file_too_large")
    except BadUpload as err:
        return fail(400, str(err), "file")
    if upload.fields.get("purpose") != "batch":
        s.files.discard(upload)
        return fail(400, f"purpose: kvcli serve stores 'batch' files, got "
                         f"{upload.fields.get('purpose')!r}", "purpose")
    file_id = new_id("file-")
    s.files.commit(upload, file_id)
    obj = file_object(file_id, upload.filename, upload.size, "batch", s.file_retention_s)
    s.store.put_file(obj)
    return json(obj)


def _file(request: Request) -> tuple[ServerState, dict[str, Any]]:
    s: ServerState = request.app.state.kvcli
    file_id = request.path_params["file_id"]
    obj = s.store.get_file(file_id) if FILE_ID.match(file_id) else None
    if obj is None:
        raise HTTPException(404, f"No such File object: {file_id}")
    return s, obj


async def list_files(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise HTTPException(400, "order: expected asc or desc")
    items, more = s.store.list_files(request.query_params.get("purpose"),
                                     request.query_params.get("after"),
                                     _limit(request, 10000, 10000), order == "asc")
    return json(page(items, more))


async def get_file(request: Request) -> Response:
    return json(_file(request)[1])


async def file_content(request: Request) -> Response:
    s, obj = _file(request)
    return FileResponse(s.files.path(obj["id"]), media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    s, obj = _file(request)
    user = s.store.batch_using(obj["id"])
    if user is not None:
        return fail(409, f"the file is the input of batch {user}, which has not finished",
                    "file_id")
    s.store.delete_file(obj["id"])
    s.files.remove(obj["id"])
    return json({"id": obj["id"], "object": "file", "deleted": True})


# --------------------------------------------------------------------- batches
async def create_batch(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    body = await request.body()
    if len(body) > _MAX_JSON_BODY:
        return fail(413, "the request body is over 1 MiB")
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        return fail(400, f"the body is not valid JSON: {err}")
    if not isinstance(req, dict):
        return fail(400, "the body must be a JSON object")
    input_file_id, endpoint = req.get("input_file_id"), req.get("endpoint")
    window = req.get("completion_window")
    if endpoint not in ENDPOINTS:
        return fail(400, f"endpoint: kvcli serve runs {', '.join(ENDPOINTS)}, got "
                         f"{endpoint!r}", "endpoint")
    if window not in COMPLETION_WINDOWS:
        return fail(400, f"completion_window: expected '24h', got {window!r}",
                    "completion_window")
    try:
        metadata = check_metadata(req.get("metadata"))
    except ValueError as err:
        return fail(400, str(err), "metadata")
    source = s.store.get_file(input_file_id) if isinstance(input_file_id, str) \
        and FILE_ID.match(input_file_id) else None
    if source is None or source["purpose"] != "batch":
        return fail(400, f"input_file_id: no file {input_file_id!r} with purpose 'batch'",
                    "input_file_id")
    created = now()
    obj = batch_object(new_id("batch_"), input_file_id, endpoint, window, metadata,
                       created + s.expire_after_s, s.model_names[0])
    s.store.add_batch(obj, {"output_file_id": new_id("file-"), "error_file_id": new_id("file-")})
    s.log(f"{obj['id']}: validating (queued)")
    s.worker.notify()
    return json(obj)


def _batch_id(request: Request) -> str:
    batch_id = request.path_params["batch_id"]
    if not BATCH_ID.match(batch_id):
        raise HTTPException(404, f"No such Batch object: {batch_id}")
    return batch_id


async def get_batch(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    obj = s.store.get_batch(_batch_id(request))
    if obj is None:
        raise HTTPException(404, f"No such Batch object: {request.path_params['batch_id']}")
    return json(obj)


async def list_batches(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    items, more = s.store.list_batches(request.query_params.get("after"),
                                       _limit(request, 20, 100))
    return json(page(items, more))


async def cancel_batch(request: Request) -> Response:
    s: ServerState = request.app.state.kvcli
    batch_id = _batch_id(request)
    obj = s.worker.cancel(batch_id)
    if obj is not None:
        return json(obj)
    current = s.store.get_batch(batch_id)
    if current is None:
        raise HTTPException(404, f"No such Batch object: {batch_id}")
    if current["status"] in ("cancelling", "cancelled"):
        return json(current)
    return fail(409, f"Cannot cancel a batch with status {current['status']}.")


# ------------------------------------------------------------------ assembling
class _Auth:
    """Every request passes the bearer check first (pure ASGI: uploads stay streamed)."""

    def __init__(self, app: ASGIApp, auth: BearerAuth) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            denied = self.auth.check(headers.get(b"authorization", b"").decode("latin-1"))
            if denied is not None:
                await json(denied, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return fail(exc.status_code, exc.detail)


def build_app(state: ServerState, auth: BearerAuth) -> ASGIApp:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.worker.start()
        yield
        state.worker.close()

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/files", upload_file, methods=["POST"]),
        Route("/v1/files", list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", get_file, methods=["GET"]),
        Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
        Route("/v1/batches", create_batch, methods=["POST"]),
        Route("/v1/batches", list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error})
    app.state.kvcli = state
    return _Auth(app, auth)
