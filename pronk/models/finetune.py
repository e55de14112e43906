"""A real weight change to push: a few seconds of next-token training on the project's own text, on CPU.

`finetune` starts from one registered version, trains every parameter with AdamW on chunks of the
tiny model's corpus, and registers the result as the next version (validated against its parent,
so it is always a checkpoint a running fleet can leap to).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pydantic import BaseModel, Field

from pronk import paths
from pronk.models.versions import UploadResult, upload_checkpoint
from pronk.settings import Settings


class FinetuneConfig(BaseModel):
    """How long and how hard to train."""

    source: str = Field(
        default="models:/pronk-tiny@live",
        description="Model URI to start from: `models:/NAME@ALIAS` or `models:/NAME/N`.",
    )
    steps: int = Field(default=12, ge=1, le=10_000, description="Optimizer steps.")
    learning_rate: float = Field(default=3e-3, gt=0, le=1, description="AdamW learning rate.")
    batch_size: int = Field(default=4, ge=1, description="Sequences per step.")
    seq_len: int = Field(default=64, ge=8, description="Tokens per sequence.")
    seed: int = Field(default=0, description="Seed of the data order and the optimizer.")


class FinetuneResult(UploadResult):
    """The new version plus what training did."""

    first_loss: float
    last_loss: float
    train_seconds: float


def _training_tokens(tokenizer) -> list[int]:
    from pronk.models.tiny_model import corpus_files

    text = "\n".join(path.read_text(errors="ignore") for path in corpus_files())
    return tokenizer.encode(text, add_special_tokens=False)


def _train(model_dir: Path, config: FinetuneConfig) -> tuple[float, float]:
    """Train the checkpoint in `model_dir` in place; return the first and last batch losses."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, model_max_length=1 << 30)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    tokens = torch.tensor(_training_tokens(tokenizer), dtype=torch.long)
    windows = tokens[: len(tokens) // config.seq_len * config.seq_len].view(-1, config.seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    losses = []
    for _ in range(config.steps):
        batch = windows[torch.randint(len(windows), (config.batch_size,))]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.save_pretrained(model_dir, safe_serialization=True)
    return losses[0], losses[-1]


def finetune(config: FinetuneConfig, settings: Settings) -> FinetuneResult:
    """Train from `config.source` and register the result as the next version of the same model."""
    from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, resolve_model

    if not is_models_uri(config.source):
        raise ValueError(f"finetune source {config.source!r}: expected models:/NAME@ALIAS or models:/NAME/N")
    name = parse_models_uri(config.source)[0]
    parent = resolve_model(config.source, settings)
    work = paths.under(settings.data_dir / "build", f"finetune-{paths.component(name)}-{time.time_ns()}")
    shutil.copytree(parent.path, work)
    try:
        started = time.monotonic()
        first, last = _train(work, config)
        seconds = time.monotonic() - started
        parent_uri = models_uri(parent.version)
        upload = upload_checkpoint(
            str(work), name, job_model=parent_uri, settings=settings, source_tag=f"finetune of {parent_uri}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return FinetuneResult(**upload.model_dump(), first_loss=first, last_loss=last, train_seconds=seconds)
