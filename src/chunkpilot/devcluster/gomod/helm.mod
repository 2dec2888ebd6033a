// Build module for the helm command line.
module chunkpilot.dev/build/helm

go 1.26.0

require helm.sh/helm/v3 v3.22.0
