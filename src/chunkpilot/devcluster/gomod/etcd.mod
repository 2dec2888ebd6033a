// Build module for etcd (the server's main package is the module root).
module chunkpilot.dev/build/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.16
