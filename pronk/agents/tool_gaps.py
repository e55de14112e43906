"""Pin TTLs from measured tool-call gaps: how long to keep a trace's prefix pinned while its tool runs.

One fixed `kv_pin_ttl_s` either lets pins lapse before slow tools return or holds KV for fast ones long
after their step came back (and the pin is only dropped then). With `kv_pin_ttl: auto` the harness keeps a
window of recent gaps per tool name and pins for their 90th percentile times a margin, clamped; a tool
with too few samples gets the job's `kv_pin_ttl_s`. When the next tool is not known before the step (the
model picks it), the TTL covers the slowest of the tools the step may call.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable


class ToolGaps:
    def __init__(
        self,
        default_s: float,
        window: int = 64,
        min_samples: int = 5,
        quantile: float = 0.9,
        margin: float = 1.25,
        floor_s: float = 0.5,
        ceiling_s: float = 300.0,
    ):
        self.default_s = default_s
        self.min_samples = min_samples
        self.quantile = quantile
        self.margin = margin
        self.floor_s = floor_s
        self.ceiling_s = ceiling_s
        self.gaps: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))

    def observe(self, tool: str, seconds: float) -> None:
        if seconds >= 0:
            self.gaps[tool].append(seconds)

    def estimate(self, tool: str) -> float:
        """The TTL for a gap of `tool`: the window's quantile times the margin, clamped; the default until measured."""
        samples = sorted(self.gaps.get(tool, ()))
        if len(samples) < self.min_samples:
            return self.default_s
        value = samples[min(len(samples) - 1, int(self.quantile * len(samples)))]
        return min(self.ceiling_s, max(self.floor_s, value * self.margin))

    def ttl(self, tools: Iterable[str]) -> float:
        """The TTL for a step that may call any of `tools` (the longest of their estimates)."""
        return max((self.estimate(t) for t in tools), default=self.default_s)
