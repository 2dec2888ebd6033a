"""The Chunkpilot API (group ``chunkpilot.io``, version ``v1alpha1``) as pydantic models.

The models are the single source of truth: the CustomResourceDefinitions in
``crds/`` are generated from them (``chunkpilot crds generate``).

The names below are loaded on first use (PEP 562), so a light submodule such as
:mod:`chunkpilot.api.knobs` imports without building every pydantic model: ``kubectl
chunkpilot status`` renders a service from its JSON with the knob table alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chunkpilot.api.common import (
        CONDITION_OWNERS,
        CelRule,
        Condition,
        ConditionOwner,
        ConditionStatus,
        ConditionType,
        ManifestError,
        Measurement,
        ObjectMeta,
        format_duration,
        parse_duration,
    )
    from chunkpilot.api.inferenceservice import (
        AbortPolicy,
        Accelerator,
        AutotuneSpec,
        EngineConfig,
        EngineKind,
        EngineSpec,
        InferenceService,
        InferenceServiceSpec,
        InferenceServiceStatus,
        IntRange,
        KVConnector,
        KVTransferSpec,
        LatencyObjective,
        ModelSpec,
        NetworkPeerSpec,
        NetworkPolicySpec,
        Objective,
        PoolRole,
        PoolSpec,
        PoolStatus,
        ResourcesSpec,
        RouterPolicy,
        RouterSpec,
        RouterStatus,
        SamplerKind,
        SecretKeyRef,
        ServicePhase,
        ServiceSummary,
        ServiceTwin,
        SLOSpec,
        SLOState,
        SpeculativeMethod,
        SpeculativeSpec,
        Toleration,
        TopologyMode,
        TopologyRecommendation,
        TopologySpec,
        TopologyStatus,
        TuningBounds,
        TwinCandidate,
        TwinState,
    )
    from chunkpilot.api.names import (
        API_VERSION,
        GROUP,
        ISVC_KIND,
        ISVC_PLURAL,
        LABEL_COMPONENT,
        LABEL_CONFIG_HASH,
        LABEL_ROLE,
        LABEL_SERVICE,
        LABEL_TRACK,
        LABEL_TRIAL_NUMBER,
        TRIAL_KIND,
        TRIAL_PLURAL,
        VERSION,
    )
    from chunkpilot.api.scaling import (
        PoolScalingStatus,
        ScalingBehavior,
        ScalingMode,
        ScalingPolicy,
        ScalingProposal,
        ScalingRecommendation,
        ScalingRules,
        ScalingSpec,
        ScalingStatus,
    )
    from chunkpilot.api.tuningtrial import (
        Constraints,
        TokenMix,
        Track,
        TrialPhase,
        TrialProgress,
        TrialSummary,
        TrialTwin,
        TrialVerdict,
        TuningTrial,
        TuningTrialSpec,
        TuningTrialStatus,
        trial_labels,
        trial_name,
    )

__all__ = [
    "API_VERSION",
    "CONDITION_OWNERS",
    "GROUP",
    "ISVC_KIND",
    "ISVC_PLURAL",
    "LABEL_COMPONENT",
    "LABEL_CONFIG_HASH",
    "LABEL_ROLE",
    "LABEL_SERVICE",
    "LABEL_TRACK",
    "LABEL_TRIAL_NUMBER",
    "TRIAL_KIND",
    "TRIAL_PLURAL",
    "VERSION",
    "AbortPolicy",
    "Accelerator",
    "AutotuneSpec",
    "CelRule",
    "Condition",
    "ConditionOwner",
    "ConditionStatus",
    "ConditionType",
    "Constraints",
    "EngineConfig",
    "EngineKind",
    "EngineSpec",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "IntRange",
    "KVConnector",
    "KVTransferSpec",
    "LatencyObjective",
    "ManifestError",
    "Measurement",
    "ModelSpec",
    "NetworkPeerSpec",
    "NetworkPolicySpec",
    "ObjectMeta",
    "Objective",
    "PoolRole",
    "PoolScalingStatus",
    "PoolSpec",
    "PoolStatus",
    "ResourcesSpec",
    "RouterPolicy",
    "RouterSpec",
    "RouterStatus",
    "SLOSpec",
    "SLOState",
    "SamplerKind",
    "ScalingBehavior",
    "ScalingMode",
    "ScalingPolicy",
    "ScalingProposal",
    "ScalingRecommendation",
    "ScalingRules",
    "ScalingSpec",
    "ScalingStatus",
    "SecretKeyRef",
    "ServicePhase",
    "ServiceSummary",
    "ServiceTwin",
    "SpeculativeMethod",
    "SpeculativeSpec",
    "TokenMix",
    "Toleration",
    "TopologyMode",
    "TopologyRecommendation",
    "TopologySpec",
    "TopologyStatus",
    "Track",
    "TrialPhase",
    "TrialProgress",
    "TrialSummary",
    "TrialTwin",
    "TrialVerdict",
    "TuningBounds",
    "TuningTrial",
    "TuningTrialSpec",
    "TuningTrialStatus",
    "TwinCandidate",
    "TwinState",
    "format_duration",
    "parse_duration",
    "trial_labels",
    "trial_name",
]

#: The submodules that define the names of ``__all__``, searched in this order on first use.
_HOMES = ("names", "common", "inferenceservice", "scaling", "tuningtrial")


def __getattr__(name: str) -> Any:
    """Import an exported name's submodule when the name is first asked for."""
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(f"{__name__}.{home}")
            if name in vars(module):
                value = vars(module)[name]
                globals()[name] = value
                return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
