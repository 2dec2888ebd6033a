"""The digital twin of a service: its engine's step-time model and its workload, fitted from telemetry.

``capture`` reads what the engine exports (step telemetry, request-length histograms, arrival and
prefix-cache rates) and turns it into a synthetic workload; ``fit`` fits the simulator's step-time
model to the step telemetry; ``predict`` asks the fitted simulator for capacity at SLO and latency
quantiles; ``validate`` checks the whole chain against a hidden truth.
"""
