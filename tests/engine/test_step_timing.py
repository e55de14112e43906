"""The timing model: the shipped H100/H200 tables against the anchors quoted from aisimulate, the grid's
interpolation, and the CPU fit against the forward passes it was fitted to."""

import json

import pytest

from pronk.engine.step_timing import CpuFit, Grid, StepShape, TimingTable, load_timing, point_shape
from pronk.settings import PROJECT_ROOT

TIMING = PROJECT_ROOT / "data" / "sim" / "timing"


def prefill(tokens: int, cached: int = 0) -> StepShape:
    step = StepShape()
    step.add_prefill(tokens, cached)
    return step


def decode(sequences: int, context: int) -> StepShape:
    step = StepShape()
    for _ in range(sequences):
        step.add_decode(context)
    return step


@pytest.mark.parametrize(
    ("table", "step", "low_ms", "high_ms"),
    [
        # aisimulate 0.13.0.dev, NVIDIA's data for vLLM on H100 and H200 (docs/simulation.md)
        ("h100-vllm-qwen3-8b", prefill(2048), 44.0, 45.0),
        ("h100-vllm-qwen3-8b", prefill(512, 2048), 13.5, 14.1),
        ("h100-vllm-qwen3-8b", decode(32, 4096), 13.0, 14.5),
        ("h100-vllm-qwen3-8b", decode(1, 4096), 7.2, 7.6),
        ("h200-vllm-qwen3-8b", prefill(2048), 41.8, 42.8),
        ("h200-vllm-qwen3-8b", decode(32, 4096), 10.4, 11.0),
    ],
)
def test_tables_meet_the_anchors(table: str, step: StepShape, low_ms: float, high_ms: float) -> None:
    assert low_ms <= load_timing(TIMING / f"{table}.json").seconds(step) * 1000 <= high_ms


def test_a_table_records_how_far_it_strays_from_aisimulate() -> None:
    check = json.loads((TIMING / "h100-vllm-qwen3-8b.json").read_text())["check"]
    assert check["steps"] >= 1000
    assert check["median_relative_error"] < 0.02
    assert check["p95_relative_error"] < 0.05


def test_grid_interpolates_between_points_and_extends_past_the_last() -> None:
    grid = Grid([[1, 3], [0, 10]], [[1.0, 2.0], [5.0, 6.0]])
    assert grid.at(1, 0) == 1.0
    assert grid.at(2, 5) == pytest.approx(3.5)
    assert grid.at(0, -5) == 1.0  # flat below the first point
    assert grid.at(5, 10) == pytest.approx(10.0)  # the last segment's slope, carried on


def test_a_mixed_step_costs_less_than_its_parts_apart() -> None:
    table = load_timing(TIMING / "h100-vllm-qwen3-8b.json")
    assert isinstance(table, TimingTable)
    mixed = prefill(2048)
    for _ in range(32):
        mixed.add_decode(4096)
    apart = table.seconds(prefill(2048)) + table.seconds(decode(32, 4096))
    assert table.seconds(prefill(2048)) < table.seconds(mixed) < apart


def test_longer_steps_take_longer() -> None:
    table = load_timing(TIMING / "h100-vllm-qwen3-8b.json")
    assert table.seconds(prefill(1000)) < table.seconds(prefill(3000)) < table.seconds(prefill(3000, 20_000))
    assert table.seconds(decode(8, 1000)) < table.seconds(decode(64, 1000)) < table.seconds(decode(64, 8000))
    assert table.seconds(decode(2000, 1000)) > table.seconds(decode(1024, 1000))  # past the grid


def test_cpu_fit_reproduces_its_measured_steps() -> None:
    data = json.loads((TIMING / "cpu-tiny.json").read_text())
    fit = load_timing(TIMING / "cpu-tiny.json")
    assert isinstance(fit, CpuFit)
    assert all(c > 0 for c in fit.coefficients)
    for point in data["points"]:
        assert fit.seconds(point_shape(point)) == pytest.approx(point["seconds"], rel=0.12)


def test_an_unknown_timing_kind_is_refused(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"kind": "guess"}')
    with pytest.raises(ValueError, match="guess"):
        load_timing(path)
