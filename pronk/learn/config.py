"""How a job improves its weights from its own checked traces: the `improve:` section of a job file.

Only pydantic here, so the job schema can hold it without importing torch or the harness.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainingBudget(BaseModel):
    """What one training round may spend: steps and seconds (whichever ends first), and cores, shared with the engine
    workers on a small machine (the trainer runs niced, with `threads` torch threads)."""

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=40, ge=1, le=100_000, description="Optimizer steps at most.")
    max_seconds: float = Field(
        default=300.0, gt=0, description="Wall-clock seconds at most, from loading the model to the last step."
    )
    learning_rate: float = Field(default=1e-5, gt=0, le=1, description="AdamW learning rate.")
    batch_size: int = Field(default=4, ge=1, le=1024, description="Transcripts per optimizer step.")
    max_tokens: int = Field(default=2048, ge=16, description="A transcript longer than this many tokens is left out.")
    threads: int = Field(default=1, ge=1, le=256, description="torch threads of the training process.")
    nice: int = Field(default=10, ge=0, le=19, description="How far the training process lowers its priority.")
    seed: int = Field(default=0, description="Seed of the data order.")


class ImproveConfig(BaseModel):
    """Rollouts on the training set, rejection sampling of passed traces, bounded fine-tuning, rounds of it."""

    model_config = ConfigDict(extra="forbid")

    training_set: str = Field(
        default="data/labelled/agent-train.jsonl",
        description="Labelled lines to roll out and learn from; never the job's held-out `quality.labelled_set`.",
    )
    samples_per_task: int = Field(default=4, ge=1, le=64, description="Rollouts of each training line (k).")
    temperature: float = Field(default=0.8, gt=0, le=2, description="Sampling temperature of the rollouts.")
    seed: int = Field(default=0, description="First rollout seed; sample i of a line uses seed + i.")
    cap_per_task: int = Field(
        default=2, ge=1, le=64, description="Distinct passed transcripts kept per task, so easy tasks do not dominate."
    )
    rounds: int = Field(default=1, ge=1, le=100, description="Rollout, selection and training rounds.")
    max_steps: int = Field(default=40, ge=1, le=100_000, description="Optimizer steps per round at most.")
    max_seconds: float = Field(default=300.0, gt=0, description="Training seconds per round at most.")
    learning_rate: float = Field(default=1e-5, gt=0, le=1, description="AdamW learning rate.")
    batch_size: int = Field(default=4, ge=1, le=1024, description="Transcripts per optimizer step.")
    threads: int = Field(default=1, ge=1, le=256, description="torch threads of the training process.")
    nice: int = Field(default=10, ge=0, le=19, description="How far the training process lowers its priority.")

    def budget(self) -> TrainingBudget:
        """One round's training budget."""
        return TrainingBudget(
            max_steps=self.max_steps,
            max_seconds=self.max_seconds,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            threads=self.threads,
            nice=self.nice,
            seed=self.seed,
        )
