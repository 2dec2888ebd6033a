"""A small asyncio Kubernetes REST client working on plain dicts.

The operator builds manifests as dicts and applies them with server-side
apply, so it needs no typed models: a handful of verbs over aiohttp, with the
credentials resolved exactly as Kopf resolves them (in-cluster service account
first, then the kubeconfig).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

import aiohttp
import kubernetes.client
import kubernetes.config
from chunkpilot.operator.apicalls import APPLY_PATCH as APPLY_PATCH
from chunkpilot.operator.apicalls import check_declared, enforcing, requests_of

from chunkpilot import telemetry

MERGE_PATCH: Final = "application/merge-patch+json"
# The cause the API server attaches when it refuses new content in a namespace being deleted.
NAMESPACE_TERMINATING_CAUSE: Final = "NamespaceTerminating"


class KubeError(RuntimeError):
    """A non-success answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        self.status = status
        self.body = body
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            answer = {}
        message = answer.get("message", body)
        # A Status's causes carry their type under the JSON key "reason".
        causes = (answer.get("details") or {}).get("causes") or []
        self.causes: frozenset[str] = frozenset(
            str(cause.get("reason", "")) for cause in causes if isinstance(cause, dict)
        )
        super().__init__(f"{method} {path}: HTTP {status}: {message}")

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def transient(self) -> bool:
        """The API server was overloaded or failed (429, 5xx): the same request may succeed soon."""
        return self.status == 429 or self.status >= 500

    @property
    def namespace_terminating(self) -> bool:
        """The write was refused because its namespace is being deleted (not an RBAC denial)."""
        return self.status == 403 and NAMESPACE_TERMINATING_CAUSE in self.causes


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is the API server's load or the network's, not the request's: an overloaded
    or failing server (:attr:`KubeError.transient`), a time-out, a dropped connection."""
    if isinstance(error, KubeError):
        return error.transient
    return isinstance(
        error, asyncio.TimeoutError | aiohttp.ClientConnectionError | aiohttp.ClientPayloadError
    )


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """``/api/v1/namespaces/ns/services/x`` or ``/apis/group/v/namespaces/ns/plural/x/status``."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{quote(namespace)}")
    parts.append(plural)
    if name:
        parts.append(quote(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


#: Plural names of the kinds the operator writes.
PLURALS: Final = {
    "Deployment": "deployments",
    "Service": "services",
    "PodMonitor": "podmonitors",
    "InferenceService": "inferenceservices",
    "TuningTrial": "tuningtrials",
    "Event": "events",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Job": "jobs",
    "ConfigMap": "configmaps",
    "NetworkPolicy": "networkpolicies",
}


def object_path(manifest: Mapping[str, Any]) -> str:
    """The URL path of a manifest's object (namespaced kinds only)."""
    meta = manifest["metadata"]
    return resource_path(
        manifest["apiVersion"], PLURALS[manifest["kind"]], meta.get("namespace"), meta["name"]
    )


@dataclass
class _Credentials:
    server: str
    configuration: kubernetes.client.Configuration

    def authorization(self) -> str | None:
        # Called per request: for in-cluster tokens this re-reads the rotated token file.
        config = self.configuration
        header: str | None = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
            "authorization"
        )
        return header

    def ssl_context(self) -> ssl.SSLContext | bool:
        config = self.configuration
        if not config.verify_ssl:
            return False
        context = ssl.create_default_context(cafile=config.ssl_ca_cert)
        if config.cert_file and config.key_file:
            context.load_cert_chain(config.cert_file, config.key_file)
        return context


def load_credentials(kubeconfig: str | None = None) -> _Credentials:
    """In-cluster service account, else the kubeconfig (``$KUBECONFIG`` or ~/.kube/config)."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return _Credentials(configuration.host, configuration)
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    return _Credentials(configuration.host, configuration)


def _count(method: str, url: str, content_type: str | None) -> None:
    """Count the request in ``chunkpilot_kube_requests_total`` (its first RBAC check names it)."""
    with contextlib.suppress(ValueError):
        checks = requests_of(method, url, content_type)
        if checks:
            first = checks[0]
            resource = f"{first.group}/{first.resource}" if first.group else first.resource
            telemetry.KUBE_REQUESTS.labels(first.verb, resource).inc()


class KubeClient:
    """The verbs the operator needs, on JSON dicts.

    Each request's RBAC needs are those :mod:`chunkpilot.operator.apicalls` lists for the chart.
    """

    def __init__(
        self,
        credentials: _Credentials,
        *,
        field_manager: str,
        timeout_s: float = 30.0,
        enforce_declared_calls: bool | None = None,
    ) -> None:
        self._credentials = credentials
        self.field_manager = field_manager
        # Each request's connect and each read are timed, not its wait for one of the pool's
        # connections: under a burst, handlers queue for the pool far longer than any request takes,
        # and a total time-out failed hundreds of them there without a request sent.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        #: Refuse calls missing from :data:`~chunkpilot.operator.apicalls.API_CALLS` (tests turn it on).
        #: The operator passes its configuration's value; None (clients of tools and tests): from
        #: ``CHUNKPILOT_KUBE_CALLS`` in the environment, read here, once per client.
        self.enforce_declared_calls = (
            enforcing(os.environ) if enforce_declared_calls is None else enforce_declared_calls
        )

    @classmethod
    def from_environment(
        cls, *, field_manager: str, kubeconfig: str | None = None, enforce_declared_calls: bool | None = None
    ) -> KubeClient:
        """A client with the credentials of ``kubeconfig`` (None: in-cluster, then the default kubeconfig)."""
        return cls(
            load_credentials(kubeconfig),
            field_manager=field_manager,
            enforce_declared_calls=enforce_declared_calls,
        )

    async def _get_session(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is None or self._session.closed:
                connector = aiohttp.TCPConnector(ssl=self._credentials.ssl_context(), limit=32)
                self._session = aiohttp.ClientSession(
                    base_url=self._credentials.server, connector=connector, timeout=self._timeout
                )
            return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``method path`` with a JSON ``body``; the decoded answer, or :class:`KubeError`."""
        url = path + (f"?{urlencode(params)}" if params else "")
        if self.enforce_declared_calls:
            check_declared(method, url, content_type if body is not None else None)
        _count(method, url, content_type if body is not None else None)
        session = await self._get_session()
        headers = {"Accept": "application/json"}
        auth = self._credentials.authorization()
        if auth:
            headers["Authorization"] = auth
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        async with session.request(method, url, data=data, headers=headers) as response:
            text = await response.text()
            if response.status >= 400:
                raise KubeError(response.status, method, path, text)
            result: dict[str, Any] = json.loads(text) if text else {}
            return result

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except KubeError as error:
            if error.not_found:
                return None
            raise

    async def apply(self, manifest: Mapping[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply ``manifest`` as this client's field manager (creates it when absent)."""
        params = {"fieldManager": self.field_manager, "force": "true" if force else "false"}
        return await self.request(
            "PATCH", object_path(manifest), body=dict(manifest), content_type=APPLY_PATCH, params=params
        )

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch; include ``metadata.resourceVersion`` to make it conditional."""
        return await self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH)

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=dict(body))

    async def delete(self, path: str) -> None:
        try:
            await self.request("DELETE", path)
        except KubeError as error:
            if not error.not_found:
                raise

    async def list(self, path: str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[dict[str, Any]] = (await self.request("GET", path, params=params)).get("items", [])
        return items

    async def has_resource(self, api_version: str, plural: str) -> bool:
        """Whether the API server serves ``plural`` in ``api_version`` (e.g. podmonitors)."""
        document = await self.get(resource_path(api_version, "").rstrip("/"))
        if document is None:
            return False
        return any(item.get("name") == plural for item in document.get("resources", []))
