"""A real weight change to push: a few seconds of next-token training of the tiny model on the project's own text.

`finetune` starts from one registered version, trains every parameter on windows of the tiny model's corpus with
the one trainer (`pronk.models.training`, every token labelled), and registers the result as the next version
(validated against its parent, so it is always a checkpoint a running fleet can leap to). `pronk model
finetune-tiny` runs it; the Leap tests and benchmarks use it for a second version.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from pronk import paths
from pronk.jobs.schema import ImproveConfig
from pronk.models.training import EncodedExample, fine_tune
from pronk.models.versions import UploadResult, upload_checkpoint
from pronk.settings import Settings

TINY_SOURCE = "models:/pronk-tiny@live"
TINY_TRAINING = ImproveConfig(max_steps=12, learning_rate=3e-3, batch_size=4, max_tokens=64, seed=0)
"""A few seconds on one core: 12 AdamW steps of 4 windows of 64 tokens."""


class FinetuneResult(UploadResult):
    """The new version plus what training did."""

    first_loss: float
    last_loss: float
    train_seconds: float


def corpus_windows(model_dir: Path, config: ImproveConfig) -> list[EncodedExample]:
    """`max_steps * batch_size` windows of `max_tokens` tokens of the tiny model's corpus, drawn by `config.seed`,
    each trained on whole."""
    from transformers import AutoTokenizer

    from pronk.models.tiny_model import corpus_files

    tokenizer = AutoTokenizer.from_pretrained(model_dir, model_max_length=1 << 30)
    text = "\n".join(path.read_text(errors="ignore") for path in corpus_files())
    tokens = tokenizer.encode(text, add_special_tokens=False)
    width = config.max_tokens
    rng = random.Random(config.seed)
    starts = [rng.randrange(len(tokens) // width) * width for _ in range(config.max_steps * config.batch_size)]
    return [EncodedExample(tokens[s : s + width], tokens[s : s + width]) for s in starts]


def finetune(settings: Settings, source: str = TINY_SOURCE, config: ImproveConfig = TINY_TRAINING) -> FinetuneResult:
    """Train from `source` (`models:/NAME@ALIAS` or `models:/NAME/N`) and register the result as the next version of
    the same model."""
    from pronk.models.registry import is_models_uri, models_uri, parse_models_uri, resolve_model

    if not is_models_uri(source):
        raise ValueError(f"finetune source {source!r}: expected models:/NAME@ALIAS or models:/NAME/N")
    name = parse_models_uri(source)[0]
    parent = resolve_model(source, settings)
    work = paths.under(settings.data_dir / "build", f"finetune-{paths.component(name)}-{time.time_ns()}")
    try:
        training = fine_tune(parent.path, corpus_windows(parent.path, config), work, config)
        parent_uri = models_uri(parent.version)
        upload = upload_checkpoint(
            str(work), name, job_model=parent_uri, settings=settings, source_tag=f"finetune of {parent_uri}"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return FinetuneResult(
        **upload.model_dump(),
        first_loss=training.losses[0],
        last_loss=training.losses[-1],
        train_seconds=training.seconds,
    )
