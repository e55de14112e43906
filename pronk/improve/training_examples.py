"""The improve loop's training examples: selected transcripts, encoded as the worker renders them, labelled on the
assistant's tokens.

Each transcript is rendered with the model's own chat template and tokenized exactly as the worker renders a
prompt (`pronk.engine.vllm_backend`: `apply_chat_template(..., tokenize=False)`, then `encode` without special tokens),
so the text trained on is the text served. The loss is on the assistant's tokens only: each assistant message's
content and the end-of-turn token that stopped it, found as the tokens between the prompt the worker sent for that
step (`add_generation_prompt=True`) and the conversation through that message; everything else is IGNORE. The
trainer (`pronk.models.training`) takes the encoded examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pronk.models.training import IGNORE, EncodedExample
from pronk.pronk_error import PronkError


class TemplateMismatch(PronkError, ValueError):
    """The chat template does not render a step's prompt as a prefix of the whole conversation, so no token span is
    that step's output (a template that rewrites earlier turns, say)."""


@dataclass(frozen=True, slots=True)
class TrainingExample:
    """One selected transcript: its task, the sample it came from, its messages as the worker rendered them."""

    task_id: str
    custom_id: str
    messages: list[dict[str, str]]


def render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` as the worker makes a prompt of them."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def encode_example(tokenizer: Any, messages: list[dict[str, str]]) -> EncodedExample:
    """The conversation's tokens, labelled on each assistant message's content and the end-of-turn token after it."""
    ids = render(tokenizer, messages, add_generation_prompt=False)
    labels = [IGNORE] * len(ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render(tokenizer, messages[:index], add_generation_prompt=True)
        through = render(tokenizer, messages[: index + 1], add_generation_prompt=False)
        if ids[: len(prompt)] != prompt or ids[: len(through)] != through:
            raise TemplateMismatch(f"message {index}: the chat template's prompt for it is no prefix of the whole")
        start, end = len(prompt), len(through)
        stops = [i for i in range(start, end) if ids[i] == tokenizer.eos_token_id]
        end = stops[-1] + 1 if stops else end  # what follows the end-of-turn token (a newline) is never generated
        labels[start:end] = ids[start:end]
    return EncodedExample(ids, labels)


def encode_examples(model_dir: Path, examples: list[TrainingExample]) -> list[EncodedExample]:
    """Every example encoded with the tokenizer and chat template of the model in `model_dir`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [encode_example(tokenizer, example.messages) for example in examples]
