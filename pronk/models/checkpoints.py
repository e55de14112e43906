"""Checkpoint compatibility: what a Hugging Face directory's weights look like, their tags, whether they fit a model.

A checkpoint can replace a running model's weights in place only if it has the same architecture,
the same dtype and exactly the same parameter names and shapes. `CheckpointSpec` reads that from
`config.json` and the safetensors headers (no tensor is loaded), so it is cheap enough to run on
every upload and again on every worker before a reload.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pronk.errors import PronkError

SAFETENSORS_DTYPES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
}


class CheckpointMismatch(PronkError, ValueError):
    """A checkpoint that cannot replace the model's weights; the message names the first difference."""

    def __init__(self, what: str, expected: object, got: object, src: str, reference: str):
        self.what, self.expected, self.got = what, expected, got
        super().__init__(f"checkpoint {src} does not fit {reference}: {what} is {got}, expected {expected}")


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    """Architecture, dtype and parameter shapes of one checkpoint directory."""

    architecture: str
    dtype: str
    parameters: dict[str, tuple[int, ...]]

    @property
    def param_hash(self) -> str:
        """sha256 over the sorted `name:shape` lines: equal hashes mean the same parameter layout."""
        lines = "\n".join(f"{name}:{list(shape)}" for name, shape in sorted(self.parameters.items()))
        return hashlib.sha256(lines.encode()).hexdigest()[:16]

    @property
    def parameter_count(self) -> int:
        total = 0
        for shape in self.parameters.values():
            count = 1
            for dim in shape:
                count *= dim
            total += count
        return total


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def read_spec(directory: Path) -> CheckpointSpec:
    """Read a checkpoint's spec from `config.json` and its `*.safetensors` headers."""
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"checkpoint {directory}: no config.json")
    config = json.loads(config_path.read_text())
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"checkpoint {directory}: no *.safetensors files")
    parameters: dict[str, tuple[int, ...]] = {}
    dtypes: Counter[str] = Counter()
    for file in files:
        for name, info in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            parameters[name] = tuple(info["shape"])
            dtypes[SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"])] += 1
    architectures = config.get("architectures") or [config.get("model_type", "unknown")]
    return CheckpointSpec(architecture=architectures[0], dtype=dtypes.most_common(1)[0][0], parameters=parameters)


def check_compatible(candidate: CheckpointSpec, reference: CheckpointSpec, src: str, reference_name: str) -> None:
    """Raise `CheckpointMismatch` naming the first difference between `candidate` and `reference`."""
    if candidate.architecture != reference.architecture:
        raise CheckpointMismatch("architecture", reference.architecture, candidate.architecture, src, reference_name)
    if candidate.dtype != reference.dtype:
        raise CheckpointMismatch("dtype", reference.dtype, candidate.dtype, src, reference_name)
    for name, shape in reference.parameters.items():
        if name not in candidate.parameters:
            raise CheckpointMismatch(f"parameter {name!r}", f"shape {list(shape)}", "missing", src, reference_name)
        if candidate.parameters[name] != shape:
            raise CheckpointMismatch(
                f"parameter {name!r} shape", list(shape), list(candidate.parameters[name]), src, reference_name
            )
    extra = sorted(set(candidate.parameters) - set(reference.parameters))
    if extra:
        raise CheckpointMismatch(
            f"parameter {extra[0]!r}", "absent", f"shape {list(candidate.parameters[extra[0]])}", src, reference_name
        )


def checkpoint_tags(
    spec: CheckpointSpec, parent_version: int | None = None, source: str | None = None
) -> dict[str, str]:
    """The MLflow model version tags pronk writes for a checkpoint."""
    tags = {
        "architecture": spec.architecture,
        "dtype": spec.dtype,
        "param_hash": spec.param_hash,
        "parameters": str(spec.parameter_count),
    }
    if parent_version is not None:
        tags["parent_version"] = str(parent_version)
    if source:
        tags["source"] = source
    return tags
