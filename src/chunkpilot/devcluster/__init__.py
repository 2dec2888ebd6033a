"""A real local Kubernetes control plane and Prometheus for development and tests.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK (fake GPU nodes) run as
local processes on loopback; the binaries are located or built from Go modules and cached under
``~/.cache/chunkpilot``. Entry points: :mod:`chunkpilot.devcluster.binaries`,
:mod:`chunkpilot.devcluster.controlplane`, :mod:`chunkpilot.devcluster.prometheus`,
the ``chunkpilot cluster`` command and the pytest plugin :mod:`chunkpilot.devcluster.fixtures`.
"""
