"""``python3 -m workers.loadgen.perf_analyzer [--install]``: install (idempotent) and check NVIDIA perf_analyzer."""
from workers.loadgen.perf_analyzer.tool import main

main()
