"""``spec.scaling`` and ``status.scaling``: how many stable replicas a service runs, and who decides.

``Off`` (the default) runs ``spec.replicas``, which anyone may set: ``kubectl scale``, a user's own
HorizontalPodAutoscaler or KEDA ScaledObject through the InferenceService's scale subresource.
``Advise`` computes the replicas the twin says the live load needs and publishes them (status,
Events, gauges) without acting. ``Auto`` runs them: the tuner is the one writer of the decision
(``status.scaling.desiredReplicas``) and the operator renders it, so a manifest re-applied with its
own ``spec.replicas`` never fights it (``spec.replicas`` is the count before the first decision and
whenever the planner has none). ``behavior`` has the shape of the HorizontalPodAutoscaler's.
A disaggregated service's pools are decided each on its own (``status.scaling.pools``), within
``minReplicas`` and ``maxReplicas`` per pool.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field

from chunkpilot.api.common import ApiModel, CelRule, StatusModel


class ScalingMode(StrEnum):
    """Who sets the stable replicas."""

    OFF = "Off"  # spec.replicas, as set by hand, kubectl scale or the user's own autoscaler
    ADVISE = "Advise"  # the planner computes and publishes, and acts on nothing
    AUTO = "Auto"  # the planner's decision runs


class ScalingPolicy(ApiModel):
    """How far one step may move the replicas within ``periodSeconds`` (the HPA's HPAScalingPolicy)."""

    type: Literal["Pods", "Percent"] = Field(
        description="Pods: a number of replicas; Percent: of the current."
    )
    value: int = Field(ge=1, le=1000, description="The number of replicas, or the percentage.")
    period_seconds: int = Field(
        ge=1, le=1800, description="The window the policy holds over (the changes within it add up)."
    )


class ScalingRules(ApiModel):
    """One direction's behaviour (the HPA's HPAScalingRules)."""

    stabilization_window_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Recommendations of this long are considered: scaling down goes no lower than the highest of"
            " them (scaling up no higher than the lowest). Unset: 0 up, 300 down."
        ),
    )
    policies: list[ScalingPolicy] = Field(
        default_factory=list, max_length=10, description="Step limits (none: one step to the decision)."
    )
    select_policy: Literal["Max", "Min", "Disabled"] = Field(
        default="Max",
        description=(
            "Max: the policy allowing the largest change; Min: the smallest; Disabled: never this way."
        ),
    )


class ScalingBehavior(ApiModel):
    """Scale-up and scale-down behaviour."""

    scale_up: ScalingRules | None = Field(default=None, description="Up: at once to the decision by default.")
    scale_down: ScalingRules | None = Field(
        default=None, description="Down: after a 300 s stabilization window by default."
    )


class ScalingSpec(ApiModel):
    """How the stable replicas are decided."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            rule="!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            message=(
                "scaling.minReplicas must be <= scaling.maxReplicas: lower minReplicas or raise maxReplicas"
            ),
            field_path=".minReplicas",
            check=lambda o: o.max_replicas is None or o.min_replicas <= o.max_replicas,
        ),
        CelRule(
            rule="self.mode == 'Off' || has(self.maxReplicas)",
            message=(
                "scaling.maxReplicas is required when scaling.mode is Advise or Auto: set the most"
                " replicas (GPUs x tensor parallel) the planner may ask for"
            ),
            field_path=".maxReplicas",
            check=lambda o: o.mode == ScalingMode.OFF or o.max_replicas is not None,
        ),
    )

    mode: ScalingMode = Field(
        default=ScalingMode.OFF,
        description=(
            "Off: spec.replicas (kubectl scale, or your own HPA/KEDA on the scale subresource); Advise:"
            " the planner publishes the replicas the live load needs and acts on nothing; Auto: it runs"
            " them (spec.replicas is then the count until its first decision)."
        ),
    )
    min_replicas: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="The fewest stable replicas it decides (a disaggregated service: per pool).",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=(
            "The most stable replicas it decides (a disaggregated service: per pool); required unless Off."
        ),
    )
    headroom: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "Capacity kept beyond the live request rate, as a share of it, on top of the twin's measured"
            " error: 0.1 plans for a rate 10% above the live one."
        ),
    )
    behavior: ScalingBehavior | None = Field(
        default=None, description="Stabilization windows and step limits, as a HorizontalPodAutoscaler's."
    )

    @property
    def acts(self) -> bool:
        """The planner's decision runs (``Auto``)."""
        return self.mode == ScalingMode.AUTO

    @property
    def plans(self) -> bool:
        """The planner computes at all (``Advise`` or ``Auto``)."""
        return self.mode != ScalingMode.OFF


class ScalingRecommendation(StatusModel):
    """One past recommendation (the stabilization windows look back over these)."""

    time: datetime = Field(description="When it was made.")
    replicas: int = Field(ge=0, description="The replicas it asked for.")
    rate_req_s: float | None = Field(default=None, ge=0, description="The live request rate then, req/s.")


class PoolScalingStatus(StatusModel):
    """One pool of a disaggregated service: what the planner decided for it and why (tuner-owned)."""

    role: Literal["prefill", "decode"] = Field(description="The pool.")
    desired_replicas: int | None = Field(
        default=None, ge=0, description="The pool's replicas it asks for (Auto: the ones that run)."
    )
    reason: str = Field(default="", max_length=1024, description="Why, in words.")
    capacity_per_replica_req_s: float | None = Field(
        default=None,
        ge=0,
        description="The twin's capacity at SLO of one replica of the pool, the other pool ample, req/s.",
    )
    capacity_low_req_s: float | None = Field(
        default=None, ge=0, description="That capacity less the twin's error (the one planned with), req/s."
    )
    capacity_cap_req_s: float | None = Field(
        default=None,
        ge=0,
        description=(
            "What the live pool showed one replica serves, where that is below the twin's capacity"
            " (prefill: lowered by a missed TTFT, decode: by a missed ITL); kept until the twin refits."
        ),
    )
    capacity_cap_fit: str | None = Field(
        default=None, max_length=128, description="The twin fit the cap was learnt against."
    )
    last_scale_time: datetime | None = Field(
        default=None, description="When the pool's decision last changed."
    )
    recommendations: list[ScalingRecommendation] = Field(
        default_factory=list, max_length=64, description="Recent recommendations for the pool, newest last."
    )


class ScalingProposal(StatusModel):
    """The other topology, where the twin says it serves the live rate on far fewer replicas
    (tuner-owned; advice: nothing acts on it)."""

    topology: Literal["colocated", "disaggregated"] = Field(description="The topology proposed.")
    replicas: int = Field(ge=1, description="The replicas it would take at the rate planned for.")
    prefill_replicas: int | None = Field(default=None, ge=1, description="Of them, the prefill pool's.")
    decode_replicas: int | None = Field(default=None, ge=1, description="Of them, the decode pool's.")
    current_replicas: int = Field(ge=1, description="What the running topology takes at the same rate.")
    message: str = Field(default="", max_length=1024, description="Why, in words, and how to switch.")


class ScalingStatus(StatusModel):
    """What the planner decided and why (tuner-owned)."""

    mode: ScalingMode | None = Field(default=None, description="The mode it was computed in.")
    topology: Literal["colocated", "disaggregated"] | None = Field(
        default=None,
        description=(
            "The topology it was computed for: a decision for the other one is not run, and the planner"
            " starts afresh when the service changes topology."
        ),
    )
    desired_replicas: int | None = Field(
        default=None, ge=0, description="The stable replicas it asks for (Auto: the ones that run)."
    )
    decision: str | None = Field(
        default=None,
        max_length=64,
        description=(
            "The decision in short, as the operator follows it: `3`, or a disaggregated service's"
            " `prefill 2 + decode 1`."
        ),
    )
    reason: str = Field(default="", max_length=1024, description="Why, in words.")
    live_rate_req_s: float | None = Field(
        default=None,
        ge=0,
        description=(
            "The live request rate over the service, req/s: the rate requests arrived at (completions "
            "plus the growth of those running or waiting in the engines, where the engine exports both)."
        ),
    )
    planned_rate_req_s: float | None = Field(
        default=None,
        ge=0,
        description="The rate planned for: live, or its trend ahead, plus headroom, req/s.",
    )
    capacity_per_replica_req_s: float | None = Field(
        default=None, ge=0, description="The twin's capacity at SLO of one replica, req/s."
    )
    capacity_low_req_s: float | None = Field(
        default=None, ge=0, description="That capacity less the twin's error (the one planned with), req/s."
    )
    capacity_high_req_s: float | None = Field(
        default=None, ge=0, description="That capacity plus the twin's error, req/s."
    )
    predicted_itl_ms: float | None = Field(
        default=None, ge=0, description="The twin's ITL quantile at the desired replicas."
    )
    predicted_ttft_ms: float | None = Field(
        default=None, ge=0, description="The twin's TTFT quantile at the desired replicas."
    )
    startup_seconds: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Scheduled to Ready of the service's engine pods, the longest of the newest seen (how far"
            " ahead a rising rate is planned)."
        ),
    )
    last_scale_time: datetime | None = Field(default=None, description="When the decision last changed.")
    capacity_cap_req_s: float | None = Field(
        default=None,
        ge=0,
        description=(
            "What the live service showed one replica serves, where that is below the twin's capacity:"
            " lowered by a missed SLO, raised by SLOs met at a higher load; kept until the twin refits."
        ),
    )
    capacity_cap_fit: str | None = Field(
        default=None, max_length=128, description="The twin fit the cap was learnt against."
    )
    recommendations: list[ScalingRecommendation] = Field(
        default_factory=list, max_length=64, description="Recent recommendations, newest last."
    )
    proposal: ScalingProposal | None = Field(
        default=None,
        description=(
            "The other topology (colocated or prefill/decode pools), when the twin says it serves the"
            " rate planned for on at most three quarters of the replicas the running one takes."
        ),
    )
    pools: list[PoolScalingStatus] = Field(
        default_factory=list,
        max_length=2,
        description=(
            "A disaggregated service's pools, each sized on its own (desiredReplicas is then their sum)."
        ),
    )

    def summary(self) -> str | None:
        """The decision in short: ``3``, or ``prefill 2 + decode 1`` (None: none yet)."""
        if self.pools:
            return " + ".join(f"{p.role} {p.desired_replicas}" for p in self.pools)
        return str(self.desired_replicas) if self.desired_replicas is not None else None

    def as_patch(self) -> dict[str, object]:
        """The status as a JSON merge patch of the last one written, its ``decision`` the
        :meth:`summary` of what it decides: every field it leaves unset is null, so a merge removes
        what an earlier decision wrote there instead of keeping it."""
        data: dict[str, object] = {**self.to_k8s(), "decision": self.summary()}
        for name, info in type(self).model_fields.items():
            data.setdefault(info.alias or name, None)
        return data

    def decided_for(self, disaggregated: bool) -> bool:
        """Whether the decision was computed for the topology the service runs (one that records no
        topology, written by an earlier version, is taken to be)."""
        return self.topology is None or (self.topology == "disaggregated") == disaggregated

    def pool(self, role: str) -> PoolScalingStatus | None:
        """The decision for the pool of ``role`` (None: none yet)."""
        return next((p for p in self.pools if p.role == role), None)
