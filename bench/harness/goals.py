"""The issues' goals, each a row of a record: a figure of pronk's against what it is measured against (a limit, a
stock setup, the best peer, or what an absolute figure is a share of), every round's value, and whether the median
meets it.

A goal over the best peer (issue 63) never asks for more than the ceiling allows: where the compute-only limit itself
makes less than the goal's multiple over the best peer in the same record, the goal becomes `PEER_CAP_SHARE` of what
the limit makes over it, and the row says so (`capped`). Issue 41's 4.5x, 2.0x and 2.5x over stock vLLM lay above the
ceilings and are retired: those ratios are reported, with no goal.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.harness.figures import (
    BASELINE,
    BATCH,
    COMPUTE_LIMIT,
    FULL,
    HARNESS,
    LIMIT,
    LIMITS,
    UNTIERED,
    AgentRun,
    CheckedRound,
    CheckedRun,
    checked_best_peer,
    checked_table,
    ratio,
    rounds_best_peer,
    rounds_table,
    spread,
)
from pronk.batches.labelled import compare_success
from pronk.batches.schemas import CheckCounts

IDEAL = "the workload's cached-token ratio with no eviction"
ENGINE_CORES = "the engines' pinned cores (1.0: each engine computed all the time)"
BEST_PEER = "the best vllm-router setup"
"""What a goal over a peer is measured against: whichever peer made the most in the record (`figures.best_peer`). Its
row names that setup."""
PEER_CAP_SHARE = 0.95
"""The share of what the compute-only limit makes over the best peer that a goal over the peer is cut to, where the
limit makes less than the goal asks."""


@dataclass(frozen=True, slots=True)
class Goal:
    """One goal of the issues: a figure of pronk's, the records it applies to (`record_key`), its key in pronk's
    setup table, what it is measured against (a limit or a stock setup by its setup name, `BEST_PEER`, or what an
    absolute figure is a share of), and the goal (None: reported, no goal), a floor unless `ceiling`."""

    figure: str
    records: tuple[str, ...]
    key: str
    against: str
    goal: float | None
    ceiling: bool = False


GOALS = (
    # issue 63: the strongest peer, and the ceilings
    Goal("traces/s, pronk / best vllm-router setup", ("agent-long",), "over_best_peer", BEST_PEER, 1.5),
    Goal("traces/s, pronk / best vllm-router setup", ("cpu",), "over_best_peer", BEST_PEER, 1.2),
    Goal(
        "traces/s, pronk with the tier / best vllm-router setup, same tier",
        ("agent-long-tiered",),
        "over_best_peer",
        BEST_PEER,
        1.5,
    ),
    Goal("traces/s, pronk / compute-only limit", ("agent-long-tiered",), "over_compute_limit", COMPUTE_LIMIT, 0.90),
    Goal(
        "checked successes per dollar, pronk / best vllm-router setup",
        ("agent-real",),
        "over_best_peer",
        BEST_PEER,
        1.3,
    ),
    # issue 11
    Goal("agent-long traces/s, pronk / stock vLLM round-robin", ("agent-long",), "over_baseline", BASELINE, 3.0),
    Goal("traces/s, pronk / capacity-matched limit", ("agent-long", "cpu"), "over_limit", LIMIT, 0.80),
    Goal("cached-token ratio / ideal", ("agent-long", "cpu"), "cached_ratio_of_ideal", IDEAL, 0.90),
    Goal("today's CPU profile traces/s, pronk / baseline", ("cpu",), "over_baseline", BASELINE, 1.4),
    Goal("traces/s, pronk / compute-only limit", ("agent-long", "cpu"), "over_compute_limit", COMPUTE_LIMIT, None),
    # issue 27: a job with a KV host tier, against the limit with the same tier, and its engines busy through the
    # tool gaps; its ratios to stock vLLM with and without the tier are reported (issue 41's goals, retired)
    Goal(
        "traces/s, pronk with the tier / stock round-robin, no tier",
        ("agent-long-tiered",),
        "over_untiered",
        UNTIERED,
        None,
    ),
    Goal(
        "traces/s, pronk with the tier / stock round-robin, same tier",
        ("agent-long-tiered",),
        "over_baseline",
        BASELINE,
        None,
    ),
    Goal("traces/s, pronk / capacity-matched limit", ("agent-long-tiered",), "over_limit", LIMIT, 0.90),
    Goal(
        "recomputed prompt tokens, pronk / the capacity-matched limit's",
        ("agent-long-tiered",),
        "recomputed_over_limit",
        LIMIT,
        1.10,
        ceiling=True,
    ),
    Goal("engine busy share", ("agent-long-tiered",), "busy_share", ENGINE_CORES, 0.90),
    # issue 26: real agent traces, checked (`checked_goals`); the ratio to stock is reported (issue 41's, retired)
    Goal(
        "checked successes per dollar, pronk / stock vLLM round-robin",
        ("agent-real",),
        "over_baseline",
        BASELINE,
        None,
    ),
    Goal("traces/s, pronk / capacity-matched limit", ("agent-real",), "over_limit", LIMIT, 0.90),
    Goal("traces/s, pronk / compute-only limit", ("agent-real",), "over_compute_limit", COMPUTE_LIMIT, None),
)
"""Every goal row of every record; each names what it is measured against."""


def peer_goal(asked: float, reachable: dict | None) -> tuple[float, str | None]:
    """The multiple over the best peer a record holds pronk to, and why, where it is not `asked`: `asked`, unless the
    compute-only limit's own multiple over that peer in the record (`reachable`'s median) is less, and then
    `PEER_CAP_SHARE` of the limit's."""
    limit = (reachable or {}).get("median")
    if limit is None or limit >= asked:
        return asked, None
    goal = round(PEER_CAP_SHARE * limit, 3)
    return goal, (
        f"capped from {asked}: the compute-only limit makes only {limit:.2f}x the best peer here, "
        f"so {PEER_CAP_SHARE} of that"
    )


def goal_row(goal: Goal, setup: str, values: dict, reachable: dict | None = None, against: str | None = None) -> dict:
    """One goal's row in a record: `values` (the figure's spread over rounds), what it is measured against (`against`,
    the setup a `BEST_PEER` goal resolved to), whether the median meets the goal (None for a figure only reported),
    `defect` when pronk exceeds a limit beyond noise (never met then), `reachable`, for a goal against a serving
    setup, the most any setup could show against it (`most_reachable`), and `capped`, why a goal over the best peer
    asks less than the issue did (`peer_goal`)."""
    target, capped = goal.goal, None
    if goal.against == BEST_PEER and goal.goal is not None:
        target, capped = peer_goal(goal.goal, reachable)
    median, defect = values["median"], bool(values.get("defect"))
    if target is None:
        met = False if defect else None
    else:
        met = not defect and median is not None and (median <= target if goal.ceiling else median >= target)
    return {
        "figure": goal.figure,
        "setup": setup,
        "against": against or goal.against,
        "goal": target,
        "ceiling": goal.ceiling,
        **values,
        "met": met,
        "defect": defect,
        "reachable": reachable,
        "capped": capped,
    }


def most_reachable(rounds: list[dict[str, AgentRun]], against: str) -> dict | None:
    """The compute-only limit's traces per wall second over the `against` setup's, round by round: what a goal
    against that setup could reach at most, since no setup beats the compute-only limit. A goal above it cannot be
    met on this machine and workload, whatever pronk schedules. None where the record has no compute-only limit, or
    `against` is a limit or no setup of the record."""
    if COMPUTE_LIMIT not in rounds[0] or against in LIMITS or against not in rounds[0]:
        return None
    return spread([ratio(r[COMPUTE_LIMIT].traces_per_s, r[against].traces_per_s) for r in rounds])


def _rows(
    goals_of: list[Goal], table: dict, setups: tuple[str, ...], rounds: list[dict[str, AgentRun]], peer: str | None
) -> list[dict]:
    """The rows of `goals_of` for each of `setups` that has the figure; a goal over the best peer is measured against
    `peer`, and left out where no peer ran."""
    rows = []
    for goal in goals_of:
        against = peer if goal.against == BEST_PEER else goal.against
        if against is None:
            continue
        for setup in setups:
            if (values := table.get(setup, {}).get(goal.key)) is not None:
                rows.append(goal_row(goal, setup, values, most_reachable(rounds, against), against))
    return rows


def goals(rounds: list[dict[str, AgentRun]], ideals: list[float], record: str) -> list[dict]:
    """The issues' goals for this record (`record_key`), measured on pronk's batch flow (the product) and on the
    bare loop with every mechanism on; each with every round's value and whether the median meets the goal
    (`goal_row`)."""
    table = rounds_table(rounds, ideals)
    mine = [goal for goal in GOALS if record in goal.records]
    return _rows(mine, table, (BATCH, FULL), rounds, rounds_best_peer(rounds))


def pooled_checks(runs: list[CheckedRun]) -> CheckCounts:
    return CheckCounts(
        passed=sum(r.checks.passed for r in runs),
        failed=sum(r.checks.failed for r in runs),
        unchecked=sum(r.checks.unchecked for r in runs),
    )


def success_row(rounds: list[CheckedRound], against: str) -> dict:
    """Whether pronk's success rate, pooled over every round, is lower than the `against` setup's beyond noise
    (`compare_success`: the row is met when it is not), with the ratio of the two rates round by round."""
    theirs = [r.served()[against] for r in rounds]
    verdict = compare_success(pooled_checks(theirs), pooled_checks([r.pronk for r in rounds]))
    rates = [
        ratio(r.pronk.figures()["success_rate"], other.figures()["success_rate"])
        for r, other in zip(rounds, theirs, strict=True)
    ]
    return {
        "figure": f"success rate, pronk / {'stock vLLM round-robin' if against == BASELINE else BEST_PEER} "
        "(pooled over rounds)",
        "setup": HARNESS,
        "against": against,
        "goal": "not lower beyond noise",
        **spread(rates),
        "met": not verdict.worse,
        "reason": verdict.reason,
    }


def checked_goals(rounds: list[CheckedRound]) -> list[dict]:
    """The agent-real goals (`GOALS`): pronk's per-dollar ratios and its ratios to the limits (the median over rounds
    against the goal), and whether its success rate, pooled over every round, is lower beyond noise than stock's and
    the best peer's (`success_row`).

    A per-dollar row's `reachable` is the compute-only limit's traces per wall second over that setup's
    (`most_reachable`): the price is the fleet's wall time, so with the same lines passed on both sides, that is
    the most pronk's checked successes per dollar could make over it."""
    table = checked_table(rounds)
    peer = checked_best_peer(rounds)
    mine = [goal for goal in GOALS if "agent-real" in goal.records]
    rows = _rows(mine, table, (HARNESS,), [r.trace_runs() for r in rounds], peer)
    return rows + [success_row(rounds, against) for against in (BASELINE, peer) if against is not None]
