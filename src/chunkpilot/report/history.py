"""Read a service's trial history from the cluster and flatten it into rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from chunkpilot.api import (
    GROUP,
    ISVC_PLURAL,
    LABEL_SERVICE,
    TRIAL_PLURAL,
    VERSION,
    InferenceService,
    TuningTrial,
)


@dataclass(frozen=True)
class TrialRow:
    """One finished or running trial, flattened for tables and plots."""

    number: int
    name: str
    budget: int
    max_num_seqs: int
    long_prefill_threshold: int
    phase: str
    verdict: str
    itl_ms: float | None
    ttft_ms: float | None
    stable_itl_ms: float | None
    stable_ttft_ms: float | None
    throughput_tok_s: float | None
    request_rate: float | None
    samples: int | None
    reason: str
    #: Short human summary of the knobs under trial (:func:`chunkpilot.api.knobs.summary`).
    params: str
    #: The twin's predicted capacity at SLO of the trial's config (requests/s per replica, and in the
    #: objective's unit per GPU) and its error on the canary; None without a twin.
    capacity_req_s: float | None = None
    capacity: float | None = None
    capacity_unit: str = ""
    twin_error: float | None = None


def trial_rows(trials: list[TuningTrial]) -> list[TrialRow]:
    """Flatten trials into rows ordered by trial number."""
    rows = []
    for trial in sorted(trials, key=lambda t: t.spec.number):
        status = trial.status
        canary = status.canary if status else None
        stable = status.stable if status else None
        params = trial.spec.params
        twin = status.twin if status else None
        rows.append(
            TrialRow(
                number=trial.spec.number,
                name=trial.metadata.name or f"trial-{trial.spec.number}",
                budget=params.max_num_batched_tokens,
                max_num_seqs=params.max_num_seqs,
                long_prefill_threshold=params.long_prefill_token_threshold,
                phase=str(status.phase) if status and status.phase else "Pending",
                verdict=str(status.verdict) if status and status.verdict else "",
                itl_ms=canary.itl_ms if canary else None,
                ttft_ms=canary.ttft_ms if canary else None,
                stable_itl_ms=stable.itl_ms if stable else None,
                stable_ttft_ms=stable.ttft_ms if stable else None,
                throughput_tok_s=canary.throughput_tok_s if canary else None,
                request_rate=canary.request_rate if canary else None,
                samples=canary.samples if canary else None,
                reason=(status.reason or "") if status else "",
                params=params.summary(),
                capacity_req_s=twin.capacity_req_s if twin else None,
                capacity=twin.capacity if twin else None,
                capacity_unit=(twin.capacity_unit or "") if twin else "",
                twin_error=twin.error if twin else None,
            )
        )
    return rows


def load_history(api_client: Any, namespace: str, name: str) -> tuple[InferenceService, list[TuningTrial]]:
    """Fetch an InferenceService and its TuningTrials through the Kubernetes API."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    raw = cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, namespace, ISVC_PLURAL, name)
    )
    service = InferenceService.from_manifest(raw)
    listed = cast(
        dict[str, Any],
        custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, TRIAL_PLURAL, label_selector=f"{LABEL_SERVICE}={name}"
        ),
    )
    trials = [TuningTrial.from_manifest(item) for item in listed.get("items", [])]
    return service, trials
