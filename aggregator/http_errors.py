"""Every error of the query API in Prometheus' JSON shape, whichever layer raises it.

Three layers can refuse a request, and each used to answer in its own format:

- the handlers (bad parameters, a query the engine refuses): already JSON;
- aiohttp's router and body reader (unknown path, wrong method, body over
  ``client_max_size``): :class:`web.HTTPException`, plain text -- :func:`api_error_middleware`
  turns them into JSON for paths under ``/api/``;
- aiohttp's HTTP parser (a request line or header over its limits, malformed HTTP): answered
  before any middleware runs, in plain text -- :class:`JsonErrorRunner` serves the app with a
  protocol whose error page is the same JSON. It also raises the parser's line limit to
  :data:`MAX_REQUEST_LINE`, so a long Grafana query (a ``node=~"a|b|..."`` variable
  expansion of 20,000 characters) reaches the handler at all; the handler then applies its
  own, stated limit on the query's length.

The shape: ``{"status": "error", "errorType": ..., "error": ...}``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Final

import orjson
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

__all__ = ["MAX_REQUEST_LINE", "JsonErrorRunner", "api_error_middleware", "error_response",
           "error_type_for"]

log = logging.getLogger("fleetpulse.aggregator.http")

MAX_REQUEST_LINE: Final = 256 * 1024
"""Longest request line (and header line) the parser accepts: room for a query of the
API's maximum length (:data:`aggregator.http_api.MAX_QUERY_CHARS`) percent-encoded."""

_TYPES: Final = {401: "unauthorized", 404: "not_found", 406: "not_acceptable",
                 422: "execution", 503: "unavailable", 504: "timeout"}


def error_type_for(status: int) -> str:
    """Prometheus' errorType for an HTTP status (4xx without a closer one: bad_data)."""
    if status in _TYPES:
        return _TYPES[status]
    return "internal" if status >= 500 else "bad_data"


def error_response(status: int, message: str, error_type: str | None = None) -> web.Response:
    body = {"status": "error", "errorType": error_type or error_type_for(status),
            "error": message}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@web.middleware
async def api_error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's HTTP errors (404, 405, 413, ...) and unexpected failures -> JSON, /api/ only."""
    if not request.path.startswith("/api/"):
        return await handler(request)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects stay what they are
        text = (exc.text or "").strip()
        # aiohttp's texts start with the status line ("404: Not Found"); keep the detail.
        detail = text.split(": ", 1)[1] if text.startswith(f"{exc.status}: ") else text
        return error_response(exc.status, detail or exc.reason)
    except Exception:  # a bug: log it with its traceback, answer in the API's shape
        log.exception("query API request %s %s failed", request.method, request.path_qs[:200])
        return error_response(500, "internal error; see the aggregator's log")


class _JsonErrorProtocol(web.RequestHandler):
    """aiohttp's protocol with the parser's error page in Prometheus' JSON shape."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses if sent already
        if status >= 500:
            text = "internal error; see the aggregator's log"
        elif isinstance(exc, LineTooLong):
            text = f"request line or header longer than {MAX_REQUEST_LINE} bytes"
        else:  # the parser's own message echoes raw request bytes: name the error only
            text = f"malformed HTTP request ({type(exc).__name__ if exc else HTTPStatus(status).phrase})"
        resp = error_response(status, text)
        resp.force_close()
        return resp


class _JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        # Same construction as web.Server.__call__, with the JSON error page protocol.
        return _JsonErrorProtocol(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An AppRunner whose low-level HTTP errors are JSON and whose line limit is raised."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", MAX_REQUEST_LINE)
        kwargs.setdefault("max_field_size", MAX_REQUEST_LINE)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                                handler_cancellation=server.handler_cancellation,
                                loop=server._loop, **server._kwargs)
