"""Operator configuration: command-line flags and environment variables, one dataclass.

The environment is read once per process, at start-up, by :meth:`OperatorConfig.from_env` (``chunkpilot
operator`` then lets its flags override what it read); the frozen :class:`OperatorConfig` is handed
to the handlers through Kopf's memo (:mod:`chunkpilot.operator.startup`). Nothing reads the
environment later, and nothing writes configuration back into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from chunkpilot.operator.apicalls import enforcing

from chunkpilot.api import InferenceService
from chunkpilot.api.engines import with_registry

ENV_PREFIX: Final = "CHUNKPILOT_"
ENV_POD_MONITOR: Final = "CHUNKPILOT_POD_MONITOR"
ENV_POD_MONITOR_LABELS: Final = "CHUNKPILOT_POD_MONITOR_LABELS"
ENV_PROMETHEUS_URL: Final = "CHUNKPILOT_PROMETHEUS_URL"
#: Prometheus credentials, as files mounted from Secrets (chart values ``prometheus.auth``).
ENV_PROMETHEUS_BEARER_TOKEN_FILE: Final = "CHUNKPILOT_PROMETHEUS_BEARER_TOKEN_FILE"
ENV_PROMETHEUS_USERNAME: Final = "CHUNKPILOT_PROMETHEUS_USERNAME"
ENV_PROMETHEUS_PASSWORD_FILE: Final = "CHUNKPILOT_PROMETHEUS_PASSWORD_FILE"
ENV_PROMETHEUS_CA_FILE: Final = "CHUNKPILOT_PROMETHEUS_CA_FILE"
ENV_EXPECTED_REPLICAS: Final = "CHUNKPILOT_OPERATOR_REPLICAS"
ENV_KUBECONFIG: Final = "KUBECONFIG"
#: Optuna RDB storage URL the autotuner mirrors its studies into (read by the tuner).
ENV_OPTUNA_STORAGE: Final = "CHUNKPILOT_OPTUNA_STORAGE"
ENV_METRICS_PORT: Final = "CHUNKPILOT_METRICS_PORT"
#: ``off`` when the installation grants no Secret access (the chart's ``liveAdjust.enabled=false``).
ENV_LIVE_ADJUST: Final = "CHUNKPILOT_LIVE_ADJUST"
#: ``off`` when the installation grants no router RBAC (the chart's ``disaggregation.enabled=false``).
ENV_DISAGGREGATION: Final = "CHUNKPILOT_DISAGGREGATION"
DEFAULT_METRICS_PORT: Final = 8080
#: ``off`` runs the operator without the autotuner (``chunkpilot operator --no-autotuner``).
ENV_AUTOTUNER: Final = "CHUNKPILOT_AUTOTUNER"
#: ``on`` registers the probe Job handlers (:mod:`chunkpilot.operator.probejob`; default off).
ENV_PROBE_JOBS: Final = "CHUNKPILOT_PROBE_JOBS"
#: Operator-wide probe image (the Chunkpilot image built with the ``probe`` extra).
ENV_PROBE_IMAGE: Final = "CHUNKPILOT_PROBE_IMAGE"
ENV_IMAGE_REGISTRY: Final = "CHUNKPILOT_IMAGE_REGISTRY"
ENV_PROBE_PUBLISHER_ROLE: Final = "CHUNKPILOT_PROBE_PUBLISHER_ROLE"
ENV_OPERATOR_NAMESPACE: Final = "CHUNKPILOT_OPERATOR_NAMESPACE"
ENV_PROMETHEUS_NAMESPACE_LABELS: Final = "CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS"
#: ``on``: a service's ``chunkpilot.io/probe-image`` annotation picks its probe's image (off by
#: default: whoever may edit an InferenceService would choose what runs with the probe's
#: ServiceAccount).
ENV_PROBE_IMAGE_ANNOTATION: Final = "CHUNKPILOT_PROBE_IMAGE_ANNOTATION"

FIELD_MANAGER: Final = "chunkpilot-operator"
#: Prefix of the annotations Kopf keeps its handler progress and diff base in.
PERSISTENCE_PREFIX: Final = "chunkpilot.io"
#: Kopf's diff base: the spec as the operator last handled it, written once its handlers succeeded.
DIFFBASE_KEY: Final = "last-handled-configuration"
HANDLED_ANNOTATION: Final = f"{PERSISTENCE_PREFIX}/{DIFFBASE_KEY}"
FINALIZER: Final = "chunkpilot.io/finalizer"

#: Reason of the ``LiveAdjust`` condition on a service that asks for ``autotune.liveAdjust`` while the
#: installation disables it.
REASON_LIVE_ADJUST_DISABLED: Final = "LiveAdjustDisabled"
LIVE_ADJUST_DISABLED_MESSAGE: Final = (
    "autotune.liveAdjust needs the chart value liveAdjust.enabled=true "
    f"(the operator runs with {ENV_LIVE_ADJUST}=off); trials roll out instead"
)


#: Ready=False reason of a disaggregated service while the installation disables disaggregation.
REASON_DISAGGREGATION_DISABLED: Final = "DisaggregationDisabled"
DISAGGREGATION_DISABLED_MESSAGE: Final = (
    "topology.mode disaggregated needs the chart value disaggregation.enabled=true (the operator runs"
    f" with {ENV_DISAGGREGATION}=off and may not create the router's ServiceAccount, Role and"
    " RoleBinding): enable it, or set topology.mode: colocated"
)


class PodMonitorMode(StrEnum):
    """Whether to create a PodMonitor per service."""

    AUTO = "auto"  # when the monitoring.coreos.com/v1 API is served
    ENABLED = "enabled"
    DISABLED = "disabled"


def parse_labels(text: str) -> dict[str, str]:
    """Parse ``key=value,key2=value2`` (the format of ``--pod-monitor-labels``)."""
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"invalid label {item!r}: use key=value pairs separated by commas, e.g. release=prometheus"
            )
        labels[key.strip()] = value.strip()
    return labels


@dataclass(frozen=True)
class PrometheusAuth:
    """How the tuner authenticates to Prometheus: a bearer token or basic auth, and a CA bundle to
    verify its certificate, each a file (mounted from a Secret, read anew for every client, so a
    rotated token is picked up)."""

    bearer_token_file: str | None = None
    username: str | None = None
    password_file: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password_file is None):
            raise ValueError(
                f"{ENV_PROMETHEUS_USERNAME} and {ENV_PROMETHEUS_PASSWORD_FILE} go together (basic auth)"
            )
        if self.bearer_token_file is not None and self.username is not None:
            raise ValueError(
                f"{ENV_PROMETHEUS_BEARER_TOKEN_FILE} and basic auth ({ENV_PROMETHEUS_USERNAME}) exclude "
                "each other: set one"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PrometheusAuth:
        return cls(
            bearer_token_file=env.get(ENV_PROMETHEUS_BEARER_TOKEN_FILE) or None,
            username=env.get(ENV_PROMETHEUS_USERNAME) or None,
            password_file=env.get(ENV_PROMETHEUS_PASSWORD_FILE) or None,
            ca_file=env.get(ENV_PROMETHEUS_CA_FILE) or None,
        )

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header of a bearer token (read from its file now), else none."""
        if self.bearer_token_file is None:
            return {}
        return {"Authorization": f"Bearer {_read_secret(self.bearer_token_file)}"}

    def basic(self) -> tuple[str, str] | None:
        """``(username, password)`` for basic auth (the password read from its file now), else None."""
        if self.username is None or self.password_file is None:
            return None
        return self.username, _read_secret(self.password_file)

    def describe(self) -> str:
        """What is used, never a secret (for logs)."""
        parts = ["bearer token" if self.bearer_token_file else "", "basic auth" if self.username else ""]
        parts.append(f"CA {self.ca_file}" if self.ca_file else "")
        return ", ".join(p for p in parts if p) or "no credentials"


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ValueError(f"cannot read the Prometheus credential file {path}: {error.strerror}") from None


def redacted_url(url: str) -> str:
    """``url`` without the password of a ``user:pass@`` part: safe for logs, statuses and Events."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


@dataclass(frozen=True)
class NetworkPeers:
    """Where the installation's own callers of the engines run, for services' NetworkPolicies."""

    #: The operator's namespace (``CHUNKPILOT_OPERATOR_NAMESPACE``, set by the chart); None: not admitted.
    operator_namespace: str | None = None
    #: Labels of Prometheus's namespace (``CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS``); empty: not admitted.
    prometheus_namespace_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the handlers need to know beyond the objects they are handed."""

    pod_monitor: PodMonitorMode = PodMonitorMode.AUTO
    pod_monitor_labels: Mapping[str, str] = field(default_factory=dict)
    prometheus_url: str | None = None
    #: Credentials for ``prometheus_url`` (files mounted from Secrets).
    prometheus_auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    expected_replicas: int = 1
    field_manager: str = FIELD_MANAGER
    #: Port of the operator's own ``/metrics``; 0 = not served.
    metrics_port: int = DEFAULT_METRICS_PORT
    optuna_storage: str | None = None
    #: Whether services may use ``autotune.liveAdjust`` (False: the installation grants no Secrets).
    live_adjust: bool = True
    #: Whether disaggregated services are served (False: the installation grants no router RBAC).
    disaggregation: bool = True
    #: Whether the autotuner's handlers are loaded (False: ``--no-autotuner``, ``CHUNKPILOT_AUTOTUNER=off``).
    autotuner: bool = True
    #: Whether the probe Job handlers are registered (``CHUNKPILOT_PROBE_JOBS``).
    probe_jobs: bool = False
    #: The probe image (None: the image of this operator's version).
    probe_image: str | None = None
    #: Whether a service's ``chunkpilot.io/probe-image`` annotation may override it
    #: (``CHUNKPILOT_PROBE_IMAGE_ANNOTATION=on``).
    probe_image_annotation: bool = False
    #: ``(kind, name)`` of the installation's role for the probe's publisher, which the operator binds
    #: (``CHUNKPILOT_PROBE_PUBLISHER_ROLE=ClusterRole/chunkpilot-probe-publisher``, set by the chart);
    #: None: the operator writes the probe a Role of its own (and must hold its ConfigMap verbs).
    probe_publisher_role: tuple[str, str] | None = None
    #: The registry the default images are pulled from instead of theirs (``CHUNKPILOT_IMAGE_REGISTRY``,
    #: e.g. an air-gapped mirror); None: their own. Images a spec names are used as given.
    image_registry: str | None = None
    #: Who besides a service's declared clients may reach its engines when it has a NetworkPolicy.
    network_peers: NetworkPeers = field(default_factory=NetworkPeers)
    #: The kubeconfig file of ``--kubeconfig`` (None: in-cluster, then the Kubernetes client's default,
    #: ``$KUBECONFIG`` or ``~/.kube/config``).
    kubeconfig: str | None = None
    #: Refuse API calls missing from :data:`~chunkpilot.operator.apicalls.API_CALLS`
    #: (``CHUNKPILOT_KUBE_CALLS=enforce``; the test suite sets it).
    enforce_kube_calls: bool = False

    def live_adjust_blocked(self, isvc: InferenceService) -> bool:
        """True when ``isvc`` asks for live adjustment that this installation disables."""
        return not self.live_adjust and isvc.spec.autotune.live_adjust

    def served(self, isvc: InferenceService) -> InferenceService:
        """``isvc`` as this installation runs it: ``autotune.liveAdjust`` off when it is disabled, and
        the default images from :attr:`image_registry` when one is set."""
        if self.live_adjust_blocked(isvc):
            isvc = without_live_adjust(isvc)
        return with_images_from(isvc, self.image_registry)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorConfig:
        """The configuration in ``environ`` (the process's environment, read once at start-up).

        Raises :class:`ValueError` naming the variable for a value it cannot use.
        """
        env = environ
        replicas_text = env.get(ENV_EXPECTED_REPLICAS, "1") or "1"
        try:
            replicas = int(replicas_text)
        except ValueError:
            raise ValueError(f"{ENV_EXPECTED_REPLICAS}={replicas_text!r} is not a whole number") from None
        try:
            labels = parse_labels(env.get(ENV_POD_MONITOR_LABELS, ""))
        except ValueError as error:
            raise ValueError(f"{ENV_POD_MONITOR_LABELS}: {error}") from None
        try:
            prometheus_labels = parse_labels(env.get(ENV_PROMETHEUS_NAMESPACE_LABELS, ""))
        except ValueError as error:
            raise ValueError(f"{ENV_PROMETHEUS_NAMESPACE_LABELS}: {error}") from None
        return cls(
            pod_monitor=parse_pod_monitor(env.get(ENV_POD_MONITOR, ""), ENV_POD_MONITOR),
            pod_monitor_labels=labels,
            prometheus_url=env.get(ENV_PROMETHEUS_URL) or None,
            prometheus_auth=PrometheusAuth.from_env(env),
            expected_replicas=replicas,
            metrics_port=parse_port(env.get(ENV_METRICS_PORT) or str(DEFAULT_METRICS_PORT), ENV_METRICS_PORT),
            optuna_storage=env.get(ENV_OPTUNA_STORAGE, "").strip() or None,
            live_adjust=live_adjust_allowed(env),
            disaggregation=parse_switch(env.get(ENV_DISAGGREGATION, ""), ENV_DISAGGREGATION),
            autotuner=env.get(ENV_AUTOTUNER, "").strip().lower() != "off",
            probe_jobs=probe_jobs_enabled(env),
            probe_image=env.get(ENV_PROBE_IMAGE) or None,
            image_registry=parse_image_registry(env.get(ENV_IMAGE_REGISTRY, ""), ENV_IMAGE_REGISTRY),
            probe_publisher_role=parse_role_ref(
                env.get(ENV_PROBE_PUBLISHER_ROLE, ""), ENV_PROBE_PUBLISHER_ROLE
            ),
            network_peers=NetworkPeers(
                operator_namespace=env.get(ENV_OPERATOR_NAMESPACE, "").strip() or None,
                prometheus_namespace_labels=prometheus_labels,
            ),
            probe_image_annotation=parse_switch(
                env.get(ENV_PROBE_IMAGE_ANNOTATION, "off") or "off", ENV_PROBE_IMAGE_ANNOTATION
            ),
            enforce_kube_calls=enforcing(env),
        )


def live_adjust_allowed(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` allows ``autotune.liveAdjust`` (:data:`ENV_LIVE_ADJUST` not ``off``)."""
    return parse_switch(environ.get(ENV_LIVE_ADJUST, ""), ENV_LIVE_ADJUST)


def probe_jobs_enabled(environ: Mapping[str, str]) -> bool:
    """Whether :data:`ENV_PROBE_JOBS` in ``environ`` turns the probe handlers on (default off)."""
    return environ.get(ENV_PROBE_JOBS, "off").strip().lower() in {"on", "1", "true", "yes"}


def parse_pod_monitor(text: str, where: str = "--pod-monitor") -> PodMonitorMode:
    """``auto``, ``enabled`` or ``disabled`` (empty: auto); the error names ``where``."""
    try:
        return PodMonitorMode(text.strip().lower() or PodMonitorMode.AUTO.value)
    except ValueError:
        choices = ", ".join(mode.value for mode in PodMonitorMode)
        raise ValueError(f"{where}={text!r}: use one of {choices}") from None


def without_live_adjust(isvc: InferenceService) -> InferenceService:
    """A copy of ``isvc`` with ``autotune.liveAdjust`` off (its engines then serve no route)."""
    autotune = isvc.spec.autotune.model_copy(update={"live_adjust": False})
    return isvc.model_copy(update={"spec": isvc.spec.model_copy(update={"autotune": autotune})})


def with_images_from(isvc: InferenceService, registry: str | None) -> InferenceService:
    """A copy of ``isvc`` whose unset engine and router images are the defaults pulled from ``registry``.

    The image then is the spec's, so every reader (the renderers, the plugin's recognition, which
    compares repositories without their registry) sees the one the pods run.
    """
    if not registry:
        return isvc
    from chunkpilot.operator.engines import default_image
    from chunkpilot.operator.router import default_router_image

    spec = isvc.spec
    update: dict[str, object] = {}
    if spec.engine.image is None:
        image = with_registry(default_image(spec.engine.kind, spec.engine.version), registry)
        update["engine"] = spec.engine.model_copy(update={"image": image})
    router = spec.topology.router if spec.topology is not None else None
    if spec.topology is not None and router is not None and router.image is None:
        routed = router.model_copy(update={"image": with_registry(default_router_image(), registry)})
        update["topology"] = spec.topology.model_copy(update={"router": routed})
    return isvc.model_copy(update={"spec": spec.model_copy(update=update)}) if update else isvc


def parse_role_ref(text: str, where: str) -> tuple[str, str] | None:
    """``ClusterRole/NAME`` or ``Role/NAME`` as ``(kind, name)``; empty: None."""
    value = text.strip()
    if not value:
        return None
    kind, slash, name = value.partition("/")
    if not slash or kind not in ("ClusterRole", "Role") or not name:
        raise ValueError(f"{where}={text!r}: use ClusterRole/NAME or Role/NAME")
    return kind, name


def parse_image_registry(text: str, where: str) -> str | None:
    """A registry host with an optional port and path (``mirror.internal:5000/team``); empty: None."""
    value = text.strip().rstrip("/")
    if not value:
        return None
    if "://" in value or "@" in value or " " in value or value.startswith("/"):
        raise ValueError(
            f"{where}={text!r}: give a registry host and optional path, e.g. mirror.internal:5000/ml"
        )
    return value


def parse_switch(text: str, where: str) -> bool:
    """``on`` / ``off`` (also ``true`` / ``false``; empty: on); the error names ``where``."""
    value = text.strip().lower()
    if value in ("", "on", "true"):
        return True
    if value in ("off", "false"):
        return False
    raise ValueError(f"{where}={text!r}: use on or off")


def parse_port(text: str, where: str = "--metrics-port") -> int:
    """A TCP port number 0-65535 (0 = off); the error names ``where``."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"{where}={text!r} is not a port number: use 1-65535, or 0 to turn it off")
    return port
