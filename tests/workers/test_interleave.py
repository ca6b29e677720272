"""The interleaving engine (``workers.interleave``) on two tiny ONNX models: blocks recorded in random order, each
side warm, closed and open loops, the alternate-start mode, models with different inputs refused."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from farm.errors import ModelError
from farm.models.examples import build_example
from schemas.load_levels import ClosedLoop, ConstantRate, PoissonRate
from workers.interleave import Block, Cell, Interleaver, primary, send_times


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("interleave")
    return (build_example("compute", out / "a.onnx", ms=0.2), build_example("compute", out / "b.onnx", ms=0.4))


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))[:2]


def cell(level: ClosedLoop | ConstantRate | PoissonRate) -> Cell:
    return Cell(engine="onnxruntime", device="cpu", batch_size=2, threads=1, level=level)


def run(models: tuple[Path, Path], level: ClosedLoop | ConstantRate | PoissonRate, n: int,
        both_at_once: bool = True) -> list[tuple[Block, Block]]:
    with Interleaver(models, cell(level), cores(), block_s=0.05, warmup_s=0.05, both_at_once=both_at_once) as il:
        got: list[tuple[Block, Block]] = []
        for pair in il.pairs():
            got.append(pair)
            if len(got) == n:
                break
        assert len(il.blocks) == 2 * n  # every block kept, in the order measured
        assert [b.pair for b in il.blocks] == [i // 2 for i in range(2 * n)]
        assert all(b.start_s <= c.start_s for b, c in zip(il.blocks, il.blocks[1:], strict=False))
    return got


def test_closed_loop_pairs_hold_one_block_of_each_side_in_random_order(models: tuple[Path, Path]) -> None:
    pairs = run(models, ClosedLoop(concurrency=2), 12)
    assert all(a.side == "A" and b.side == "B" for a, b in pairs)
    firsts = {a.order for a, _ in pairs}
    assert firsts == {0, 1}  # A went first in some pairs, B in others
    for a, b in pairs:
        for block in (a, b):
            assert block.requests > 0 and block.throughput_infer_per_s > 0
            assert block.latency_p50_ms > 0 and block.late_pct is None
    metric, read = primary(cell(ClosedLoop(concurrency=2)))
    assert metric == "throughput_infer_per_s" and read(pairs[0][0]) == pairs[0][0].throughput_infer_per_s


@pytest.mark.parametrize("level", [ConstantRate(rate=200), PoissonRate(rate=200)])
def test_open_loop_blocks_send_at_the_rate(models: tuple[Path, Path], level: ConstantRate | PoissonRate) -> None:
    pairs = run(models, level, 4)
    for a, b in pairs:
        for block in (a, b):
            assert block.requests > 0 and block.late_pct is not None
    assert primary(cell(level))[0] == "latency_p50_ms"


def test_alternate_start_loads_each_side_for_its_block(models: tuple[Path, Path]) -> None:
    pairs = run(models, ClosedLoop(concurrency=1), 3, both_at_once=False)
    assert all(a.requests > 0 and b.requests > 0 for a, b in pairs)


def test_models_with_different_inputs_are_refused(models: tuple[Path, Path], tmp_path: Path) -> None:
    other = build_example("identity", tmp_path / "identity.onnx")
    with pytest.raises(ModelError, match="different inputs"), \
            Interleaver((models[0], other), cell(ClosedLoop(concurrency=1)), cores(), warmup_s=0.0):
        pass


def test_send_times_follow_the_level() -> None:
    even = send_times(ConstantRate(rate=100), 0.5, random.Random(0))
    assert len(even) == 50 and even[1] - even[0] == pytest.approx(0.01)
    poisson = send_times(PoissonRate(rate=100), 5.0, random.Random(0))
    assert 400 < len(poisson) < 600 and poisson == sorted(poisson)
