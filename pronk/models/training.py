"""The one trainer: bounded full fine-tuning of a checkpoint on labelled token sequences, writing a checkpoint that
fits its parent.

A job's `improve:` section (`ImproveConfig`) is its configuration: `max_steps` or `max_seconds`, whichever comes
first, `learning_rate`, `batch_size`, `max_tokens` (a longer example is left out), `seed` (the data order), and
`threads` and `nice` for `train`, which runs it in a spawned child process, niced and with `threads` torch threads,
so it neither starves the engine workers sharing the machine's cores nor changes the caller's own priority or
threads. What is trained on comes encoded (`EncodedExample`: token ids, and the labels the loss counts): the improve
loop's passed transcripts, labelled on the assistant's tokens (`pronk.improve.training_examples`), or the tiny
model's corpus, every token labelled (`pronk.models.tiny_finetune`).

The checkpoint has the parent's architecture, dtype and parameter names (a tied `lm_head` stays left out, as the
import leaves it), one safetensors file, and every other file of the parent's directory (config, tokenizer, chat
template) as it was; it is checked against the parent before returning.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import os
import queue
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel

from pronk.jobs.schema import ImproveConfig
from pronk.models.checkpoints import CheckpointMismatch, check_compatible, read_spec

IGNORE = -100
"""The label of a token the loss skips."""
WEIGHTS_FILE = "model.safetensors"
MAX_GRAD_NORM = 1.0
"""Gradients are clipped to this norm: a few dozen transcripts make a noisy batch, and one outlier step should not
undo what the served version already answers right."""


@dataclass(frozen=True, slots=True)
class EncodedExample:
    """One sequence to train on."""

    input_ids: list[int]
    labels: list[int]
    """`input_ids` where the loss counts, IGNORE elsewhere."""

    @property
    def trained_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)


class TrainingResult(BaseModel):
    """What one training run did and where its checkpoint is."""

    checkpoint_dir: str
    steps: int
    seconds: float
    stopped_by: Literal["max_steps", "max_seconds"]
    examples: int
    """Examples trained on (those longer than `max_tokens` left out)."""
    skipped: int
    tokens: int
    """Tokens of the batches run, padding left out."""
    trained_tokens: int
    """Of those, the labelled tokens the loss counted."""
    losses: list[float]
    threads: int
    nice: int


def _batches(encoded: list[EncodedExample], batch_size: int, seed: int):
    """Batches of examples, reshuffled each epoch, forever."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            more = list(range(len(encoded)))
            rng.shuffle(more)
            order += more
        yield [encoded[i] for i in order[:batch_size]]
        del order[:batch_size]


def batch_tensors(batch: list[EncodedExample], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(e.input_ids) for e in batch)
    ids = [e.input_ids + [pad_id] * (width - len(e.input_ids)) for e in batch]
    labels = [e.labels + [IGNORE] * (width - len(e.labels)) for e in batch]
    mask = [[1] * len(e.input_ids) + [0] * (width - len(e.input_ids)) for e in batch]
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "attention_mask": torch.tensor(mask, dtype=torch.long),
    }


def labelled_token_losses(model: Any, tensors: dict[str, Any]) -> Any:
    """The cross-entropy of each labelled token (`labels` not IGNORE), as the model's own loss computes it (its mean
    is that loss), with the vocabulary's logits made at those positions only.

    The model's own forward makes logits at every position: batch × width × vocabulary floats, ~2 GB for four
    transcripts of 2,500 tokens with SmolLM2's 49k-token vocabulary, and as much again for their softmax and their
    gradient, while the loss counts a few percent of the positions.
    """
    import torch

    hidden = model.get_decoder()(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"])[0]
    targets = tensors["labels"][:, 1:]  # the token at t + 1 is predicted at t
    counted = targets != IGNORE
    logits = model.get_output_embeddings()(hidden[:, :-1][counted])
    return torch.nn.functional.cross_entropy(logits.float(), targets[counted], reduction="none")


def accumulate_step(model: Any, batch: list[EncodedExample], pad_id: int) -> float:
    """Backpropagate the batch's loss (the mean over all its labelled tokens) one example at a time; the loss.

    A batch's activations kept for the backward pass grow with its size times its longest example (four transcripts
    of 2,048 tokens held ~7.5 GB beside the engine workers, which the OOM killer once ended); one example at a time
    holds a quarter of that at most, and pads nothing.
    """
    counted = sum(e.trained_tokens for e in batch)
    total = 0.0
    for example in batch:
        loss = labelled_token_losses(model, batch_tensors([example], pad_id)).sum() / counted
        loss.backward()
        total += loss.item()
    return total


def write_checkpoint(model: Any, parent_dir: Path, out_dir: Path) -> None:
    """Save `model` as a checkpoint that fits `parent_dir`'s: its parameter names and dtype, its other files."""
    import torch
    from safetensors.torch import save_file

    spec = read_spec(parent_dir)
    state = model.state_dict()
    missing = sorted(set(spec.parameters) - set(state))
    if missing:
        raise CheckpointMismatch(f"parameter {missing[0]!r}", "present", "missing", str(out_dir), str(parent_dir))
    dtype = getattr(torch, spec.dtype)
    out_dir.mkdir(parents=True)
    for path in sorted(parent_dir.iterdir()):
        if path.is_file() and not path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, out_dir / path.name)
    tensors = {name: state[name].detach().to(dtype=dtype, copy=True).contiguous() for name in spec.parameters}
    save_file(tensors, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    check_compatible(read_spec(out_dir), spec, str(out_dir), str(parent_dir))


StepDone = Callable[[int, float], None]
"""Told each optimizer step's number (1 for the first) and loss as it ends."""


def fine_tune(
    base_model_dir: Path,
    encoded: list[EncodedExample],
    out_dir: Path,
    config: ImproveConfig,
    on_step: StepDone | None = None,
) -> TrainingResult:
    """Train every parameter of `base_model_dir`'s model on `encoded` in this process, within `config`'s steps and
    seconds, and write the checkpoint to `out_dir` (which must not exist yet)."""
    started = time.monotonic()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists: a checkpoint is written to a new directory")
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    usable = [e for e in encoded if len(e.input_ids) <= config.max_tokens and e.trained_tokens]
    if not usable:
        raise ValueError(f"no example to train on ({len(encoded)} given, none with labelled tokens within budget)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    losses: list[float] = []
    tokens = trained = 0
    batches = _batches(usable, min(config.batch_size, len(usable)), config.seed)
    while len(losses) < config.max_steps and time.monotonic() - started < config.max_seconds:
        batch = next(batches)
        losses.append(accumulate_step(model, batch, pad_id))
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        tokens += sum(len(e.input_ids) for e in batch)
        trained += sum(e.trained_tokens for e in batch)
        if on_step is not None:
            on_step(len(losses), losses[-1])
    write_checkpoint(model, base_model_dir, out_dir)
    return TrainingResult(
        checkpoint_dir=str(out_dir),
        steps=len(losses),
        seconds=round(time.monotonic() - started, 3),
        stopped_by="max_steps" if len(losses) >= config.max_steps else "max_seconds",
        examples=len(usable),
        skipped=len(encoded) - len(usable),
        tokens=tokens,
        trained_tokens=trained,
        losses=losses,
        threads=torch.get_num_threads(),
        nice=os.nice(0),
    )


StepReports: TypeAlias = "multiprocessing.queues.Queue[tuple[int, float] | None]"
"""Each step's (number, loss) from the training process, then None once it ends."""

_steps_done: StepReports | None = None
"""In the training process: where its steps go back to the caller's `on_step` (set by `_start_trainer`)."""


def _start_trainer(threads: int, nice: int, steps_done: StepReports) -> None:
    """In the training process, before torch starts its thread pools: `threads` threads, priority lowered, and the
    queue its steps are reported on (a multiprocessing queue reaches a child only as it starts)."""
    global _steps_done
    _steps_done = steps_done
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    os.nice(nice)
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def _fine_tune_reporting(
    base_model_dir: Path, encoded: list[EncodedExample], out_dir: Path, config: ImproveConfig
) -> TrainingResult:
    """`fine_tune` in the training process, each step put on the queue, and None once it ends (however it ends)."""
    steps_done = _steps_done
    assert steps_done is not None
    try:
        return fine_tune(base_model_dir, encoded, out_dir, config, lambda step, loss: steps_done.put((step, loss)))
    finally:
        steps_done.put(None)


def train(
    base_model_dir: Path,
    encoded: list[EncodedExample],
    out_dir: Path,
    config: ImproveConfig,
    on_step: StepDone | None = None,
) -> TrainingResult:
    """`fine_tune` in a spawned child process, niced by `config.nice`, with `config.threads` torch threads; each
    step's number and loss reach `on_step` in this thread as the child reports them."""
    context = multiprocessing.get_context("spawn")
    steps_done: StepReports = context.Queue()
    with ProcessPoolExecutor(
        max_workers=1,
        mp_context=context,
        initializer=_start_trainer,
        initargs=(config.threads, config.nice, steps_done),
    ) as pool:
        result = pool.submit(_fine_tune_reporting, Path(base_model_dir), list(encoded), Path(out_dir), config)
        while (reported := _next_step(steps_done, result)) is not None:
            if on_step is not None:
                on_step(*reported)
        return result.result()


def _next_step(steps_done: StepReports, result: Future[TrainingResult]) -> tuple[int, float] | None:
    """The training process's next step, or None once it has said it ended, or died without saying so."""
    while True:
        try:
            return steps_done.get(timeout=0.25)
        except queue.Empty:
            if result.done() and result.exception() is not None:
                return None
