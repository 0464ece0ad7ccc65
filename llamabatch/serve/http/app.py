"""The ASGI app: OpenAI's routes on Starlette, each a few lines over Service.

Security, in the order a request meets it: the Bearer check (auth.py) before any body is
read; a JSON body read in chunks and refused past MAX_BODY_BYTES, then parsed with a depth
bound; an upload streamed through its line check and refused past OpenAI's limits; ids
checked before lookup (object_ids.py). CORS only for the origins the user names
(`cors_origins`, Starlette's CORSMiddleware, outside the key check so a browser's preflight,
which carries no key, is answered); without them a web page on another origin cannot read the
API. Errors of every kind leave in OpenAI's error body.
"""
from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Awaitable, Callable, Sequence

from anyio import to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Match, Route

from ...openai_format import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL, ignored_fields_header
from ...files.json_line import BadJSON, loads
from .api_errors import ApiError, bad_request
from .auth import BearerAuth
from .client_gone import unless_client_leaves
from .batches.file_content import FileContent
from .health import HEALTH_PATH, health_answer
from .limits import MAX_BODY_BYTES, MAX_JSON_DEPTH
from .metrics import METRICS_PATH, ServerMetrics, metrics_answer
from .online import failure_message
from .response_store import ResponseStore
from .responses_online import ResponsesOnline
from .service import Service
from . import tokens
from .batches.upload_check import too_large

log = logging.getLogger("llamabatch.serve.http")
_BODY = "the request body"
_MULTIPART_SLACK = 1 << 20  # form framing and the purpose field around an upload's bytes


def build_app(service: Service, api_key: str | None = None, *, health_without_key: bool = False,
              cors_origins: Sequence[str] = ()) -> Starlette:
    """`health_without_key`: GET /health answers without the key (probes that cannot send
    one); `cors_origins`: the web origins whose pages may call the API (none by default)."""
    def path(request: Request, name: str) -> str:
        return request.path_params[name]

    metrics = ServerMetrics(service)  # a registry of this server's own; it needs the key as every route does
    service.online.on_result = metrics.request_ended
    responses = ResponsesOnline(service.online, ResponseStore(os.path.join(service.data.root, "responses")))
    routes = [
        Route(HEALTH_PATH, _async(lambda r: health_answer(service.engine)), methods=["GET"]),
        Route(METRICS_PATH, _async(lambda r: metrics_answer(metrics)), methods=["GET"]),
        Route("/tokenize", _async(lambda r: _tokens(tokens.tokenize, service, r)), methods=["POST"]),
        Route("/detokenize", _async(lambda r: _tokens(tokens.detokenize, service, r)), methods=["POST"]),
        Route("/v1/models", _async(lambda r: _json(_models(service))), methods=["GET"]),
        Route("/v1/models/{model_id:path}", _async(lambda r: _model(service, path(r, "model_id"))), methods=["GET"]),
        Route("/v1/files", _async(lambda r: _upload(service, r)), methods=["POST"]),
        Route("/v1/files", _async(lambda r: _json(service.files(**_query(r, "after", "limit", "order", "purpose")))),
              methods=["GET"]),
        Route("/v1/files/{file_id}", _async(lambda r: _json(service.file(path(r, "file_id")).to_api())),
              methods=["GET"]),
        Route("/v1/files/{file_id}", _async(lambda r: _json(service.delete_file(path(r, "file_id")))),
              methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", _async(lambda r: _content(service, path(r, "file_id"))),
              methods=["GET"]),
        Route("/v1/batches", _async(lambda r: _create_batch(service, r)), methods=["POST"]),
        Route("/v1/batches", _async(lambda r: _json(service.batches(**_query(r, "after", "limit")))),
              methods=["GET"]),
        Route("/v1/batches/{batch_id}", _async(lambda r: _json(service.batch(path(r, "batch_id")).to_api())),
              methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel",
              _async(lambda r: _json(service.cancel_batch(path(r, "batch_id")).to_api())), methods=["POST"]),
        Route(CHAT_URL, _async(lambda r: _online(service, CHAT_URL, r)), methods=["POST"]),
        Route(COMPLETIONS_URL, _async(lambda r: _online(service, COMPLETIONS_URL, r)), methods=["POST"]),
        Route(EMBEDDINGS_URL, _async(lambda r: _online(service, EMBEDDINGS_URL, r)), methods=["POST"]),
        Route(RESPONSES_URL, _async(lambda r: _responses(service, responses, r)), methods=["POST"]),
        Route(RESPONSES_URL + "/input_tokens", _async(lambda r: _input_tokens(service, responses, r)),
              methods=["POST"]),
        Route(RESPONSES_URL + "/{response_id}", _async(lambda r: _json(responses.retrieve(path(r, "response_id")))),
              methods=["GET"]),
        Route(RESPONSES_URL + "/{response_id}", _async(lambda r: _json(responses.delete(path(r, "response_id")))),
              methods=["DELETE"]),
        Route(RESPONSES_URL + "/{response_id}/input_items",
              _async(lambda r: _json(responses.input_items(path(r, "response_id"), **_query(r, "after", "limit", "order")))),
              methods=["GET"]),
        Route(RESPONSES_URL + "/{response_id}/cancel", _async(lambda r: _json(responses.cancel(path(r, "response_id")))),
              methods=["POST"]),
    ]
    handlers = {ApiError: _api_error, HTTPException: _http_error, ClientDisconnect: _client_left,
                Exception: _server_error}
    return Starlette(routes=routes, exception_handlers=handlers,  # type: ignore[arg-type]
                     middleware=front_middleware(api_key, health_without_key, cors_origins))


def front_middleware(api_key: str | None, health_without_key: bool, cors_origins: Sequence[str]) -> list[Middleware]:
    """The key check and CORS every app of `serve` puts before its routes (loading.py's too)."""
    middleware = [Middleware(BearerAuth, api_key=api_key, open_paths=(HEALTH_PATH,) if health_without_key else ())]
    if cors_origins:  # outermost: a preflight carries no key, and a 401 needs the CORS headers to be read
        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                                        allow_methods=["GET", "POST", "DELETE"],
                                        allow_headers=["Authorization", "Content-Type"]))
    return middleware


def _async(handler: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
    """A route's handler as the coroutine Starlette awaits (a plain function would be sent to a
    thread): catalogue calls take microseconds; what blocks runs in to_thread inside handlers."""
    async def endpoint(request: Request) -> Response:
        out = handler(request)
        return await out if inspect.isawaitable(out) else out
    return endpoint


def _json(value: Any) -> Response:
    return JSONResponse(value)


def _query(request: Request, *names: str) -> dict[str, Any]:
    return {name: request.query_params.get(name) for name in names}


def _models(service: Service) -> dict[str, Any]:
    return {"object": "list", "data": [_model_object(service)]}


def _model_object(service: Service) -> dict[str, Any]:
    return {"id": service.model_name, "object": "model", "created": 0, "owned_by": "llamabatch"}


async def _model(service: Service, model_id: str) -> Response:
    if model_id != service.model_name:
        raise ApiError(404, f"The model '{model_id[:200]}' does not exist; this server runs "
                            f"'{service.model_name}'.", param="model", code="model_not_found")
    return JSONResponse(_model_object(service))


async def _body(request: Request) -> Any:
    """The JSON body, read in chunks up to MAX_BODY_BYTES and parsed with json_line's bounds."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise _too_large()
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise _too_large()
    try:
        return loads(bytes(data).decode("utf-8"), whole=_BODY, max_depth=MAX_JSON_DEPTH)
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except BadJSON as bad:
        # a message naming the body already ("the request body nests ... deeper than") stands alone
        message = bad.message if bad.message.startswith(_BODY) else f"{_BODY} is not usable JSON: {bad.message}"
        raise bad_request(message, code=bad.code) from None


def _too_large() -> ApiError:
    return ApiError(413, f"the request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB",
                    code="request_too_large")


async def _tokens(answer: Callable[[Any, Any], Awaitable[dict[str, Any]]], service: Service,
                  request: Request) -> Response:
    return JSONResponse(await answer(service.engine, await _body(request)))


async def _upload(service: Service, request: Request) -> Response:
    length = request.headers.get("content-length")
    most = service.upload_limits.max_bytes
    if length is not None and length.isdigit() and int(length) > most + _MULTIPART_SLACK:
        raise too_large(most)
    upload = service.new_upload(request.headers.get("content-type"))
    try:
        async for chunk in request.stream():
            await to_thread.run_sync(upload.write, chunk)
        record = await to_thread.run_sync(service.store_upload, upload)
    except BaseException:
        upload.discard()
        raise
    return JSONResponse(record.to_api())


async def _content(service: Service, file_id: str) -> Response:
    return FileContent(service.file_path(file_id), media_type="application/octet-stream")


async def _create_batch(service: Service, request: Request) -> Response:
    body = await _body(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return JSONResponse(service.create_batch(body).to_api())


async def _online(service: Service, url: str, request: Request) -> Response:
    try:
        prepared = service.online.prepare(url, await _body(request))
    except ApiError:
        service.online.on_result(url, None)  # refused: /metrics counts it
        raise
    noted = ignored_fields_header(prepared.item.ignored)  # documented fields that did nothing here
    if prepared.stream:
        events = await unless_client_leaves(request, service.online.open_stream(prepared))
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **noted})
    return JSONResponse(await unless_client_leaves(request, service.online.answer(prepared)), headers=noted)


async def _responses(service: Service, responses: ResponsesOnline, request: Request) -> Response:
    try:  # the chain of previous responses is read from disk: off the event loop
        prepared = await to_thread.run_sync(responses.prepare, await _body(request))
    except ApiError:
        service.online.on_result(RESPONSES_URL, None)  # refused: /metrics counts it
        raise
    if prepared.stream:
        events = await unless_client_leaves(request, responses.open_stream(prepared))
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return JSONResponse(await unless_client_leaves(request, responses.answer(prepared)))


async def _input_tokens(service: Service, responses: ResponsesOnline, request: Request) -> Response:
    return _json(await tokens.count_input_tokens(service.engine, responses.prepare, await _body(request)))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
        headers["Allow"] = _allowed_methods(request)
    else:
        message = str(exc.detail)
    return JSONResponse(ApiError(exc.status_code, message).body(), status_code=exc.status_code, headers=headers)


def _allowed_methods(request: Request) -> str:
    """Every method some route takes on this path: a path's methods are spread over routes (GET
    and POST /v1/files are two), and Starlette's own Allow names only the first route's."""
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


async def _client_left(request: Request, exc: Exception) -> Response:
    """The client closed the connection (mid-upload, or while its answer was made): what it left
    is already discarded, and nobody reads this answer (499: nginx's "client closed request")."""
    return Response(status_code=499)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    body = ApiError(500, failure_message(exc)).body()
    return JSONResponse(body, status_code=500)
