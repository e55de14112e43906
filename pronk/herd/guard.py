"""The guard: a tuned configuration replaces the current one only when it is better by more than the noise.

Noise is measured, not assumed: the current configuration is replayed more than once on the same sample, and
the winner again when the budget allows; the larger relative spread (max − min over mean) of the two is the
noise, never below `min_noise`. A winner measured once, or with a failed trace, is refused whatever its tasks
per dollar (one lucky replay of a candidate can show twice what the same settings give the next time).

A job with a labelled set (`quality.labelled_set`) is also guarded on what it answers: the set runs on the
current configuration and on the winner, and a winner whose checked success rate falls beyond noise
(`pronk.batches.labelled.compare_success`) is refused however cheap its tasks are; so is one whose rate, or the
current configuration's, was not measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pronk.batches.labelled import QualityVerdict, compare_success
from pronk.batches.schemas import CheckCounts


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
    quality: QualityVerdict | None = None
    """Both success rates on the labelled set, when the job has one and both were measured."""


def relative_spread(values: list[float]) -> float:
    """(max − min) / mean of repeated measurements; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return (max(values) - min(values)) / mean if mean > 0 else float("inf")


def judge(
    current: list[float],
    winner: list[float],
    winner_failed: int = 0,
    min_noise: float = 0.05,
    success: tuple[CheckCounts | None, CheckCounts | None] | None = None,
) -> Verdict:
    """Whether the winner (its tasks per dollar, each measurement) beats the current configuration (its repeats).

    `success`: the labelled set's tallies of the current configuration and of the winner (None where one was not
    measured); None when the job has no labelled set.
    """
    if not current or not winner:
        raise ValueError("the guard needs measurements of both configurations")
    base, best = statistics.fmean(current), statistics.fmean(winner)
    noise = max(min_noise, relative_spread(current), relative_spread(winner))
    gain = best / base if base > 0 else float("inf")
    tallies = success or (None, None)
    quality = None
    if tallies[0] is not None and tallies[1] is not None:
        quality = compare_success(tallies[0], tallies[1])

    def verdict(accept: bool, reason: str) -> Verdict:
        return Verdict(accept, reason, base, best, gain, noise, quality)

    if winner_failed:
        return verdict(False, f"the winner failed {winner_failed} trace(s)")
    if len(current) < 2 or len(winner) < 2:
        which = "current configuration" if len(current) < 2 else "winner"
        return verdict(False, f"the {which} was measured once: no noise to judge by")
    if success is not None and quality is None:
        which = "current configuration" if tallies[0] is None else "winner"
        return verdict(False, f"the {which}'s success rate on the labelled set was not measured")
    if quality is not None and quality.worse:
        return verdict(False, f"the winner answers worse on the labelled set: {quality.reason}")
    answers = f"; {quality.reason}" if quality is not None else ""
    if gain <= 1.0 + noise:
        return verdict(False, f"gain {gain:.3f}x is within the measured noise ({noise:.1%}){answers}")
    return verdict(True, f"gain {gain:.3f}x beats the measured noise ({noise:.1%}){answers}")
