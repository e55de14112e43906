"""The guard: a tuned configuration replaces the current one only when it is better by more than the noise.

Noise is measured, not assumed: the current configuration is replayed more than once on the same sample, and
the winner again when the budget allows; the larger relative spread (max − min over mean) of the two is the
noise, never below `min_noise`. A winner measured once, or with a failed trace, is refused whatever its tasks
per dollar (one lucky replay of a candidate can show twice what the same settings give the next time).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    accept: bool
    reason: str
    current: float
    """Mean tasks per dollar of the current configuration."""
    winner: float
    """Mean tasks per dollar of the winner."""
    gain: float
    """winner / current."""
    noise: float
    """The relative spread the winner had to beat."""


def relative_spread(values: list[float]) -> float:
    """(max − min) / mean of repeated measurements; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / mean if mean > 0 else float("inf")


def judge(current: list[float], winner: list[float], winner_failed: int = 0, min_noise: float = 0.05) -> Verdict:
    """Whether the winner (its tasks per dollar, each measurement) beats the current configuration (its repeats)."""
    if not current or not winner:
        raise ValueError("the guard needs measurements of both configurations")
    base, best = statistics.fmean(current), statistics.fmean(winner)
    noise = max(min_noise, relative_spread(current), relative_spread(winner))
    gain = best / base if base > 0 else float("inf")
    if winner_failed:
        return Verdict(False, f"the winner failed {winner_failed} trace(s)", base, best, gain, noise)
    if len(current) < 2 or len(winner) < 2:
        which = "current configuration" if len(current) < 2 else "winner"
        return Verdict(False, f"the {which} was measured once: no noise to judge by", base, best, gain, noise)
    if gain <= 1.0 + noise:
        return Verdict(False, f"gain {gain:.3f}x is within the measured noise ({noise:.1%})", base, best, gain, noise)
    return Verdict(True, f"gain {gain:.3f}x beats the measured noise ({noise:.1%})", base, best, gain, noise)
