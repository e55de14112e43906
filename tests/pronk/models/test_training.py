"""The one trainer on the tiny model: the labelled tokens' loss, a few bounded steps, a checkpoint that fits its parent
(the improve loop's transcripts are what it trains on here).

Nothing here asserts what a model writes: only labels, losses, budgets and checkpoint layouts.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pronk.improve.training_examples import TrainingExample, encode_example, encode_examples
from pronk.jobs.schema import ImproveConfig
from pronk.models.checkpoints import check_compatible, read_spec
from pronk.models.training import (
    EncodedExample,
    accumulate_step,
    batch_tensors,
    fine_tune,
    labelled_token_losses,
    train,
)
from tests.pronk.improve.test_training_examples import FINAL, MESSAGES


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> Path:
    return tiny_model_dir


@pytest.fixture(scope="module")
def tied(tmp_path_factory, tiny) -> Path:
    """A smaller model laid out as an imported SmolLM2: tied embeddings (no lm_head saved), bf16 safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tied") / "model"
    config = json.loads((tiny / "config.json").read_text())
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "tie_word_embeddings": True}
    model = LlamaForCausalLM(LlamaConfig(**{**config, **small}))
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, out / name)
    return out


def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("fixture", ["tiny", "tied"])
def test_the_labelled_loss_is_the_models_own_loss_made_from_the_counted_positions_alone(request, fixture):
    from transformers import AutoModelForCausalLM

    model_dir = request.getfixturevalue(fixture)
    tok = tokenizer(model_dir)
    short = [*MESSAGES[:3], {"role": "assistant", "content": FINAL}]
    batch = batch_tensors([encode_example(tok, MESSAGES), encode_example(tok, short)], tok.eos_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.testing.assert_close(labelled_token_losses(model, batch).mean(), model(**batch).loss)


def test_a_step_one_transcript_at_a_time_has_the_whole_batchs_loss_and_gradient(tiny):
    from transformers import AutoModelForCausalLM

    tok = tokenizer(tiny)
    examples = [encode_example(tok, MESSAGES), encode_example(tok, [*MESSAGES[:3], MESSAGES[-1]])]
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    whole = model(**batch_tensors(examples, tok.eos_token_id)).loss
    whole.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert accumulate_step(model, examples, tok.eos_token_id) == pytest.approx(whole.item(), rel=1e-5)
    for name, p in model.named_parameters():
        if name in expected:
            torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6)


def examples(model_dir: Path, n: int = 3) -> list[EncodedExample]:
    return encode_examples(model_dir, [TrainingExample(f"arith-{i}", f"arith-{i}#0", MESSAGES) for i in range(n)])


def test_a_few_steps_write_a_checkpoint_that_fits_its_parent(tiny, tmp_path):
    config = ImproveConfig(max_steps=2, max_seconds=120, learning_rate=1e-3, batch_size=2)
    result = fine_tune(tiny, examples(tiny), tmp_path / "ckpt", config)

    assert (result.steps, result.stopped_by, result.examples, result.skipped) == (2, "max_steps", 3, 0)
    assert len(result.losses) == 2 and all(math.isfinite(loss) for loss in result.losses)
    assert 0 < result.trained_tokens < result.tokens
    out = Path(result.checkpoint_dir)
    check_compatible(read_spec(out), read_spec(tiny), str(out), str(tiny))
    assert {p.name for p in tiny.iterdir()} == {p.name for p in out.iterdir()}
    assert (out / "tokenizer.json").read_bytes() == (tiny / "tokenizer.json").read_bytes()
    before, after = load_file(tiny / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_a_tied_bf16_parent_gets_a_tied_bf16_checkpoint(tied, tmp_path):
    assert "lm_head.weight" not in read_spec(tied).parameters
    config = ImproveConfig(max_steps=1, max_seconds=120, learning_rate=1e-3)
    out = Path(fine_tune(tied, examples(tied, 1), tmp_path / "ckpt", config).checkpoint_dir)
    spec = read_spec(out)
    check_compatible(spec, read_spec(tied), str(out), str(tied))
    assert spec.dtype == "bfloat16" and "lm_head.weight" not in spec.parameters


def test_the_time_budget_stops_training_before_its_steps(tiny, tmp_path):
    config = ImproveConfig(max_steps=10_000, max_seconds=0.5, learning_rate=1e-3)
    result = fine_tune(tiny, examples(tiny), tmp_path / "ckpt", config)
    assert result.stopped_by == "max_seconds" and result.steps < 10_000
    check_compatible(read_spec(tmp_path / "ckpt"), read_spec(tiny), "ckpt", "tiny")


def test_an_example_over_the_token_budget_is_left_out_and_none_left_is_refused(tiny, tmp_path):
    with pytest.raises(ValueError, match="no example to train on"):
        fine_tune(tiny, examples(tiny), tmp_path / "ckpt", ImproveConfig(max_steps=1, max_tokens=16))


def test_train_runs_in_a_niced_child_with_its_threads_and_leaves_the_caller_as_it_was(tiny, tmp_path):
    niceness, threads = os.nice(0), torch.get_num_threads()
    config = ImproveConfig(max_steps=2, threads=1, nice=5, learning_rate=1e-3)
    reported: list[tuple[int, float]] = []
    result = train(tiny, examples(tiny, 1), tmp_path / "ckpt", config, lambda step, loss: reported.append((step, loss)))
    assert (result.steps, result.threads) == (2, 1)
    assert reported == list(enumerate(result.losses, start=1))  # every step, as the child made it, in order
    assert result.nice == min(niceness + 5, 19)
    assert (os.nice(0), torch.get_num_threads()) == (niceness, threads)


def test_a_training_process_that_fails_raises_here_and_reports_no_step(tiny, tmp_path):
    reported: list[tuple[int, float]] = []
    with pytest.raises(ValueError, match="no example to train on"):
        config = ImproveConfig(max_steps=1, max_tokens=16)
        train(tiny, examples(tiny), tmp_path / "ckpt", config, lambda step, loss: reported.append((step, loss)))
    assert reported == []
