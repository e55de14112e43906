"""Checkpoint specs, hashes and the first-mismatch message on small safetensors files; uploads from moto's S3 server."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from pronk.models.checkpoints import (
    CheckpointMismatch,
    check_compatible,
    checkpoint_tags,
    read_spec,
)
from pronk.models.leap import LeapRecord, WorkerLeap

SHAPES = {"model.embed_tokens.weight": (16, 8), "model.layers.0.mlp.up_proj.weight": (12, 8), "lm_head.weight": (16, 8)}


def checkpoint(path, shapes=SHAPES, dtype=torch.float32, architecture="LlamaForCausalLM"):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    save_file({name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}, path / "model.safetensors")
    return read_spec(path)


def test_spec_reads_shapes_and_dtype_from_headers_and_hashes_the_layout(tmp_path):
    spec = checkpoint(tmp_path / "a")
    assert spec.architecture == "LlamaForCausalLM" and spec.dtype == "float32"
    assert spec.parameters == SHAPES and spec.parameter_count == 16 * 8 * 2 + 12 * 8
    assert spec.param_hash == checkpoint(tmp_path / "b").param_hash
    other = checkpoint(tmp_path / "c", {**SHAPES, "lm_head.weight": (17, 8)})
    assert other.param_hash != spec.param_hash
    tags = checkpoint_tags(spec, parent_version=1, source="s3://b/ckpt")
    assert tags == {
        "architecture": "LlamaForCausalLM",
        "dtype": "float32",
        "param_hash": spec.param_hash,
        "parameters": str(spec.parameter_count),
        "parent_version": "1",
        "source": "s3://b/ckpt",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architecture": "MistralForCausalLM"}, "architecture is MistralForCausalLM, expected LlamaForCausalLM"),
        ({"dtype": torch.bfloat16}, "dtype is bfloat16, expected float32"),
        (
            {"shapes": {**SHAPES, "model.layers.0.mlp.up_proj.weight": (10, 8)}},
            "'model.layers.0.mlp.up_proj.weight' shape is [10, 8], expected [12, 8]",
        ),
        ({"shapes": {k: v for k, v in SHAPES.items() if k != "lm_head.weight"}}, "'lm_head.weight' is missing"),
        ({"shapes": {**SHAPES, "extra.bias": (3,)}}, "'extra.bias' is shape [3], expected absent"),
    ],
    ids=["architecture", "dtype", "shape", "missing", "extra"],
)
def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_first_mismatch(tmp_path, change, message):
    reference = checkpoint(tmp_path / "ref")
    candidate = checkpoint(tmp_path / "new", **change)
    with pytest.raises(CheckpointMismatch, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        check_compatible(candidate, reference, "new", "pronk-tiny/1")
    assert "checkpoint new does not fit pronk-tiny/1" in str(caught.value)
    check_compatible(reference, reference, "ref", "pronk-tiny/1")


def test_leap_record_switch_time_spans_first_pause_to_last_resume():
    record = LeapRecord(job_id="job-c0ffee01", model="m", to_version="m/2")
    record.workers = {
        "w0": WorkerLeap(worker_id="w0", url="u", version="m/2", paused_at=10.0, resumed_at=10.2),
        "w1": WorkerLeap(worker_id="w1", url="u", version="m/2", paused_at=10.1, resumed_at=10.5),
    }
    record.finish("completed", "ok")
    assert record.switch_seconds == pytest.approx(0.5)
    assert [row["paused → resumed s"] for row in record.table()] == [0.2, 0.4]


def test_upload_reads_a_checkpoint_from_s3_and_registers_nothing_that_does_not_fit(settings, tmp_path):
    from pronk import storage
    from pronk.models.registry import latest_version
    from pronk.models.versions import upload_checkpoint

    fs = storage.filesystem("s3://pronk-test", settings)
    for name, shapes in (("fits", SHAPES), ("wrong", {**SHAPES, "lm_head.weight": (16, 9)})):
        checkpoint(tmp_path / name, shapes)
        fs.put(str(tmp_path / name) + "/", f"pronk-test/ckpts/{name}/", recursive=True)
    first = upload_checkpoint("s3://pronk-test/ckpts/fits", "pronk-s3-test", settings=settings)
    assert (
        first.tags["source"] == "s3://pronk-test/ckpts/fits"
        and first.tags["param_hash"] == read_spec(tmp_path / "fits").param_hash
    )
    with pytest.raises(CheckpointMismatch, match=r"'lm_head.weight' shape is \[16, 9\], expected \[16, 8\]"):
        upload_checkpoint("s3://pronk-test/ckpts/wrong", "pronk-s3-test", settings=settings)
    assert latest_version("pronk-s3-test", settings) == first.version
