"""Local engine runtime: run the whole product on one machine without a kubelet or a GPU.

- :mod:`chunkpilot.localrun.podrunner` stands in for the kubelet: it runs a simulator process for
  every scheduled engine pod, reports its health back into the pod status and registers it with
  Prometheus (file-based service discovery).
- :mod:`chunkpilot.localrun.loadgen` replays a request trace against a service's Ready endpoints.
- :mod:`chunkpilot.localrun.stack` brings up control plane, Prometheus, operator and pod runner
  together.
"""
