"""Live progress of a request's jobs: each job's headline as it finishes, above a spinner saying what the job in
hand is doing (``farm.hooks.job_step``, raised by workers) and a progress bar with an ETA from measured job times.

Used by embedded ``farm submit`` / ``farm resume`` (steps from this process's worker) and by ``--wait`` on a
cluster (headlines as results land; the spinner shows the job counts). Workers never import this module: they
raise ``job_step`` and ``LiveRun`` registers its handler for the duration of the run.
"""
from __future__ import annotations

import statistics
import time
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.spinner import Spinner
from rich.text import Text

from farm.cli.views import err_console, headline
from farm.hooks import job_step
from farm.readers.rows import ResultRow


def eta_text(durations: list[float], remaining: int, parallel: int = 1) -> str:
    """The time left: the median measured job time x the jobs left / the jobs running at once (``ETA 1:05``);
    ``ETA ?`` before any job has finished, empty when none is left."""
    if remaining <= 0:
        return ""
    if not durations:
        return "ETA ?"
    left = statistics.median(durations) * remaining / max(1, parallel)
    return f"ETA {int(left // 60)}:{int(left % 60):02d}"


class LiveRun:
    """The live display of one run (a context manager; ``quiet``: nothing is shown). ``started`` names the job in
    hand, ``step`` (also the ``job_step`` handler) says what it does, ``finished`` prints a job's headline and
    moves the bar; the ETA uses the measured times of the jobs finished so far."""

    def __init__(self, total: int, quiet: bool = False, console: Console | None = None) -> None:
        self.console = console or err_console
        self.quiet = quiet
        self.durations: list[float] = []
        self.parallel = 1
        self.job = ""
        self.started_at = time.monotonic()
        self.spinner = Spinner("dots", text="starting", style="cyan")
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), console=self.console)
        self.task = self.progress.add_task("profiling", total=total, eta="ETA ?")
        self.live = Live(Group(self.spinner, self.progress), console=self.console, transient=True,
                         refresh_per_second=8)

    def __enter__(self) -> LiveRun:
        if not self.quiet:
            self.live.start()
            job_step.register(self.step)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.quiet:
            return
        job_step.unregister(self.step)
        self.live.stop()
        task = self.progress.tasks[0]
        if exc_type is None:
            self.console.print(f"{int(task.completed)} job(s) in {time.monotonic() - self.started_at:.0f} s",
                               highlight=False)

    def started(self, label: str) -> None:
        """The job in hand is ``label`` (e.g. ``job 2/4 cpu onnxruntime 1x4``)."""
        self.job = label
        self.step("claiming")

    def step(self, what: str) -> None:
        """Show what the job in hand is doing now, beside the spinner."""
        text = f"{self.job}: {what}" if self.job else what
        width = max(20, self.console.width - 4)
        self.spinner.update(text=Text(text if len(text) <= width else text[:width - 1] + "…"))

    def finished(self, row: ResultRow, seconds: float | None) -> None:
        """A job finished: print its headline above the bar, count it and update the ETA with its time."""
        if seconds is not None:
            self.durations.append(seconds)
        if not self.quiet:
            self.console.print(headline(row), highlight=False, soft_wrap=False, overflow="fold")
        self.progress.advance(self.task)
        self._eta()

    def set_total(self, total: int, parallel: int = 1) -> None:
        """The run now has ``total`` jobs (a quick search adds steps) of which ``parallel`` run at once."""
        self.parallel = max(1, parallel)
        self.progress.update(self.task, total=total)
        self._eta()

    def _eta(self) -> None:
        task = self.progress.tasks[0]
        remaining = int((task.total or 0) - task.completed)
        self.progress.update(self.task, eta=eta_text(self.durations, remaining, self.parallel))
