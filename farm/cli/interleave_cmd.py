"""``farm compare --interleaved OLD NEW``: two models measured alternately in short blocks on the same cores
(``workers.interleave``), judged on their per-pair ratios (``farm.verdict``), stopped as soon as the verdict is
conclusive or the time budget is spent. An in-process engine's models load in this process; an LLM engine's are
each served by the engine's own server on the lease (``workers.interleave_llm``), jailed as a job's."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import typer

from farm import host_figure
from farm.cli import submit_options
from farm.cli.views import err_console, say
from farm.errors import ModelError, RequestError
from farm.models.info import detect_format, inspect_model
from farm.models.spec import ModelInfo
from farm.sandbox import model_jail
from farm.settings import get_settings
from farm.verdict import FASTER, SLOWER, Verdict, cost_ratios, judge, line_up, looks
from schemas import JobSpec, ProfileRequest, TensorSpec
from schemas.cpus import cpu_list
from schemas.engines import CARDS, default_engine, incompatibility
from schemas.load_levels import TraceReplay, load_level
from workers.cores import MIN_SERVING_CORES, CoreLease, host_cores
from workers.hardware import detect_cpu
from workers.interleave import Block, Cell, Interleaver, SideLike, primary

#: ``farm submit``'s options that set the one cell an interleaved compare measures (declared once there)
CELL_OPTIONS = ("engine", "device", "batch_sizes", "concurrency", "input_spec", "model_format", "threads", "mode",
                "rate", "warmup", "input_data", "knob", "api", "input_tokens", "output_tokens", "prefix_tokens", "seed")
#: fewer pairs than this never give a verdict (the bootstrap of a median needs some)
MIN_PAIRS = 6
#: what a pair costs besides its two blocks (the untimed calls, the bookkeeping), s: for the budget's estimate
PAIR_OVERHEAD_S = 0.02


#: an LLM cell's shortest useful block, s: a streamed answer of a few dozen tokens lasts longer than 100 ms
LLM_BLOCK_S = 1.0


@dataclass(frozen=True)
class Settings:
    """How the comparison runs and is judged: time budget (s), block length (s), alpha, the smallest change
    called slower or faster (%), the alternate-start mode forced, the order's seed."""

    budget_s: float
    block_s: float
    alpha: float
    min_effect_pct: float
    alternate: bool = False
    seed: int = 0
    full_budget: bool = False  # a host figure: every pair the budget allows, no early stop


def cell_of(old: str, opts: dict[str, Any]) -> tuple[Cell, str, ProfileRequest]:
    """The one cell the options give (a one-line RequestError when they give several), the model format and the
    request the options make (an LLM cell's workload and knobs)."""
    values = {o.name: opts.get(o.name, o.default) for o in submit_options.SUBMIT_OPTIONS}
    values["model"] = old
    request = ProfileRequest.model_validate(submit_options.request_data(values))  # invalid: one line (cli.errors)
    counts = {"--engine": len(request.engines), "--device": len(request.devices),
              "--batch-sizes": len(request.batch_sizes), "--concurrency": len(request.concurrency),
              "--threads": len(request.threads or [0]), "--rate": len(request.rates or [0.0]),
              "--knob": len(request.knob_configs())}
    several = [name for name, n in counts.items() if n != 1]
    if several:
        raise RequestError(f"compare --interleaved measures one cell: give one value of {', '.join(several)}")
    m = request.measurement
    try:
        level = load_level(m.mode, request.concurrency[0], request.rates[0] if request.rates else m.rate)
    except ValueError as exc:
        raise RequestError(f"compare --interleaved: {exc}; give --rate") from None
    if isinstance(level, TraceReplay):
        raise RequestError("compare --interleaved sends at a concurrency or a rate, not a trace's schedule; "
                           "give --mode closed, constant or poisson")
    inputs = [s.model_dump() for s in request.inputs] if request.inputs else None
    engine = request.engines[0]
    if "engines" not in request.model_fields_set and Path(old).is_file():  # the format's engine, as a submit's
        engine = default_engine(request.format or detect_format(Path(old))) or engine
    cell = Cell(engine=engine, device=request.devices[0], batch_size=request.batch_sizes[0],
                threads=(request.threads or [m.threads])[0], level=level, inputs=inputs, data=request.input_data)
    return cell, request.format or "", request


def check_models(old: Path, new: Path, cell: Cell, model_format: str) -> list[ModelInfo]:
    """Both files exist, have one format, run in farm's process (or are LLM models an LLM engine serves) and take
    the same inputs; what each is."""
    for path in (old, new):
        if not path.is_file():
            raise RequestError(f"{path} is not a file; give two model files: farm compare --interleaved OLD NEW")
    given = [TensorSpec.model_validate(i) for i in cell.inputs] if cell.inputs else None
    info = [inspect_model(p, model_format or None, given) for p in (old, new)]
    if info[0].format != info[1].format:
        raise RequestError(f"{old.name} is {info[0].format} and {new.name} {info[1].format}: compare two models of "
                           "one format")
    card = CARDS.get(cell.engine)
    if card is None or not (card.in_process or cell.llm):
        raise RequestError(f"engine {cell.engine!r} runs its own server; compare --interleaved runs engines that load "
                           f"in farm's process ({', '.join(c for c, k in CARDS.items() if k.in_process)}) and LLM "
                           "engines: compare two requests instead (farm compare REQUEST_A REQUEST_B)")
    if cell.llm:  # each served by its own server, jailed as a job's: no code of theirs runs in this process
        why = incompatibility(cell.engine, info[0].format, cell.device)
        if why is not None:
            raise RequestError(f"compare --interleaved: {why}")
        return info
    if model_jail(info[0].format, f"{old.name} and {new.name}"):
        raise ModelError(f"{old.name} ({info[0].format}) runs code from its file and compare --interleaved loads "
                         "models in farm's own process, outside the jail: set FARM_TRUSTED_MODELS=1 if you trust "
                         "both, or compare two requests")
    shapes = [sorted((s.name, s.dtype, tuple(s.shape)) for s in i.inputs) for i in info]
    if shapes[0] != shapes[1]:
        def shown(s: Sequence[tuple[str, str, tuple[int, ...]]]) -> str:
            return ", ".join(f"{n}:{d}:{'x'.join(map(str, sh))}" for n, d, sh in s)
        raise ModelError(f"{old.name} takes {shown(shapes[0])} and {new.name} {shown(shapes[1])}: an interleaved "
                         "compare needs models with the same inputs")
    return info


def both_fit(old: Path, new: Path) -> bool:
    """Whether both models can be held at once: three times their files' size within the memory available now
    (an engine session takes about its weights once more, and the arena some besides)."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return True
    return 3 * (old.stat().st_size + new.stat().st_size) < avail


def lease() -> CoreLease:
    """The cores the comparison runs on: ``FARM_JOB_CORES`` (default 2, a serving job's least), leased like a
    job's so that no farm job measures on them meanwhile."""
    settings = get_settings()
    allowed = host_cores()
    want = min(len(allowed), settings.job_cores or MIN_SERVING_CORES)
    return CoreLease(job_id=f"compare-{uuid.uuid4().hex[:12]}", want=want, directory=settings.host_lock_dir,
                     allowed=allowed, isolation=settings.isolation)


def served_sides(request: ProfileRequest, cell: Cell, info: list[ModelInfo], models: tuple[Path, Path]
                 ) -> Callable[[int, list[int]], SideLike]:
    """How an LLM cell's sides come to be: each model served by the engine's own server (the process runner, as the
    embedded default runs a job's), sent the same prompts."""
    from workers.interleave_llm import ServedSide, Workload  # noqa: PLC0415 - the serving stack: LLM cells only
    from workers.runners.process import ProcessRunner  # noqa: PLC0415 - idem (farm.cli starts without it)

    runner, shared, tag = ProcessRunner(), list[Workload](), uuid.uuid4().hex[:8]
    knobs = request.knob_configs()[0]

    def side(i: int, cores: list[int]) -> SideLike:
        model = models[i]  # by index, not path: an A/A compare gives one file twice, each side its own job id
        spec = JobSpec(job_id=f"compare-{tag}-{'ab'[i]}", request_id=f"compare-{tag}", model_sha256=info[i].sha256,
                       model_format=info[i].format, model_filename=model.name, inputs=[], device=cell.device,
                       engine=cell.engine, batch_size=1, load=cell.level, queue="compare",
                       measurement=request.measurement, knobs=knobs)
        return ServedSide(model, spec, runner, cores, shared)

    return side


def run(old: Path, new: Path, cell: Cell, warmup_s: float, s: Settings,
        make_side: Callable[[int, list[int]], SideLike] | None = None) -> tuple[Verdict, list[Block], dict[str, Any]]:
    """Measure pairs until a look is conclusive or the budget is spent; the verdict, every block, and facts about
    the run (mode, cores, seconds, the primary figure)."""
    metric, read = primary(cell)
    higher = metric in HIGHER_IS_BETTER
    both = not s.alternate and both_fit(old, new)
    max_pairs = max(MIN_PAIRS, int(s.budget_s / (2 * s.block_s + PAIR_OVERHEAD_S)))
    max_pairs = 1_000_000 if s.full_budget else max_pairs
    checks = [n for n in looks(max_pairs) if n >= MIN_PAIRS]
    started = time.monotonic()
    a: list[float | None] = []
    b: list[float | None] = []
    verdict = judge([], s.alpha, s.min_effect_pct, len(checks), s.seed)
    with lease() as held, Interleaver((old, new), cell, held.cores, block_s=s.block_s, warmup_s=warmup_s,
                                      both_at_once=both, seed=s.seed, make_side=make_side) as il:
        t0 = time.monotonic()  # the budget is measuring time: a wait for cores or a slow load never eats it
        for block_a, block_b in il.pairs():
            a.append(read(block_a))
            b.append(read(block_b))
            n = len(a)
            out_of_time = time.monotonic() - t0 + 2 * s.block_s > s.budget_s
            if n in checks or out_of_time:
                verdict = judge(cost_ratios(a, b, higher), s.alpha, s.min_effect_pct, len(checks), s.seed)
                if out_of_time or (not s.full_budget and (verdict.conclusive or n >= checks[-1])):
                    break
        blocks, cores = list(il.blocks), held.cores
    facts = {"mode": "both at once" if both else "alternate start", "cores": cpu_list(cores), "metric": metric,
             "seconds": time.monotonic() - t0, "setup_s": t0 - started, "block_s": s.block_s, "looks": checks}
    return verdict, blocks, facts


def report(old: Path, new: Path, cell: Cell, verdict: Verdict, blocks: list[Block], facts: dict[str, Any],
           as_json: bool) -> None:
    """The verdict line, with its interval, the detectable difference, the sign test, the mode and the time."""
    busy = sum(1 for b in blocks if (b.foreign_cpu_pct or 0) > get_settings().host_busy_pct)
    if as_json:
        print(json.dumps({"old": str(old), "new": str(new), "cell": _cell_text(cell), **verdict.as_dict(), **facts,
                          "busy_blocks": busy, "blocks": [b.as_dict() for b in blocks]}, indent=2, default=str))
        return
    colour = "red" if verdict.verdict == SLOWER else "green" if verdict.verdict == FASTER else None
    lo, hi = verdict.ci_pct
    say(f"{new.name} against {old.name}, {_cell_text(cell)}, interleaved ({facts['mode']} on cores "
        f"{facts['cores']}; {FIGURES[facts['metric']]}):")
    say(f"  {verdict.verdict}: {verdict.change_pct:+.1f} % (median of {verdict.pairs} pair ratios; "
        f"{verdict.level * 100:.1f} % CI {lo:+.1f} to {hi:+.1f} %); detectable difference "
        f"{verdict.detectable_pct:.1f} %; {facts['seconds']:.1f} s measuring, {facts['setup_s']:.1f} s to "
        "lease cores and load", style=colour)
    say(f"  sign test: NEW slower in {verdict.slower_pairs} of {verdict.pairs} pairs (p={verdict.p_sign:.2g}); "
        f"{len(blocks)} blocks of {facts['block_s'] * 1000:.0f} ms (--json lists each); host busy on {busy} "
        f"block(s); same within +-{verdict.min_effect_pct:g} %")
    if facts["mode"] == "alternate start":
        say("  alternate-start mode: both models could not be held at once; each block loaded, warmed and closed "
            "its model", style="yellow")


#: the figures a verdict is taken on where more is better (a cost ratio inverts them)
HIGHER_IS_BETTER = ("throughput_infer_per_s", "output_tokens_per_s")
#: how the report names the figure a verdict is taken on (``workers.interleave.primary``)
FIGURES = {"throughput_infer_per_s": "inferences/s", "latency_p50_ms": "p50 latency",
           "output_tokens_per_s": "output tokens/s", "ttft_p50_ms": "TTFT p50"}


def _cell_text(cell: Cell) -> str:
    level = cell.level
    load = f"c{level.concurrency} closed" if level.type == "closed" else f"{level.type} {getattr(level, 'rate', 0):g}/s"
    return f"{cell.engine} {cell.device} b{cell.batch_size} {load}"


def interleaved(old: str, new: str, opts: dict[str, Any], fail_on_regression: float | None, s: Settings,
                as_json: bool, figure: Path | None = None) -> None:
    """``farm compare --interleaved OLD NEW``: measure, print, and exit 1 on a conclusive regression beyond
    ``fail_on_regression`` %; ``figure``: write NEW's host figure in units of OLD there (``farm.host_figure``),
    measured over the whole budget."""
    cell, model_format, request = cell_of(old, opts)
    info = check_models(Path(old), Path(new), cell, model_format)
    warmup = opts.get("warmup")
    make_side = served_sides(request, cell, info, (Path(old), Path(new))) if cell.llm else None
    if cell.llm and s.block_s < LLM_BLOCK_S:
        say(f"an LLM cell's blocks last {LLM_BLOCK_S * 1000:.0f} ms at least (a streamed answer outlasts "
            f"{s.block_s * 1000:.0f} ms); --block-ms raised to {LLM_BLOCK_S * 1000:.0f}", style="yellow",
            to=err_console)
        s = replace(s, block_s=LLM_BLOCK_S)
    if figure is not None:
        s = replace(s, full_budget=True)
    verdict, blocks, facts = run(Path(old), Path(new), cell, 0.5 if warmup is None else warmup, s, make_side)
    report(Path(old), Path(new), cell, verdict, blocks, facts, as_json)
    if figure is not None:
        save_figure(figure, (Path(old), Path(new)), info, cell, blocks, facts)
    if fail_on_regression is not None and verdict.regression(fail_on_regression):
        say(f"NEW is conclusively slower by {verdict.change_pct:.1f} %, beyond {fail_on_regression:g} %",
            style="red", to=err_console)
        raise typer.Exit(1)


def save_figure(path: Path, models: tuple[Path, Path], info: list[ModelInfo], cell: Cell, blocks: list[Block],
                facts: dict[str, Any]) -> None:
    """Write the host figure of ``models[1]`` in units of the reference ``models[0]`` from the pairs' blocks."""
    _, read = primary(cell)
    by_pair: dict[int, dict[str, float | None]] = {}
    for b in blocks:
        by_pair.setdefault(b.pair, {})[b.side] = read(b)
    pairs = [p for p in by_pair.values() if len(p) == 2]
    ratios = cost_ratios([p["A"] for p in pairs], [p["B"] for p in pairs], facts["metric"] in HIGHER_IS_BETTER)
    if not ratios:
        raise RequestError("no pair was measured in the budget: give a longer --budget-s for a host figure")
    cpu = detect_cpu()
    host: dict[str, str | int] = {"cpu": cpu.model, "arch": cpu.arch, "logical_cores": cpu.logical_cores,
                                  "lease_cores": str(facts["cores"])}
    ids = [host_figure.ModelId(name=m.name, sha256=i.sha256) for m, i in zip(models, info, strict=True)]
    fig = host_figure.make(ids[1], ids[0], _cell_text(cell), facts["metric"], ratios, host)
    host_figure.write(fig, path)
    say(f"host figure: {models[1].name} costs {fig.figure:.3f} x {models[0].name} on this host ({len(ratios)} pairs, "
        f"{cpu.model}); written to {path}")


def hosts(x_path: Path, y_path: Path, alpha: float, min_effect_pct: float, fail_on_regression: float | None,
          as_json: bool) -> None:
    """``farm compare --hosts X.json Y.json``: the model's cost in reference units on host Y against host X."""
    x, y = host_figure.read(x_path), host_figure.read(y_path)
    host_figure.comparable(x, y)
    verdict = line_up(x.ratios, y.ratios, alpha, min_effect_pct)
    if as_json:
        print(json.dumps({"model": x.model.model_dump(), "reference": x.reference.model_dump(), "cell": x.cell,
                          "x": {"host": x.host, "figure": x.figure, "pairs": len(x.ratios)},
                          "y": {"host": y.host, "figure": y.figure, "pairs": len(y.ratios)}, **verdict.as_dict()},
                         indent=2))
    else:
        lo, hi = verdict.ci_pct
        say(f"{x.model.name} in units of {x.reference.name} ({x.cell}): host Y ({y.host.get('cpu')}) against host X "
            f"({x.host.get('cpu')})")
        say(f"  {verdict.verdict}: {verdict.change_pct:+.1f} % ({verdict.level * 100:.0f} % CI {lo:+.1f} to "
            f"{hi:+.1f} %); detectable difference {verdict.detectable_pct:.1f} %; rank-sum p={verdict.p_sign:.2g}",
            style="red" if verdict.verdict == SLOWER else "green" if verdict.verdict == FASTER else None)
        say(f"  X: {x.figure:.3f} ({len(x.ratios)} pairs, {x.measured_at}); Y: {y.figure:.3f} ({len(y.ratios)} "
            f"pairs, {y.measured_at}); a speed common to both models cancels, a difference in kind does not "
            "(docs/trust.md)")
    if fail_on_regression is not None and verdict.regression(fail_on_regression):
        say(f"the model costs conclusively more of the reference on host Y, by {verdict.change_pct:.1f} %",
            style="red", to=err_console)
        raise typer.Exit(1)
