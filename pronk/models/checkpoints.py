"""Checkpoint compatibility: what a Hugging Face directory's weights look like, their tags, whether they fit a model.

A checkpoint can replace a running model's weights in place only if it has the same architecture,
the same dtype and exactly the same parameter names and shapes. `CheckpointSpec` reads that from
`config.json` and the safetensors headers (no tensor is loaded), so it is cheap enough to run on
every upload and again on every worker before a reload.

Reading a header also checks that it describes its file whole (`CorruptCheckpoint` otherwise): a
truncated or hand-edited file has a header that parses fine, and vLLM would only fail on it at reload,
after it had been registered and staged everywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pronk.pronk_error import PronkError

# safetensors dtype → (the name a spec and its tags use, bytes per element); any other dtype is refused.
SAFETENSORS_DTYPES = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "C64": ("complex64", 8),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}


class CheckpointMismatch(PronkError, ValueError):
    """A checkpoint that cannot replace the model's weights; the message names the first difference."""

    def __init__(self, what: str, expected: object, got: object, src: str, reference: str):
        self.what, self.expected, self.got = what, expected, got
        super().__init__(f"checkpoint {src} does not fit {reference}: {what} is {got}, expected {expected}")


class CorruptCheckpoint(CheckpointMismatch):
    """A safetensors file whose header does not describe its bytes; the message names the file and the tensor.

    A `CheckpointMismatch` (such a file cannot replace any weights) so that every place that refuses a
    checkpoint which does not fit refuses this one too: upload, Leap, and a worker staging a version.
    """

    def __init__(self, file: Path, tensor: str | None, problem: str):
        self.file, self.tensor = file, tensor
        self.what = "header" if tensor is None else f"tensor {tensor!r}"
        self.expected, self.got = "a whole safetensors file", problem
        PronkError.__init__(self, f"checkpoint file {file} is corrupt: {self.what} {problem}")


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


def _tensor_entries(path: Path) -> tuple[dict[str, dict], int]:
    """The tensor entries of a safetensors header, well-formed, and the size of the data section after it."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 8:
            raise CorruptCheckpoint(path, None, f"is missing: the file is {size} bytes, shorter than its length field")
        (length,) = struct.unpack("<Q", f.read(8))
        if 8 + length > size:
            raise CorruptCheckpoint(path, None, f"is {length} bytes but the file has only {size - 8} after its length")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise CorruptCheckpoint(path, None, f"is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CorruptCheckpoint(path, None, f"is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    for name, info in header.items():
        if not (
            isinstance(info, dict)
            and isinstance(info.get("dtype"), str)
            and isinstance(info.get("shape"), list)
            and all(isinstance(d, int) and d >= 0 for d in info["shape"])
            and isinstance(info.get("data_offsets"), list)
            and len(info["data_offsets"]) == 2
            and all(isinstance(o, int) for o in info["data_offsets"])
            and 0 <= info["data_offsets"][0] <= info["data_offsets"][1]
        ):
            raise CorruptCheckpoint(path, name, f"has a malformed entry {json.dumps(info)[:200]}")
    return header, size - 8 - length


def _checked_header(path: Path) -> dict[str, dict]:
    """A safetensors file's tensor entries, once checked to describe the file whole; `CorruptCheckpoint` if not.

    Each tensor's dtype is known, its shape's element count times the dtype's size is its byte length,
    and the tensors tile the data section exactly as the format requires: in offset order each starts
    where the one before ends (no overlap, no gap), the first at 0, and the last ends where the file
    does (so no truncation and no trailing bytes). Only the header and the file's size are read.
    """
    entries, data_size = _tensor_entries(path)
    end, previous = 0, None
    for name, info in sorted(entries.items(), key=lambda item: (item[1]["data_offsets"], item[0])):
        dtype, shape, (begin, stop) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise CorruptCheckpoint(path, name, f"has unknown dtype {dtype!r}")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        if nbytes != stop - begin:
            raise CorruptCheckpoint(
                path, name, f"is {dtype} {shape} ({nbytes} bytes) but spans {stop - begin} bytes [{begin}, {stop})"
            )
        if stop > data_size:
            raise CorruptCheckpoint(
                path,
                name,
                f"spans bytes [{begin}, {stop}), past the end of the {data_size}-byte data section "
                "(a truncated file, or a header that claims more than the file holds)",
            )
        after = "the start of the data section" if previous is None else f"tensor {previous!r}"
        if begin < end:
            raise CorruptCheckpoint(path, name, f"starts at byte {begin}, overlapping {after}, which ends at {end}")
        if begin > end:
            raise CorruptCheckpoint(path, name, f"starts at byte {begin}, leaving bytes [{end}, {begin}) after {after}")
        end, previous = stop, name
    if end != data_size:
        raise CorruptCheckpoint(
            path, previous, f"ends at data byte {end}, but {data_size - end} trailing bytes follow it in the file"
        )
    return entries


def read_spec(directory: Path) -> CheckpointSpec:
    """Read a checkpoint's spec from `config.json` and its `*.safetensors` headers, each checked against its file."""
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
        for name, info in _checked_header(file).items():
            parameters[name] = tuple(info["shape"])
            dtypes[SAFETENSORS_DTYPES[info["dtype"]][0]] += 1
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
