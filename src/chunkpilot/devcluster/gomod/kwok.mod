// Build module for kwok, which simulates kubelets for fake nodes.
module chunkpilot.dev/build/kwok

go 1.26.0

require sigs.k8s.io/kwok v0.8.0
