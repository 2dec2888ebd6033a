"""Kopf handlers of the operator: thin wrappers around :class:`~chunkpilot.operator.reconcile.Reconciler`.

* create / update (spec) / resume of an InferenceService: reconcile its children and status;
* a new ``status.bestConfig`` (a promotion by the tuner): the same, so the stable
  Deployment follows the promoted knobs. The operator is the stable Deployment's only
  writer: the tuner waits for ``status.appliedConfigHash`` to show the promoted config;
* a new ``status.bestTopology`` (a topology trial promoted): the same, so the pools and the
  router replace the colocated Deployment once they are Ready (their own events, then the
  Service's, carry the switch-over on);
* a new decision of the planner (``status.scaling.desiredReplicas`` or ``decision``, which
  names a pool's too): the same, so ``scaling.mode: Auto`` runs it;
* any event of a labelled child (stable Deployment, a disaggregated service's pool and
  router Deployments, Service, PodMonitor): restore it when it was edited or deleted by
  hand, and refresh the parent's status from the Deployments. Drift is corrected by
  watching the children, not by polling: a change is undone within one watch event, and
  an idle cluster costs no requests.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from chunkpilot.operator import ha
from chunkpilot.operator.builders import ANNOTATION_ROTATE_TOKENS, LABEL_MANAGED_BY, MANAGED_BY
from chunkpilot.operator.config import (
    DIFFBASE_KEY,
    FIELD_MANAGER,
    FINALIZER,
    PERSISTENCE_PREFIX,
    OperatorConfig,
)
from chunkpilot.operator.events import post_event
from chunkpilot.operator.kube import KubeClient, load_credentials
from chunkpilot.operator.reconcile import Reconciler

from chunkpilot.api import GROUP, ISVC_PLURAL, LABEL_SERVICE, VERSION

CHILD_LABELS: dict[str, Any] = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: kopf.PRESENT}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """All operator settings in one place; refuses to start an unsafe HA setup."""
    settings.posting.level = logging.INFO
    settings.posting.loggers = False  # only the explicit Events below, no log spam in `kubectl describe`
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key=DIFFBASE_KEY
    )
    # Serve what exists at startup; no cluster-wide CRD/namespace watches (least privilege).
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.peering.stealth = True

    config: OperatorConfig = memo["config"]  # read at start-up (chunkpilot.operator.startup)
    problem = ha.check_peering_settings(
        expected_replicas=config.expected_replicas,
        standalone=settings.peering.standalone,
        mandatory=settings.peering.mandatory,
    )
    if problem:
        raise kopf.PermanentError(problem)
    kube = KubeClient.from_environment(
        field_manager=FIELD_MANAGER,
        kubeconfig=config.kubeconfig,
        enforce_declared_calls=config.enforce_kube_calls,
    )
    if settings.peering.mandatory:
        missing = await ha.missing_peering_objects(
            kube, settings.peering.name, settings.peering.clusterwide, memo.get("namespaces") or []
        )
        if missing:
            await kube.close()
            raise kopf.PermanentError(missing)
    memo["reconciler"] = Reconciler(kube=kube, config=config, post_event=post_event)
    logger.info(
        "chunkpilot operator configured: pod monitor %s, peering %s",
        config.pod_monitor.value,
        "off"
        if settings.peering.standalone
        else f"{settings.peering.name!r} priority {settings.peering.priority}",
    )


@kopf.on.login()
def login(
    memo: kopf.Memo, logger: kopf.Logger, settings: kopf.OperatorSettings, **kwargs: Any
) -> kopf.ConnectionInfo | None:
    """Kopf's own credentials: those of ``--kubeconfig`` when given, else Kopf's default (in-cluster,
    then the kubeconfig of the Kubernetes client: ``$KUBECONFIG`` or ``~/.kube/config``)."""
    config: OperatorConfig | None = memo.get("config")
    if config is None or config.kubeconfig is None:
        info: kopf.ConnectionInfo | None = kopf.login_via_client(logger=logger, settings=settings, **kwargs)
        return info
    credentials = load_credentials(config.kubeconfig)
    scheme: str | None = None
    token: str | None = None
    header = credentials.authorization()
    if header:  # "Bearer <token>", or a bare token (RFC 7235, Appendix C)
        first, _, rest = header.partition(" ")
        scheme, token = (first, rest) if rest else (None, first)
    configuration = credentials.configuration
    return kopf.ConnectionInfo(
        server=credentials.server,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=settings.networking.trust_env,
    )


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.kube.close()


@kopf.on.probe(id="reconciler")
def reconciler_ready(memo: kopf.Memo, **_: Any) -> bool:
    """Reported on the liveness endpoint (``--liveness``)."""
    return "reconciler" in memo


@kopf.on.resume(GROUP, VERSION, ISVC_PLURAL)
@kopf.on.create(GROUP, VERSION, ISVC_PLURAL)
@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field="spec")
@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field=("metadata", "annotations", ANNOTATION_ROTATE_TOKENS))
async def reconcile_service(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Apply the stable Deployment, Service and PodMonitor; refresh the status."""
    reconciler: Reconciler = memo["reconciler"]
    await reconciler.reconcile(_raw(body))


@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field="status.bestConfig")
async def follow_promotion(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The tuner promoted a config: roll the stable Deployment to it (a no-op if already applied)."""
    reconciler: Reconciler = memo["reconciler"]
    await reconciler.reconcile(_raw(body))


@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field="status.bestTopology")
async def follow_topology_promotion(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The tuner promoted a topology: roll out its pools and router (a no-op if already running)."""
    reconciler: Reconciler = memo["reconciler"]
    await reconciler.reconcile(_raw(body))


@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field="status.scaling.desiredReplicas")
@kopf.on.update(GROUP, VERSION, ISVC_PLURAL, field="status.scaling.decision")
async def follow_scaling(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """The planner decided the stable replicas, or a pool's (``decision``: a new split of the same
    replicas changes it, not their sum): run them in ``scaling.mode: Auto`` (a no-op otherwise).
    Scalar fields only: Kopf keeps every watched field in its diff base annotation, and the rest of
    ``status.scaling`` is rewritten every half minute."""
    reconciler: Reconciler = memo["reconciler"]
    await reconciler.reconcile(_raw(body))


@kopf.on.event(GROUP, VERSION, ISVC_PLURAL)
def service_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED" and "reconciler" in memo:
        memo["reconciler"].forget(body.metadata.namespace, body.metadata.name)


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
@kopf.on.event("monitoring.coreos.com", "v1", "podmonitors", labels=CHILD_LABELS)
async def child_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child changed or was deleted: restore it if it drifted, refresh the parent's status."""
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.child_changed(type, _raw(body))


def _raw(body: kopf.Body) -> dict[str, Any]:
    raw: dict[str, Any] = dict(body)
    return raw
