"""GPU calibration probe: measure the step-time curve, fit the roofline (``chunkpilot.engine.probe``).

The public surface for consumers is small: :func:`load_profile` reads a profile
written by ``chunkpilot probe``; a :class:`StepProfile` carries ``knee_tokens``,
the fitted efficiencies and ``itl_feasible_budget(itl_target_ms)``. Measuring
needs torch (the ``probe`` extra); reading a profile does not.
"""

from chunkpilot.engine.probe.fit import CostPoint, FitError, RooflineFit, fit_roofline
from chunkpilot.engine.probe.profile import (
    STEP_PROFILE_SCHEMA,
    CurvePoint,
    EfficiencyFit,
    Peaks,
    PeakSource,
    ProbeSettings,
    ProfileError,
    StepProfile,
    load_profile,
    parse_profile,
    save_profile,
)

__all__ = [
    "STEP_PROFILE_SCHEMA",
    "CostPoint",
    "CurvePoint",
    "EfficiencyFit",
    "FitError",
    "PeakSource",
    "Peaks",
    "ProbeSettings",
    "ProfileError",
    "RooflineFit",
    "StepProfile",
    "fit_roofline",
    "load_profile",
    "parse_profile",
    "save_profile",
]
