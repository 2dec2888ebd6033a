"""High availability through Kopf peering: only the highest-priority live replica acts.

Kopf peering is not leader election: replicas of *equal* priority all pause.
So every replica gets a distinct priority derived from its start time, higher
for older replicas: the oldest live replica acts and the others wait; when it
exits (or stops renewing its keep-alive for ``lifetime`` seconds) the next
oldest takes over. A rolling update therefore hands over to a new pod only when
the old one is gone.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Final

from chunkpilot.operator.kube import KubeClient, resource_path

PEERING_API_VERSION: Final = "kopf.dev/v1"
#: Upper bound of the start-time clock in milliseconds (year 2286); keeps priorities below 2**53.
_CLOCK_CEILING_MS: Final = 10**13


def start_time_priority(now_s: float | None = None, jitter: int | None = None) -> int:
    """A peering priority that is higher for replicas started earlier, unique with high probability."""
    now_ms = int((time.time() if now_s is None else now_s) * 1000)
    tie_breaker = random.randrange(1000) if jitter is None else jitter
    return (_CLOCK_CEILING_MS - now_ms) * 1000 + tie_breaker


def check_peering_settings(*, expected_replicas: int, standalone: bool, mandatory: bool) -> str | None:
    """Why this replica must not run, or None. Several replicas need mandatory peering."""
    if expected_replicas <= 1:
        return None
    if standalone or not mandatory:
        return (
            f"refusing to run: {expected_replicas} operator replicas are expected"
            " (CHUNKPILOT_OPERATOR_REPLICAS)"
            " but peering is not enabled, so every replica would act on every object; start it with"
            " --peering NAME (the Helm chart does this and creates the peering object when replicaCount > 1)"
        )
    return None


async def missing_peering_objects(
    kube: KubeClient, name: str, clusterwide: bool, namespaces: Sequence[str]
) -> str | None:
    """A message naming the absent peering objects, or None when all exist."""
    if clusterwide:
        paths = [
            ("ClusterKopfPeering", resource_path(PEERING_API_VERSION, "clusterkopfpeerings", None, name))
        ]
    else:
        paths = [
            (f"KopfPeering in namespace {ns}", resource_path(PEERING_API_VERSION, "kopfpeerings", ns, name))
            for ns in namespaces
        ]
    missing = [what for what, path in paths if await kube.get(path) is None]
    if not missing:
        return None
    return (
        f"peering {name!r} is mandatory but its object is missing ({', '.join(missing)}): create it"
        " (the Helm chart does when replicaCount > 1) or run a single replica with --standalone"
    )
