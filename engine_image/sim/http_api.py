"""HTTP plumbing of the simulator's OpenAI server: error bodies and request-body parsing.

Every error is answered with OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``;
bad input is a 4xx naming the offending field, never a 500.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Error ``type`` by status, as vLLM's OpenAI server names them.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    409: "ConflictError",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "UnprocessableEntityError",
    503: "ServiceUnavailableError",
}


def error_type(status: int) -> str:
    """OpenAI-style error type of an HTTP status (``InternalServerError`` only for 5xx)."""
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return "".join(word.capitalize() for word in phrase.replace("-", " ").split()) + "Error"


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or error_type(status)

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        """The JSON error response."""
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }
        return web.json_response(body, status=self.status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn :class:`APIError` and aiohttp's HTTP errors into OpenAI-style JSON bodies."""
    try:
        return await handler(request)
    except APIError as error:
        return error.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
        message = error.text if error.text and error.status == 413 else (error.reason or "error")
        return APIError(error.status, message).response(headers)


def _charset(request: web.Request) -> str:
    charset = request.charset or "utf-8"
    try:
        return codecs.lookup(charset).name
    except LookupError:
        raise APIError(415, f"unsupported charset {charset!r} in Content-Type", "Content-Type") from None


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (415 unless ``application/json``; 400 for anything unparseable)."""
    if request.content_type != "application/json":
        raise APIError(
            415,
            f"Unsupported Media Type {request.content_type!r}: only 'application/json' is allowed",
            "Content-Type",
        )
    charset = _charset(request)
    raw = await request.read()  # 413 past the application's client_max_size
    try:
        text = raw.decode(charset)
        body = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise APIError(400, "request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return body


def check_text(value: str, param: str) -> str:
    """``value`` unless it holds a lone surrogate (not Unicode text: a 400 naming ``param``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(
            400, f"'{param}' is not valid Unicode: lone surrogate at position {exc.start}", param
        ) from None
    return value
