"""CPU lists as the kernel writes them (``0-3,6``): the one parser and writer, used by edge profiles'
cpusets, core leases and the placement columns."""
from __future__ import annotations

import re
from collections.abc import Iterable

_CPU_LIST_RE = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def parse_cpu_list(text: str) -> list[int]:
    """The cores of a CPU list such as ``0-3,6`` (sorted, no duplicates; blanks around items ignored).
    ValueError when ``text`` is not a CPU list or a range runs backwards (``3-1``)."""
    compact = text.replace(" ", "")
    if not _CPU_LIST_RE.fullmatch(compact):
        raise ValueError(f"cpuset {text!r} is not a CPU list; use e.g. 0 or 0-1 or 0,2")
    cores: set[int] = set()
    for part in compact.split(","):
        lo, _, hi = part.partition("-")
        if int(hi or lo) < int(lo):
            raise ValueError(f"cpuset {text!r} has the range {part} running backwards; write it low-high")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cores)


def cpu_list(cores: Iterable[int]) -> str:
    """Cores as the kernel writes a CPU list: ``0-3,6``."""
    out: list[str] = []
    run: list[int] = []
    for c in sorted(set(cores)):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)
