"""A launched server that dies: the runner keeps the first Python exception line it printed (a chained traceback's
root cause, e.g. vLLM's engine core refusing a model before its API server's "Engine core initialization failed"),
which a long traceback pushes out of the tail of its log."""
from __future__ import annotations

import sys
import time

from workers.runners.process import EXCEPTION_LINE, ServerProcess

SCRIPT = r"""
import sys
print("(EngineCore pid=7) INFO loading", file=sys.stderr)
print("(EngineCore pid=7) ValueError: No valid attention backend found for cpu: [head_size not supported]",
      file=sys.stderr)
for k in range(40):
    print(f'  File "x.py", line {k}, in f', file=sys.stderr)
print("RuntimeError: Engine core initialization failed. See root cause above.", file=sys.stderr)
sys.exit(1)
"""


def test_the_first_exception_line_is_kept_past_a_long_traceback() -> None:
    with ServerProcess([sys.executable, "-c", SCRIPT]) as server:
        deadline = time.monotonic() + 30
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the reader thread drains the pipe
        assert server.first_error == ("ValueError: No valid attention backend found for cpu: "
                                      "[head_size not supported]")
        assert "head_size" not in server.tail() and "Engine core initialization failed" in server.tail()


def test_only_an_exceptions_own_line_matches() -> None:
    assert EXCEPTION_LINE.search("torch.OutOfMemoryError: no memory") is not None
    for line in ('  File "x.py", line 3, in f', "INFO all good, no ValueError: here", "Traceback (most recent call)"):
        assert EXCEPTION_LINE.search(line) is None, line
