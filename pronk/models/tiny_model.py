"""Make pronk's tiny model locally: a byte-level BPE tokenizer and a random-init Llama, no hub involved."""

from __future__ import annotations

import json
from pathlib import Path

from pronk.settings import PROJECT_ROOT

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
VOCAB_SIZE = 4096


def corpus_files() -> list[Path]:
    """Text the project ships: its corpus folder, docs and sources, each file once (pronk/engine and pronk/flows
    are links to the engine/ and flows/ folders, which count as their own roots)."""
    roots = [PROJECT_ROOT / "data", PROJECT_ROOT / "pronk", PROJECT_ROOT / "engine", PROJECT_ROOT / "flows"]
    files = [PROJECT_ROOT / "README.md"]
    for root in roots:
        inside = root.resolve()
        files += sorted(
            p
            for p in root.rglob("*")
            if p.suffix in {".txt", ".md", ".py", ".jsonl"} and p.resolve().is_relative_to(inside)
        )
    return [f for f in files if f.is_file()]


def train_tokenizer(out_dir: Path) -> None:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(p) for p in corpus_files()], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def build_model(out_dir: Path, seed: int = 0) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=SPECIAL_TOKENS.index("<|bos|>"),
        eos_token_id=SPECIAL_TOKENS.index("<|end|>"),
        pad_token_id=SPECIAL_TOKENS.index("<|pad|>"),
        dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id})
    )


def make_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Write a complete Hugging Face model directory (safetensors, tokenizer.json, chat template)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out_dir)
    build_model(out_dir, seed=seed)
    return out_dir
