"""farm's own KServe v2 gRPC load client: ``client`` (``FarmClient``: plans the load workers and gathers their
reports), ``worker`` (one grpc.aio event loop), ``messages`` (worker <-> coordinator), ``request`` (the ModelInfer
request built once)."""
