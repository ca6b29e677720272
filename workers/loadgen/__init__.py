"""farm's load clients, one package per protocol, measured in windows.

Shared by every client: ``contract`` (the job, the typed records a client returns, the ``LoadClient``
interface), ``clients`` (the registry, ``auto``'s choice and ``run_load``, the entry point every caller uses),
``patterns`` (closed loop, constant rate, Poisson: strategies every client shares), ``plan`` (the window plan),
``result`` (records to metrics, notes and details, once for every client), ``stats`` (pure percentile and
stability helpers), ``drivers`` (load workers in a thread or in processes).

By protocol: ``kserve`` (farm's own KServe v2 gRPC generator), ``perf_analyzer`` (NVIDIA perf_analyzer, KServe
v2 too), ``openai`` (the OpenAI streaming client for LLM servers).

This package imports nothing on its own, so ``workers.loadgen.stats`` stays importable alone: the edge benchmark
uses it inside memory-limited containers, where gRPC would cost ~15 MiB.
"""
