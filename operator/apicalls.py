"""Every Kubernetes API call the operator and the autotuner make, as RBAC terms.

:data:`API_CALLS` is the inventory the Helm chart's (Cluster)Roles are checked against
(``tests/operator/test_rbac.py`` renders the chart and fails on a call its rules do not allow, and
on a rule no call needs). The client enforces it: with ``CHUNKPILOT_KUBE_CALLS=enforce`` (the test
suite sets it) :class:`~chunkpilot.operator.kube.KubeClient` raises :class:`UndeclaredApiCallError` before
sending a request that no entry declares, so a new call in the code fails its tests until it is
declared here and granted by the chart. Calls made by Kopf itself (watches, its annotation and
status patches, events, peering) and permissions the API server requires for other reasons are
declared too; they do not pass through the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final
from urllib.parse import parse_qs, urlsplit

from chunkpilot.engine.probe.kube import PUBLISHER_ROLE_NAME

#: ``enforce``: refuse undeclared calls in :class:`~chunkpilot.operator.kube.KubeClient`.
ENV_KUBE_CALLS: Final = "CHUNKPILOT_KUBE_CALLS"
ENFORCE: Final = "enforce"
APPLY_PATCH: Final = "application/apply-patch+yaml"


class Feature(StrEnum):
    """What makes a call happen; the chart grants a feature's calls when its value is true."""

    CORE = "core"
    LIVE_ADJUST = "liveAdjust.enabled"
    DISAGGREGATION = "disaggregation.enabled"
    PROBE_JOBS = "probeJobs.enabled"
    TWIN_JOBS = "twinJobs.enabled"


class WatchMode(StrEnum):
    """The chart's ``watch.mode``: one ClusterRole, or a Role in each watched namespace."""

    CLUSTER = "cluster"
    NAMESPACED = "namespaced"


BOTH_MODES: Final = frozenset(WatchMode)


@dataclass(frozen=True)
class ApiCall:
    """Verbs on one resource (``plural`` or ``plural/subresource``) of one API group."""

    group: str
    resource: str
    verbs: frozenset[str]
    by: str
    why: str
    feature: Feature = Feature.CORE
    modes: frozenset[WatchMode] = BOTH_MODES
    cluster_scoped: bool = False
    #: The only object names the calls touch (the chart's ``resourceNames``); empty: any name.
    names: frozenset[str] = frozenset()
    #: Made only when several replicas peer (the chart's ``replicaCount`` above 1).
    peering: bool = False


def _call(
    group: str,
    resource: str,
    verbs: str,
    by: str,
    why: str,
    *,
    feature: Feature = Feature.CORE,
    modes: frozenset[WatchMode] = BOTH_MODES,
    cluster_scoped: bool = False,
    names: tuple[str, ...] = (),
    peering: bool = False,
) -> ApiCall:
    return ApiCall(
        group,
        resource,
        frozenset(verbs.split()),
        by,
        why,
        feature,
        modes,
        cluster_scoped,
        frozenset(names),
        peering,
    )


#: The Secret of each namespace holding the live-adjustment tokens (``builders.LIVE_ADJUST_SECRET``).
LIVE_ADJUST_SECRET_NAME: Final = "chunkpilot-live-adjust"

#: The installation's role the probe's publisher is bound to.
PROBE_PUBLISHER_ROLE: Final = PUBLISHER_ROLE_NAME

OPERATOR: Final = "operator"
TUNER: Final = "tuner"
KOPF: Final = "kopf"
APISERVER: Final = "apiserver"
ISVC: Final = "inferenceservices"
GROUP: Final = "chunkpilot.io"

API_CALLS: Final[tuple[ApiCall, ...]] = (
    _call(GROUP, ISVC, "list watch", KOPF, "the handlers' watch"),
    _call(GROUP, ISVC, "patch", KOPF, "handler progress annotations and the finalizer"),
    _call(GROUP, ISVC, "get", OPERATOR, "the parent of a child event; the tuner reads its service"),
    _call(GROUP, ISVC, "list", OPERATOR, "services waiting for a probe profile", feature=Feature.PROBE_JOBS),
    _call(GROUP, ISVC, "patch", OPERATOR, "probe request annotations", feature=Feature.PROBE_JOBS),
    _call(GROUP, f"{ISVC}/status", "patch", OPERATOR, "conditions, replicas, bestConfig (operator, tuner)"),
    _call(
        GROUP,
        f"{ISVC}/finalizers",
        "update",
        APISERVER,
        "children carry ownerReferences with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
    ),
    _call(GROUP, "tuningtrials", "list create patch", TUNER, "the durable trial history"),
    _call(GROUP, "tuningtrials", "list watch", KOPF, "the tick's trial list, from the watch"),
    _call(GROUP, "tuningtrials/status", "patch", TUNER, "a trial's phase, verdict and measurements"),
    _call("apps", "deployments", "list watch", KOPF, "child events (drift, readiness)"),
    _call(
        "apps",
        "deployments",
        "get create patch delete",
        OPERATOR,
        "stable Deployment, the pools and router of a disaggregated service (server-side apply); the"
        " Deployments a topology change leaves are deleted",
    ),
    _call("apps", "deployments", "get create patch delete", TUNER, "the canary Deployment"),
    _call("", "services", "list watch", KOPF, "child events"),
    _call("", "services", "get create patch", OPERATOR, "the Service (server-side apply)"),
    _call("monitoring.coreos.com", "podmonitors", "list watch", KOPF, "child events"),
    _call(
        "monitoring.coreos.com",
        "podmonitors",
        "get create patch",
        OPERATOR,
        "the PodMonitor (one per pool of a disaggregated service)",
    ),
    _call(
        "monitoring.coreos.com",
        "podmonitors",
        "delete",
        OPERATOR,
        "the PodMonitors a topology change leaves",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "networking.k8s.io",
        "networkpolicies",
        "get create patch delete",
        OPERATOR,
        "the NetworkPolicy of a service with spec.networkPolicy.enabled (removed when turned off)",
    ),
    _call("", "events", "create", KOPF, "Events posted by the operator and the tuner"),
    _call("", "pods", "list", TUNER, "crash detection of canary pods; the Ready canary pods to live-adjust"),
    _call(
        "",
        "pods",
        "get list watch",
        APISERVER,
        "the router's Role grants these (its pod discovery); a Role can only grant what its creator holds",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "",
        "serviceaccounts",
        "get create patch",
        OPERATOR,
        "the router's ServiceAccount",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "roles",
        "get create patch",
        OPERATOR,
        "the router's Role",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "get create patch",
        OPERATOR,
        "the router's RoleBinding",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "",
        "serviceaccounts",
        "get create patch delete",
        TUNER,
        "a topology trial's canary router ServiceAccount: applied with it, removed with its verdict (read "
        "first: one of that name the service does not own is left alone)",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "roles",
        "get create patch delete",
        TUNER,
        "a topology trial's canary router Role: applied with it, removed with its verdict (read "
        "first: one of that name the service does not own is left alone)",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "get create patch delete",
        TUNER,
        "a topology trial's canary router RoleBinding: applied with it, removed with its verdict (read "
        "first: one of that name the service does not own is left alone)",
        feature=Feature.DISAGGREGATION,
    ),
    _call(
        "",
        "secrets",
        "create",
        OPERATOR,
        "the namespace's live-adjustment Secret, created once (create cannot be limited by name)",
        feature=Feature.LIVE_ADJUST,
    ),
    _call(
        "",
        "secrets",
        "get patch",
        OPERATOR,
        "the namespace's live-adjustment Secret: a service's track tokens added once, never replaced",
        feature=Feature.LIVE_ADJUST,
        names=(LIVE_ADJUST_SECRET_NAME,),
    ),
    _call(
        "",
        "secrets",
        "get",
        TUNER,
        "the canary's token for the engines' limits route",
        feature=Feature.LIVE_ADJUST,
        names=(LIVE_ADJUST_SECRET_NAME,),
    ),
    _call(
        "apps",
        "replicasets",
        "list",
        TUNER,
        "the canary's ReplicaSets: the token goes only to pods whose owner chain ends at the canary",
        feature=Feature.LIVE_ADJUST,
    ),
    _call(
        "kopf.dev",
        "clusterkopfpeerings",
        "get list watch patch",
        KOPF,
        "peering across replicas (--all-namespaces); the operator checks the object exists",
        modes=frozenset({WatchMode.CLUSTER}),
        cluster_scoped=True,
        peering=True,
    ),
    _call(
        "kopf.dev",
        "kopfpeerings",
        "get list watch patch",
        KOPF,
        "peering across replicas (--namespace); the operator checks the objects exist",
        modes=frozenset({WatchMode.NAMESPACED}),
        peering=True,
    ),
    _call("batch", "jobs", "get create", TUNER, "rankings on the twin as Jobs", feature=Feature.TWIN_JOBS),
    _call(
        "batch",
        "jobs",
        "list watch",
        KOPF,
        "the twin Jobs' progress and results, read from the watch",
        feature=Feature.TWIN_JOBS,
    ),
    _call(
        "batch",
        "jobs",
        "patch",
        APISERVER,
        "each twin Job's Role lets its worker patch that Job; a Role can only grant what its creator holds",
        feature=Feature.TWIN_JOBS,
    ),
    _call(
        "",
        "serviceaccounts",
        "get create",
        TUNER,
        "the twin Jobs' ServiceAccount",
        feature=Feature.TWIN_JOBS,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "roles",
        "get create",
        TUNER,
        "each twin Job's Role (patching that one Job)",
        feature=Feature.TWIN_JOBS,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "get create",
        TUNER,
        "each twin Job's RoleBinding",
        feature=Feature.TWIN_JOBS,
    ),
    _call("batch", "jobs", "list watch", KOPF, "probe Job events", feature=Feature.PROBE_JOBS),
    _call("batch", "jobs", "get create delete", OPERATOR, "the probe Job", feature=Feature.PROBE_JOBS),
    _call("", "configmaps", "list watch", KOPF, "profile ConfigMap events", feature=Feature.PROBE_JOBS),
    _call("", "configmaps", "get", OPERATOR, "the published profile", feature=Feature.PROBE_JOBS),
    _call(
        "",
        "serviceaccounts",
        "get create patch",
        OPERATOR,
        "the probe's ServiceAccount",
        feature=Feature.PROBE_JOBS,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "get create patch",
        OPERATOR,
        "the probe's RoleBinding to the installation's chunkpilot-probe-publisher role",
        feature=Feature.PROBE_JOBS,
    ),
    _call(
        "rbac.authorization.k8s.io",
        "clusterroles",
        "bind",
        APISERVER,
        "binding chunkpilot-probe-publisher (its ConfigMap writes) to the probe without holding them",
        feature=Feature.PROBE_JOBS,
        modes=frozenset({WatchMode.CLUSTER}),
        names=(PROBE_PUBLISHER_ROLE,),
    ),
    _call(
        "rbac.authorization.k8s.io",
        "roles",
        "bind",
        APISERVER,
        "binding chunkpilot-probe-publisher (its ConfigMap writes) to the probe without holding them",
        feature=Feature.PROBE_JOBS,
        modes=frozenset({WatchMode.NAMESPACED}),
        names=(PROBE_PUBLISHER_ROLE,),
    ),
)


@dataclass(frozen=True)
class Request:
    """One RBAC check a REST request needs: verb, API group, resource and whether it names a namespace."""

    verb: str
    group: str
    resource: str
    namespaced: bool
    #: The object the request names (None: a list, watch or create); checked against
    #: :attr:`ApiCall.names`, not part of what the check is (two gets of a kind are one check).
    name: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        where = "in a namespace" if self.namespaced else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} ({where})"


def requests_of(method: str, path: str, content_type: str | None = None) -> list[Request]:
    """The RBAC checks a request to ``path`` needs ([] for discovery documents).

    A server-side apply (``PATCH`` with ``application/apply-patch+yaml``) needs ``create`` too, for
    when the object does not exist yet.
    """
    split = urlsplit(path)
    parts = [part for part in split.path.split("/") if part]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a Kubernetes API path: {path!r}")
    if not rest:
        return []  # discovery: /api/v1, /apis/group/version (allowed to every authenticated user)
    namespaced = rest[0] == "namespaces" and len(rest) >= 3
    if namespaced:
        rest = rest[2:]
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    named = len(rest) >= 2
    method = method.upper()
    if method == "GET":
        watching = parse_qs(split.query).get("watch", [""])[0].lower() in {"1", "true"}
        verbs = ["get"] if named else ["watch" if watching else "list"]
    elif method == "POST":
        verbs = ["create"]
    elif method == "PUT":
        verbs = ["update"]
    elif method == "PATCH":
        verbs = ["patch", "create"] if content_type == APPLY_PATCH else ["patch"]
    elif method == "DELETE":
        verbs = ["delete"] if named else ["deletecollection"]
    else:
        raise ValueError(f"unsupported method {method} for {path}")
    name = rest[1] if named and verbs != ["create"] else None
    return [Request(verb, group, resource, namespaced, None if verb == "create" else name) for verb in verbs]


def declares(call: ApiCall, request: Request) -> bool:
    """Whether ``call`` covers ``request`` (a cluster-scoped resource never names a namespace)."""
    return (
        call.group == request.group
        and call.resource == request.resource
        and request.verb in call.verbs
        and request.namespaced != call.cluster_scoped
        and (not call.names or request.name in call.names)
    )


class UndeclaredApiCallError(RuntimeError):
    """A request no entry of :data:`API_CALLS` declares (so the chart may not grant it)."""

    def __init__(self, request: Request, method: str, path: str) -> None:
        self.request = request
        super().__init__(
            f"undeclared Kubernetes API call {method} {path} ({request}): declare it in "
            "chunkpilot.operator.apicalls.API_CALLS and grant it in the chart's RBAC "
            "(charts/chunkpilot/templates/_helpers.tpl)"
        )


#: The calls a request through the client may make: the API server's own needs are not requests.
CLIENT_CALLS: Final[tuple[ApiCall, ...]] = tuple(call for call in API_CALLS if call.by != APISERVER)


def check_declared(
    method: str, path: str, content_type: str | None = None, calls: tuple[ApiCall, ...] = CLIENT_CALLS
) -> None:
    """Raise :class:`UndeclaredApiCallError` for the first check of the request that ``calls`` lacks.

    The default ``calls`` leave out what only the API server needs (e.g. the read access a Role
    the operator creates grants): the client never sends those requests.
    """
    for request in requests_of(method, path, content_type):
        if not any(declares(call, request) for call in calls):
            raise UndeclaredApiCallError(request, method, path)


def enforcing(environ: Mapping[str, str]) -> bool:
    """Whether ``CHUNKPILOT_KUBE_CALLS`` in ``environ`` asks the client to refuse undeclared calls."""
    return environ.get(ENV_KUBE_CALLS, "").strip().lower() == ENFORCE


__all__ = [
    "API_CALLS",
    "CLIENT_CALLS",
    "ENV_KUBE_CALLS",
    "ApiCall",
    "Feature",
    "Request",
    "UndeclaredApiCallError",
    "WatchMode",
    "check_declared",
    "declares",
    "enforcing",
    "requests_of",
]
