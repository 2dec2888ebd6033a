"""The digital twin of a service: its engine's step-time model and its workload, fitted from telemetry.

``capture`` reads what the engine exports (step telemetry, request-length histograms, arrival and
prefix-cache rates) and turns it into a synthetic workload; ``fit`` fits the simulator's step-time
model to the step telemetry; ``predict`` asks the fitted simulator for capacity at SLO and latency
quantiles; ``search`` ranks configurations on it; ``online`` runs it in the tuning loop. Its checks
against a hidden truth and a real engine are benchmarks (:mod:`chunkpilot.bench`).
"""

from chunkpilot.tuner.twin.capture import CaptureError, WorkloadWindow, synthesize, window_between
from chunkpilot.tuner.twin.fit import Scales, TwinFit, TwinFitError, fit_steps
from chunkpilot.tuner.twin.predict import LatencyQuantiles, Twin

__all__ = [
    "CaptureError",
    "LatencyQuantiles",
    "Scales",
    "Twin",
    "TwinFit",
    "TwinFitError",
    "WorkloadWindow",
    "fit_steps",
    "synthesize",
    "window_between",
]
