"""Selection by rejection sampling (STaR / RFT): the passed rollouts' transcripts, whole, become training examples.

A sample is kept when its check passed and its trace ended with a final answer (a check that passes on a trace cut
off by `max_steps` passed on a tool call's text, not an answer). Identical passes of a task (the same conversation
word for word) count once, and at most `cap_per_task` distinct passes of a task are kept, the first samples first,
so tasks the model already solves every time do not outweigh the rest. An answer branch (`pronk.improve.branches`)
is kept the same way, after its task's plain samples; a hinted sample (`pronk.improve.hints`) too, its transcript
without the hint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pydantic import BaseModel, Field

from pronk.improve.agent_training_set import task_family
from pronk.improve.rollouts import Sample
from pronk.improve.training_examples import TrainingExample


class SelectionCounts(BaseModel):
    """Tasks rolled out, samples run, samples passed (and answered), distinct passes kept after the cap."""

    tasks: int = 0
    samples: int = 0
    passed: int = 0
    kept: int = 0


class SelectionReport(SelectionCounts):
    families: dict[str, SelectionCounts] = Field(default_factory=dict)
    """The same counts by task family (`arith`, `lookup`, `search`)."""
    hinted: SelectionCounts = Field(default_factory=SelectionCounts)
    """The counts of the hinted samples alone (tasks: those hinted); they are in the totals too."""
    branches: SelectionCounts = Field(default_factory=SelectionCounts)
    """The counts of the answer branches alone (tasks: those branched); they are in the totals too."""


def select(samples: Iterable[Sample], cap_per_task: int) -> tuple[list[TrainingExample], SelectionReport]:
    """The training examples (root transcripts of distinct passes, at most `cap_per_task` a task) and the counts."""
    if cap_per_task < 1:
        raise ValueError(f"cap_per_task must be at least 1, not {cap_per_task}")
    report = SelectionReport()
    examples: list[TrainingExample] = []
    seen: dict[str, set[str]] = {}
    apart_tasks: set[tuple[str, str]] = set()
    for sample in sorted(samples, key=lambda s: (s.task_id, s.index)):
        counts = [report, report.families.setdefault(task_family(sample.task_id), SelectionCounts())]
        apart = "hinted" if sample.hinted else "branches" if sample.branch_of is not None else None
        if apart is not None:
            counts.append(getattr(report, apart))
            if (apart, sample.task_id) not in apart_tasks:
                apart_tasks.add((apart, sample.task_id))
                counts[-1].tasks += 1
        kept = seen.get(sample.task_id)
        if kept is None:
            kept = seen[sample.task_id] = set()
            for c in counts[:2]:
                c.tasks += 1
        for c in counts:
            c.samples += 1
        transcript = sample.transcript
        if not (sample.passed and transcript is not None and transcript.finish_reason == "stop"):
            continue
        for c in counts:
            c.passed += 1
        messages = sample.training_messages(transcript)
        key = json.dumps(messages, sort_keys=True)
        if key in kept or len(kept) >= cap_per_task:
            continue
        kept.add(key)
        for c in counts:
            c.kept += 1
        examples.append(TrainingExample(sample.task_id, sample.run.request.custom_id, messages))
    return examples, report
