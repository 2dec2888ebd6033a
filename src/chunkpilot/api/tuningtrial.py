"""The ``TuningTrial`` custom resource: one autotuner trial, its measurements and verdict.

Trials are owned by their InferenceService, named ``<service>-trial-<n>`` and labelled
``chunkpilot.io/service`` and ``chunkpilot.io/trial-number``; together they are the
durable history the tuner rebuilds its study from.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field

from chunkpilot.api.common import (
    ApiModel,
    CelRule,
    Duration,
    Measurement,
    ObjectMeta,
    Resource,
    StatusModel,
)
from chunkpilot.api.inferenceservice import EngineConfig, TopologyMode, TopologySpec
from chunkpilot.api.names import LABEL_SERVICE, LABEL_TRIAL_NUMBER


class Track(StrEnum):
    """Which Deployment of the service runs a config."""

    CANARY = "canary"
    STABLE = "stable"


class TrialPhase(StrEnum):
    """Lifecycle of a trial."""

    PENDING = "Pending"
    ROLLING_OUT = "RollingOut"
    MEASURING = "Measuring"
    PRUNED = "Pruned"
    FAILED = "Failed"
    ROLLED_BACK = "RolledBack"
    PROMOTED = "Promoted"

    @property
    def finished(self) -> bool:
        """True once the trial will not change any more."""
        return self not in (TrialPhase.PENDING, TrialPhase.ROLLING_OUT, TrialPhase.MEASURING)


class TrialVerdict(StrEnum):
    """Outcome of a finished trial."""

    PROMOTED = "Promoted"
    DISCARDED = "Discarded"
    PRUNED = "Pruned"
    ABORTED = "Aborted"


class TrialSummary(StatusModel):
    """Preformatted strings for the printer columns."""

    itl: str | None = Field(default=None, max_length=64, description="Canary ITL vs target, e.g. 43/50ms.")
    ttft: str | None = Field(
        default=None, max_length=64, description="Canary TTFT vs target, e.g. 812/2000ms."
    )


class Constraints(StatusModel):
    """Constraint values, measured minus target in ms; <= 0 means the SLO was met."""

    itl: float | None = Field(default=None, description="Canary ITL quantile minus the ITL target, ms.")
    ttft: float | None = Field(default=None, description="Canary TTFT quantile minus the TTFT target, ms.")


def trial_name(service: str, number: int) -> str:
    """Name of trial ``number`` of ``service``."""
    return f"{service}-trial-{number}"


def trial_labels(service: str, number: int) -> dict[str, str]:
    """Labels every trial of ``service`` carries."""
    return {LABEL_SERVICE: service, LABEL_TRIAL_NUMBER: str(number)}


class TokenMix(ApiModel):
    """The tokens per request a trial's warm start was sized for (an unset mean: the default)."""

    prompt: float | None = Field(default=None, ge=0, description="Mean prompt tokens per request.")
    output: float | None = Field(default=None, ge=0, description="Mean output tokens per request.")
    note: str = Field(
        max_length=512,
        description="Where the values come from, e.g. '8000 prompt + 364 output tokens per request "
        "(measured on stable over 2m)'.",
    )


def _colocated(o: TuningTrialSpec) -> bool:
    return o.topology is not None and o.topology.mode == TopologyMode.COLOCATED


class TuningTrialSpec(ApiModel):
    """What a trial tries: a config, against a baseline, on a track, for a window."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!has(self.replicas) || (has(self.topology) && self.topology.mode == 'colocated')",
            message=(
                "spec.replicas is set only on a trial of the colocated topology: set spec.topology.mode"
                " colocated, or remove spec.replicas"
            ),
            field_path=".replicas",
            check=lambda o: o.replicas is None or _colocated(o),
        ),
        CelRule(
            rule="!has(self.topology) || self.topology.mode != 'colocated' || has(self.replicas)",
            message=(
                "a trial of the colocated topology (spec.topology.mode colocated) needs spec.replicas:"
                " the colocated replicas it is judged for"
            ),
            field_path=".topology",
            check=lambda o: not _colocated(o) or o.replicas is not None,
        ),
    )

    service_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="The InferenceService this trial tunes (same namespace).",
    )
    number: int = Field(ge=0, le=1_000_000, description="Trial number within the service's study.")
    params: EngineConfig = Field(description="The knobs under trial.")
    baseline_config_hash: str | None = Field(
        default=None,
        max_length=16,
        pattern=r"^[0-9a-f]+$",
        description="config_hash of the stable config the trial is compared against.",
    )
    track: Track = Field(default=Track.CANARY, description="canary (extra pods) or stable (in-place).")
    window: Duration = Field(default="5m", description="Measurement window.")
    study_params: dict[str, int] | None = Field(
        default=None,
        max_length=32,
        description="The sampler's raw parameters (the exact study history where repairs changed params).",
    )
    token_mix: TokenMix | None = Field(
        default=None,
        description="The token mix the round's warm start was sized for (the round's first trial fixes it).",
    )
    topology: TopologySpec | None = Field(
        default=None,
        description=(
            "Set on a topology trial (autotune.allowTopologyChange): the prefill and decode pools (replicas,"
            " the prefill pool's maxNumBatchedTokens, the decode pool's maxNumSeqs) rolled out as a canary"
            " topology behind a canary router; params is then the stable config the pools start from. Mode"
            " colocated: a service that runs prefill/decode pools tries colocated replicas of params again"
            " (spec.replicas), behind a canary router."
        ),
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "Set on a trial of the colocated topology (topology.mode colocated): the colocated replicas"
            " it is judged for (each canary replica carries what one of them would)."
        ),
    )

    @property
    def is_topology(self) -> bool:
        """Whether this trial tries a topology (pools, or colocated again) rather than a colocated config."""
        return self.topology is not None

    @property
    def tries_colocated(self) -> bool:
        """Whether this topology trial tries the colocated topology again (the service runs pools)."""
        return _colocated(self)


class TrialProgress(StatusModel):
    """Where a running trial stands: the tuner's timers and marks, one typed field each.

    Trials written before this block existed kept these values in ``chunkpilot.io/*``
    annotations; the tuner reads those when a field is absent here.
    """

    ready_at: datetime | None = Field(default=None, description="When every canary replica was first Ready.")
    measure_from: datetime | None = Field(
        default=None,
        description="Start of the measurement window (after warm-up; moved after a metrics gap).",
    )
    metrics_gap_since: datetime | None = Field(
        default=None, description="Since when Prometheus has not answered during the measurement."
    )
    live_adjusted: bool | None = Field(
        default=None,
        description="True: the limits were set on the running canary pods; false: that failed "
        "(see liveAdjustError).",
    )
    live_adjust_error: str | None = Field(
        default=None, max_length=1024, description="Why live adjustment failed (the trial then rolled out)."
    )
    canary_config_hash: str | None = Field(
        default=None,
        max_length=16,
        pattern=r"^[0-9a-f]+$",
        description="config_hash of the pods serving the trial (their start-up config's when live-adjusted).",
    )
    stable_objective: float | None = Field(
        default=None, description="Objective of the stable track measured in the trial's window."
    )
    promotion_applied: bool | None = Field(
        default=None, description="True once the operator runs the promoted config on the stable track."
    )


class TrialTwin(StatusModel):
    """What the service's digital twin predicted for the trial, and how the canary compared.

    Capacities are at SLO: the highest request rate one replica serves within both SLO quantiles.
    ``capacity`` and ``incumbentCapacity`` are in the objective's unit (``capacityUnit``).
    """

    capacity_req_s: float | None = Field(
        default=None, ge=0, description="Predicted capacity at SLO of the trial's config, req/s per replica."
    )
    capacity: float | None = Field(
        default=None, ge=0, description="Predicted capacity in the objective's unit, per GPU."
    )
    robust_capacity: float | None = Field(
        default=None,
        ge=0,
        description="Predicted capacity under the twin's step-time uncertainty at the config's budget "
        "(the mean over the fit, one standard error slower and one faster, at most the capacity), same "
        "unit: a promotion on the prediction needs it above the stable config's.",
    )
    incumbent_capacity: float | None = Field(
        default=None, ge=0, description="Predicted capacity of the stable config, same unit."
    )
    capacity_unit: str | None = Field(
        default=None, max_length=32, description="req/s/GPU (goodput) or tok/s/GPU (throughput)."
    )
    fit_error: float | None = Field(
        default=None,
        description="The twin's error on the stable track (relative, beyond the measurement's sampling "
        "band, the larger of ITL and TTFT) at the live load: in the trial's own window once judged, "
        "when the trial was chosen before.",
    )
    error: float | None = Field(
        default=None,
        description="The twin's error on this canary (relative, beyond the measurement's sampling band, "
        "the larger of ITL and TTFT) at the canary's live load.",
    )
    tolerance: float | None = Field(
        default=None, ge=0, description="Largest error at which the prediction counts as confirmed."
    )
    rate_req_s: float | None = Field(
        default=None, ge=0, description="Live requests/s per canary replica the prediction was made at."
    )
    predicted_itl_ms: float | None = Field(
        default=None, ge=0, description="Predicted canary ITL quantile, ms."
    )
    predicted_ttft_ms: float | None = Field(
        default=None, ge=0, description="Predicted canary TTFT quantile, ms."
    )
    measured_itl_ms: float | None = Field(
        default=None, ge=0, description="Measured canary ITL quantile (fine histogram), ms."
    )
    measured_ttft_ms: float | None = Field(
        default=None, ge=0, description="Measured canary TTFT quantile (fine histogram), ms."
    )
    rank: int | None = Field(default=None, ge=1, description="The config's place in the twin's ranking.")
    message: str | None = Field(
        default=None,
        max_length=1024,
        description="Why a prediction or the canary's check is missing, where one is (twin unavailable, "
        "chosen by the sampler, not checked).",
    )


class TuningTrialStatus(StatusModel):
    """Progress, measurements and verdict of a trial."""

    phase: TrialPhase | None = Field(
        default=None,
        description="Pending, RollingOut, Measuring, Pruned, Failed, RolledBack or Promoted.",
    )
    params_summary: str | None = Field(
        default=None, max_length=256, description="The params in short form, e.g. budget=3072 seqs=256."
    )
    canary: Measurement | None = Field(default=None, description="Measurement of the trial config.")
    stable: Measurement | None = Field(default=None, description="Baseline measured in the same window.")
    prefill: Measurement | None = Field(
        default=None, description="A topology trial's prefill pool in the window (its TTFT: prompt + queue)."
    )
    decode: Measurement | None = Field(
        default=None, description="A topology trial's decode pool in the window (its ITL is the topology's)."
    )
    constraints: Constraints | None = Field(default=None, description="Measured minus target, per SLO.")
    objective: float | None = Field(default=None, description="Objective value (throughput or goodput).")
    verdict: TrialVerdict | None = Field(default=None, description="Promoted, Discarded, Pruned or Aborted.")
    reason: str | None = Field(default=None, max_length=4096, description="Why the trial ended as it did.")
    started_at: datetime | None = Field(default=None, description="When the rollout started (RFC 3339).")
    finished_at: datetime | None = Field(default=None, description="When the verdict was reached (RFC 3339).")
    summary: TrialSummary | None = Field(default=None, description="Strings shown by kubectl get.")
    progress: TrialProgress | None = Field(default=None, description="Timers and marks of the tuner.")
    twin: TrialTwin | None = Field(
        default=None, description="The twin's predicted capacity and error (absent: no twin)."
    )


class TuningTrial(Resource):
    """One autotuner trial of an InferenceService."""

    api_version: Literal["chunkpilot.io/v1alpha1"] = Field(
        default="chunkpilot.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["TuningTrial"] = "TuningTrial"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TuningTrialSpec
    status: TuningTrialStatus | None = None
