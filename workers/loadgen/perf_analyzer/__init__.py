"""NVIDIA perf_analyzer as a load client: ``tool`` finds, installs and launches it; ``client`` drives a job
through it (KServe v2 over gRPC, as Model Analyzer does)."""
