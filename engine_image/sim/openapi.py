"""The OpenAPI 3.1 document of the simulator's server (``/openapi.json``), its ``/docs`` page and the
API's :data:`VERSION`.

Schemathesis or an SDK generator can be pointed at ``/openapi.json``; ``/docs`` renders the same
document as plain HTML without fetching any asset.
"""

from __future__ import annotations

import functools
import html
from typing import Any

#: The vLLM version whose semantics are simulated, as ``/version`` and the document report it.
VERSION = "0.33.0+chunkpilot.sim"

_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR}]}
_STREAM_OPTIONS = {
    "type": "object",
    "properties": {"include_usage": _BOOL, "continuous_usage_stats": _BOOL},
}

_SAMPLING: dict[str, Any] = {
    "model": _STR,
    "max_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 128},
    "best_of": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": -1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "seed": _INT,
    "stop": _STOP,
    "stop_token_ids": {"type": "array", "items": _INT},
    "include_stop_str_in_output": _BOOL,
    "ignore_eos": _BOOL,
    "min_tokens": {"type": "integer", "minimum": 0},
    "stream": _BOOL,
    "stream_options": _STREAM_OPTIONS,
    "skip_special_tokens": _BOOL,
    "user": _STR,
    "kv_transfer_params": {
        "type": "object",
        "description": "prefill/decode disaggregation (with --kv-transfer-config): do_remote_decode for a "
        "prefill-only request, or the prefill response's kv_transfer_params for its decode",
    },
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": _STR,
        "content": {
            "oneOf": [
                _STR,
                {"type": "null"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": _STR},
                    },
                },
            ]
        },
    },
}

_SCHEMAS: dict[str, Any] = {
    "CompletionRequest": {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    _IDS,
                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                    {"type": "array", "minItems": 1, "items": _IDS},
                ]
            },
            "echo": _BOOL,
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["messages"],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "logprobs": _BOOL,
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        },
    },
    "TokenizeRequest": {
        "type": "object",
        "properties": {
            "model": _STR,
            "prompt": _STR,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            "return_token_strs": _BOOL,
        },
    },
    "DetokenizeRequest": {
        "type": "object",
        "required": ["tokens"],
        "properties": {"model": _STR, "tokens": {"type": "array", "items": _INT}},
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": _STR,
                    "type": _STR,
                    "param": {"type": ["string", "null"]},
                    "code": _INT,
                },
            }
        },
    },
}


def _operation(summary: str, schema: str | None = None, stream: bool = False) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["text/event-stream"] = {"schema": _STR}
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": "OK", "content": content},
            "400": {"description": "Bad request", **error},
            "404": {"description": "Unknown model", **error},
            "415": {"description": "Not application/json", **error},
        },
    }
    if schema is not None:
        ref = {"$ref": f"#/components/schemas/{schema}"}
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return operation


def _plain(summary: str) -> dict[str, Any]:
    return {"summary": summary, "responses": {"200": {"description": "OK"}}}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document."""
    paths: dict[str, Any] = {
        "/v1/completions": {"post": _operation("Text completion", "CompletionRequest", stream=True)},
        "/v1/chat/completions": {"post": _operation("Chat completion", "ChatCompletionRequest", stream=True)},
        "/tokenize": {"post": _operation("Token ids of a prompt or chat", "TokenizeRequest")},
        "/detokenize": {"post": _operation("Text of token ids", "DetokenizeRequest")},
        "/v1/models": {"get": _operation("Served models")},
        "/version": {"get": _operation("Simulated vLLM version")},
        "/health": {"get": _plain("200 while the engine runs")},
        "/ping": {"get": _plain("200 while the engine runs"), "post": _plain("200 while the engine runs")},
        "/metrics": {"get": _plain("Prometheus metrics (vLLM V1 names)")},
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Chunkpilot engine simulator (vLLM OpenAI-compatible API)", "version": VERSION},
        "paths": paths,
        "components": {"schemas": _SCHEMAS},
    }


def docs_html(document: dict[str, Any]) -> str:
    """A plain HTML page listing the document's operations and request fields."""
    rows: list[str] = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            ref = body.get("schema", {}).get("$ref", "")
            fields = (
                ", ".join(document["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"])
                if ref
                else ""
            )
            rows.append(
                f"<tr><td><code>{method.upper()} {html.escape(path)}</code></td>"
                f"<td>{html.escape(operation['summary'])}</td><td>{html.escape(fields)}</td></tr>"
            )
    title = html.escape(document["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
        f"<h1>{title}</h1><p>Version {html.escape(document['info']['version'])}. "
        "Machine-readable schema: <a href='/openapi.json'>/openapi.json</a>.</p>"
        "<table border='1' cellpadding='4'><tr><th>Route</th><th>What</th><th>Request fields</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
