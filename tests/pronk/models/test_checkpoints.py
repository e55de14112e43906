"""Checkpoint specs, hashes and the first-mismatch message on small safetensors files; uploads from moto's S3 server."""

from __future__ import annotations

import json
import re
import struct

import pytest
import torch
from safetensors.torch import save_file

from pronk.models.checkpoints import (
    CheckpointMismatch,
    CorruptCheckpoint,
    check_compatible,
    checkpoint_tags,
    read_spec,
)
from pronk.settings import get_settings

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


# Two float32 [16, 8] tensors of 512 bytes each, tiling a 1024-byte data section as the format requires.
WHOLE = {"model.embed_tokens.weight": ("F32", [16, 8], [0, 512]), "lm_head.weight": ("F32", [16, 8], [512, 1024])}


def raw_checkpoint(path, tensors=WHOLE, data_size=1024):
    """A checkpoint whose safetensors header and data section are written as given, true to their bytes or not."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    entries = {name: {"dtype": d, "shape": s, "data_offsets": o} for name, (d, s, o) in tensors.items()}
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}).encode()
    header += b" " * (-len(header) % 8)
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(data_size))
    return path


CORRUPT = {
    "truncated": (
        {},
        1000,
        "tensor 'lm_head.weight' spans bytes [512, 1024), past the end of the 1000-byte data section",
    ),
    "range-past-data": (
        {"lm_head.weight": ("F32", [16, 9], [512, 1088])},
        1024,
        "tensor 'lm_head.weight' spans bytes [512, 1088), past the end of the 1024-byte data section",
    ),
    "overlap": (
        {"lm_head.weight": ("F32", [16, 8], [448, 960])},
        960,
        "tensor 'lm_head.weight' starts at byte 448, overlapping tensor 'model.embed_tokens.weight', which ends at 512",
    ),
    "gap": (
        {"lm_head.weight": ("F32", [16, 8], [528, 1040])},
        1040,
        "tensor 'lm_head.weight' starts at byte 528, leaving bytes [512, 528) after tensor 'model.embed_tokens.weight'",
    ),
    "shape-vs-bytes": (
        {"lm_head.weight": ("F16", [16, 8], [512, 1024])},
        1024,
        "tensor 'lm_head.weight' is F16 [16, 8] (256 bytes) but spans 512 bytes [512, 1024)",
    ),
    "unknown-dtype": (
        {"lm_head.weight": ("F12", [16, 8], [512, 1024])},
        1024,
        "tensor 'lm_head.weight' has unknown dtype 'F12'",
    ),
    "trailing-garbage": (
        {},
        1040,
        "tensor 'lm_head.weight' ends at data byte 1024, but 16 trailing bytes follow it in the file",
    ),
}


def corrupt_checkpoint(path, case):
    changes, data_size, _ = CORRUPT[case]
    return raw_checkpoint(path, {**WHOLE, **changes}, data_size)


def test_a_checkpoint_whose_headers_describe_its_files_whole_passes(tmp_path):
    assert read_spec(raw_checkpoint(tmp_path / "raw")).parameters == {name: (16, 8) for name in WHOLE}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    shards = [
        {"a.weight": torch.zeros(3, 5, dtype=torch.bfloat16), "a.empty": torch.zeros(0, 4), "a.ids": torch.ones(7)},
        {"b.weight": torch.zeros(2, 3, dtype=torch.int8), "b.mask": torch.zeros(5, dtype=torch.bool)},
    ]
    for i, tensors in enumerate(shards):
        save_file(tensors, sharded / f"model-0000{i + 1}-of-00002.safetensors")
    assert set(read_spec(sharded).parameters) == {name for tensors in shards for name in tensors}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_safetensors_file_is_refused_naming_the_file_and_the_tensor(tmp_path, case):
    directory = corrupt_checkpoint(tmp_path / case, case)
    with pytest.raises(CorruptCheckpoint, match=re.escape(CORRUPT[case][2])) as caught:
        read_spec(directory)
    assert f"checkpoint file {directory / 'model.safetensors'} is corrupt: tensor 'lm_head.weight' " in str(
        caught.value
    )
    assert isinstance(caught.value, CheckpointMismatch)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x10\x00", "header is missing: the file is 2 bytes"),
        (struct.pack("<Q", 64) + b"{}", "header is 64 bytes but the file has only 2 after its length"),
        (struct.pack("<Q", 8) + b"{not js}", "header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "header is a JSON list, not an object"),
        (struct.pack("<Q", 24) + b'{"w": {"dtype": "F32"}} ', "tensor 'w' has a malformed entry"),
    ],
    ids=["no-length", "header-past-end", "not-json", "not-an-object", "malformed-entry"],
)
def test_a_broken_safetensors_header_is_refused(tmp_path, content, message):
    directory = raw_checkpoint(tmp_path / "broken")
    (directory / "model.safetensors").write_bytes(content)
    with pytest.raises(CorruptCheckpoint, match=re.escape(message)):
        read_spec(directory)


def test_upload_registers_nothing_from_a_corrupt_checkpoint(tmp_path):
    from pronk.models.registry import latest_version
    from pronk.models.versions import upload_checkpoint
    from pronk.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", storage_uri=str(tmp_path / "store"), s3_endpoint_url=None)
    first = upload_checkpoint(str(raw_checkpoint(tmp_path / "whole")), "pronk-corrupt-test", settings=settings)
    for case in CORRUPT:
        directory = corrupt_checkpoint(tmp_path / case, case)
        with pytest.raises(CorruptCheckpoint, match=re.escape(CORRUPT[case][2])):
            upload_checkpoint(str(directory), "pronk-corrupt-test", settings=settings)
    assert latest_version("pronk-corrupt-test", settings) == first.version


def test_leap_refuses_a_corrupt_version_registered_before_the_check(tmp_path):
    from pronk.leap.sequence import LeapRefused, check_fits
    from pronk.models.registry import register_model_dir
    from pronk.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", storage_uri=str(tmp_path / "store"), s3_endpoint_url=None)
    register_model_dir(raw_checkpoint(tmp_path / "whole"), "pronk-corrupt-test", settings=settings)
    register_model_dir(corrupt_checkpoint(tmp_path / "gap", "gap"), "pronk-corrupt-test", settings=settings)
    with pytest.raises(LeapRefused, match=re.escape(CORRUPT["gap"][2])):
        check_fits("models:/pronk-corrupt-test/2", "pronk-corrupt-test/1", settings)


def test_a_worker_refuses_to_stage_a_corrupt_checkpoint(tmp_path):
    from pronk.engine.weight_swap import IncompatibleWeights
    from pronk.stack.worker import stage_checkpoint

    served = raw_checkpoint(tmp_path / "served")
    truncated = corrupt_checkpoint(tmp_path / "truncated", "truncated")
    with pytest.raises(IncompatibleWeights, match=re.escape(CORRUPT["truncated"][2])):
        stage_checkpoint(str(truncated), str(served), "local:served", get_settings())
    assert stage_checkpoint(str(served), str(served), "local:served", get_settings()).path == str(served)
