"""The tiny model's fine-tune runs on the one trainer: windows of its corpus, every token labelled, a checkpoint that
fits its parent. Registering it is the Leap tests' (tests/flows/test_leap.py)."""

from __future__ import annotations

import math
from pathlib import Path

from pronk.models.checkpoints import check_compatible, read_spec
from pronk.models.tiny_finetune import TINY_TRAINING, corpus_windows
from pronk.models.training import fine_tune


def test_a_few_steps_on_corpus_windows_write_a_checkpoint_that_fits_the_tiny_model(
    tiny_model_dir: Path, tmp_path: Path
):
    tiny = tiny_model_dir
    config = TINY_TRAINING.model_copy(update={"max_steps": 2})
    windows = corpus_windows(tiny, config)
    assert len(windows) == 2 * config.batch_size
    assert all(len(w.input_ids) == config.max_tokens and w.labels == w.input_ids for w in windows)

    result = fine_tune(tiny, windows, tmp_path / "v2", config)
    assert (result.steps, result.stopped_by, result.trained_tokens) == (2, "max_steps", 2 * 4 * 64)
    assert all(math.isfinite(loss) for loss in result.losses)
    check_compatible(read_spec(tmp_path / "v2"), read_spec(tiny), "v2", "tiny")
