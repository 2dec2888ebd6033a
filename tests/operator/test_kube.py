"""The operator's API client over real HTTP: what it times, and what a reconcile makes of an API
server that is overloaded or does not answer (a short retry, not Kopf's minute)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kopf
import kubernetes.client
import pytest
import yaml
from aiohttp import web
from chunkpilot.operator import reconcile
from chunkpilot.operator.builders import LABEL_MANAGED_BY, MANAGED_BY
from chunkpilot.operator.config import OperatorConfig
from chunkpilot.operator.kube import KubeClient, KubeError, _Credentials, is_transient
from chunkpilot.operator.reconcile import TRANSIENT_RETRY_S, Reconciler

from chunkpilot.api import LABEL_SERVICE, LABEL_TRACK
from chunkpilot.devcluster.ports import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat-llama-8b-sim.yaml"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def api_server(handler: Handler, *, timeout_s: float = 30.0) -> AsyncIterator[KubeClient]:
    """A client of a local HTTP server that answers every request with ``handler``."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    kube = KubeClient(
        _Credentials(configuration.host, configuration), field_manager="test", timeout_s=timeout_s
    )
    try:
        yield kube
    finally:
        await kube.close()
        await runner.cleanup()


def test_waiting_for_a_pooled_connection_is_not_timed() -> None:
    """More requests than the pool's connections, each answered within its time-out: all succeed,
    though the last wait for a connection longer than the time-out."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.json_response({"kind": "Status"})

    async def run() -> list[Any]:
        # 200 requests through 32 connections: about 7 rounds of 0.2 s, the last queued > 1 s.
        async with api_server(slow, timeout_s=1.0) as kube:
            return await asyncio.gather(
                *(kube.get(f"/api/v1/namespaces/default/services/s{i}") for i in range(200)),
                return_exceptions=True,
            )

    answers = asyncio.run(run())
    assert [a for a in answers if isinstance(a, BaseException)] == []


def test_a_request_that_gets_no_answer_times_out() -> None:
    async def stalled(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    async def run() -> BaseException:
        async with api_server(stalled, timeout_s=0.3) as kube:
            try:
                await kube.get("/api/v1/namespaces/default/services/s")
            except Exception as error:
                return error
        raise AssertionError("a stalled API server answered")

    error = asyncio.run(run())
    assert isinstance(error, TimeoutError)
    assert is_transient(error)


@pytest.mark.parametrize(
    ("status", "transient"), [(429, True), (503, True), (500, True), (403, False), (422, False)]
)
def test_overload_and_server_errors_are_transient_refusals_are_not(status: int, transient: bool) -> None:
    assert KubeError(status, "GET", "/x", "{}").transient is transient
    assert is_transient(KubeError(status, "GET", "/x", "{}")) is transient


def _service() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"].update(namespace="default", uid="u-1", generation=1, resourceVersion="1")
    return body


def _reconcile(handler: Handler, *, timeout_s: float = 30.0) -> BaseException:
    async def run() -> BaseException:
        async with api_server(handler, timeout_s=timeout_s) as kube:
            try:
                await Reconciler(kube=kube, config=OperatorConfig()).reconcile(_service())
            except BaseException as error:
                return error
        raise AssertionError("the reconcile succeeded against a failing API server")

    return asyncio.run(run())


@pytest.mark.parametrize("status", [429, 503])
def test_a_reconcile_the_api_servers_load_failed_is_retried_within_seconds(status: int) -> None:
    async def overloaded(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "message": "too many requests"}, status=status)

    error = _reconcile(overloaded)
    assert isinstance(error, kopf.TemporaryError)
    low, high = TRANSIENT_RETRY_S
    assert error.delay is not None and low <= error.delay <= high
    assert f"HTTP {status}" in str(error)


def test_a_reconcile_the_api_server_did_not_answer_is_retried_within_seconds() -> None:
    async def stalled(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    error = _reconcile(stalled, timeout_s=0.3)
    assert isinstance(error, kopf.TemporaryError)
    assert error.delay is not None and error.delay <= TRANSIENT_RETRY_S[1]


def test_a_refused_reconcile_keeps_its_error() -> None:
    """A refusal (RBAC's 403 here) is no load: it is raised as it is, and Kopf retries it in a minute."""

    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "message": "forbidden"}, status=403)

    error = _reconcile(forbidden)
    assert isinstance(error, KubeError) and error.status == 403


def test_a_drift_repair_the_api_servers_load_failed_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf retries no event handler: a deleted stable Deployment whose repair met an overloaded API
    server (503 twice) is restored on a later try."""
    monkeypatch.setattr(reconcile, "TRANSIENT_RETRY_S", (0.01, 0.02))
    service = _service()
    service["status"] = {"observedGeneration": 1}
    name = service["metadata"]["name"]
    asked: list[str] = []

    async def api(request: web.Request) -> web.Response:
        asked.append(f"{request.method} {request.path}")
        if len(asked) <= 2:
            return web.json_response({"kind": "Status", "message": "overloaded"}, status=503)
        if request.method == "GET":
            if request.path.endswith(f"/inferenceservices/{name}"):
                return web.json_response(service)
            return web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)
        answer = await request.json()
        answer.setdefault("metadata", {})["resourceVersion"] = "2"
        return web.json_response(answer)

    deleted = {
        "kind": "Deployment",
        "metadata": {
            "name": f"{name}-stable",
            "namespace": "default",
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: name, LABEL_TRACK: "stable"},
        },
    }

    async def run() -> None:
        async with api_server(api) as kube:
            await Reconciler(kube=kube, config=OperatorConfig()).child_changed("DELETED", deleted)

    asyncio.run(run())
    assert (
        sum(
            a == f"GET /apis/chunkpilot.io/v1alpha1/namespaces/default/inferenceservices/{name}"
            for a in asked
        )
        == 3
    )
    assert f"PATCH /apis/apps/v1/namespaces/default/deployments/{name}-stable" in asked, asked


def test_a_repair_the_api_server_keeps_refusing_is_given_up_after_its_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile, "TRANSIENT_RETRY_S", (0.01, 0.02))
    asked: list[str] = []

    async def overloaded(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"kind": "Status", "message": "overloaded"}, status=503)

    child = {
        "kind": "Deployment",
        "metadata": {
            "name": "s-stable",
            "namespace": "default",
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: "s"},
        },
    }

    async def run() -> BaseException:
        async with api_server(overloaded) as kube:
            try:
                await Reconciler(kube=kube, config=OperatorConfig()).child_changed("DELETED", child)
            except KubeError as error:
                return error
        raise AssertionError("an API server that always answers 503 let the repair through")

    assert asyncio.run(run()).status == 503
    assert len(asked) == reconcile.CHILD_EVENT_TRIES
