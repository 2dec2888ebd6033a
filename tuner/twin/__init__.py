"""The digital twin of a service: its engine's step-time model and its workload, fitted from telemetry.

``capture`` reads what the engine exports (step telemetry, request-length histograms, arrival and
prefix-cache rates) and turns it into a synthetic workload; ``fit`` fits the simulator's step-time
model to the step telemetry; ``predict`` asks the fitted simulator for capacity at SLO and latency
quantiles; ``validate`` checks the whole chain against a hidden truth.
"""

from chunkpilot.tuner.twin.capture import CaptureError, WorkloadWindow, synthesize, window_between
from chunkpilot.tuner.twin.fit import Scales, TwinFit, TwinFitError, fit_steps
from chunkpilot.tuner.twin.predict import LatencyQuantiles, Twin
from chunkpilot.tuner.twin.truth import Perturbation, write_truth
from chunkpilot.tuner.twin.validate import ValidationReport, validate_twin

__all__ = [
    "CaptureError",
    "LatencyQuantiles",
    "Perturbation",
    "Scales",
    "Twin",
    "TwinFit",
    "TwinFitError",
    "ValidationReport",
    "WorkloadWindow",
    "fit_steps",
    "synthesize",
    "validate_twin",
    "window_between",
    "write_truth",
]
