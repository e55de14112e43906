"""A plain chat line's prompt length in the job's own tokens, checked before any worker sees the line.

A byte-level BPE never makes more tokens than the rendered prompt has bytes, so a line whose
message bytes plus a template allowance stay below the job's `max_model_len` fits without
tokenizing. Nor does a token ever cover more bytes than the vocabulary's longest token, so a line
whose message bytes divided by that length reach the limit is too long without tokenizing. Only
lines between the two bounds (at most `max_model_len` × the longest token's bytes: tokenizing a
4 MB line of one repeated byte took 18.6 s here, a 128 KB one 0.23 s) are tokenized, with the job's
tokenizer, loaded once per run and only when such a line appears. Where the tokenizer cannot be
loaded the count is unknown and the worker's own check (HTTP 400, `request_rejected`) is the backstop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pronk.batches.input import InputLimits
from pronk.jobs.schema import JobConfig
from pronk.protocol.bodies import ChatCompletionBody
from pronk.settings import Settings

logger = logging.getLogger(__name__)

TEMPLATE_BYTES = 512
"""Bytes a chat template may add around the whole conversation (generation prompt, BOS, system default)."""
TEMPLATE_BYTES_PER_MESSAGE = 64
"""Bytes a chat template may add around each message (role markers, separators)."""


def byte_bound(body: ChatCompletionBody) -> int:
    """An upper bound on the prompt's tokens under a byte-level BPE with an ordinary chat template."""
    messages = sum(len(m.text().encode()) + TEMPLATE_BYTES_PER_MESSAGE for m in body.messages)
    return messages + TEMPLATE_BYTES


class PromptLength:
    """Counts prompt tokens as the worker will (chat template, then encode), tokenizing only lines that need it."""

    def __init__(self, job: JobConfig, load_tokenizer: Callable[[], Any]):
        self.limit = job.engine.max_model_len
        self._load = load_tokenizer
        self._tokenizer: Any = None
        self._longest_token = 1
        self._unavailable = False
        self.tokenized = 0

    def _get_tokenizer(self) -> Any:
        if self._tokenizer is None and not self._unavailable:
            try:
                self._tokenizer = self._load()
                self._longest_token = max((len(t.encode()) for t in self._tokenizer.get_vocab()), default=1)
            except Exception:
                logger.warning(
                    "cannot load the job's tokenizer: long prompts go to the workers unchecked", exc_info=True
                )
                self._unavailable = True
        return self._tokenizer

    def __call__(self, body: ChatCompletionBody) -> int | None:
        """The prompt's tokens, or a bound on them that decides the limit either way; None when unknown."""
        bound = byte_bound(body)
        if bound < self.limit:
            return bound
        tokenizer = self._get_tokenizer()
        if tokenizer is None:
            return None
        at_least = sum(len(m.text().encode()) for m in body.messages) // self._longest_token
        if at_least >= self.limit:
            return at_least
        self.tokenized += 1
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tokenizer.encode(text, add_special_tokens=False))


def job_tokenizer(job: JobConfig, settings: Settings) -> Any:
    """The tokenizer of the job's model, as its workers load it (the model's directory, resolved once)."""
    from transformers import AutoTokenizer

    from pronk.models.registry import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(job.model, settings).path))


def input_limits(job: JobConfig, settings: Settings) -> InputLimits:
    """The limits every line of a batch for `job` is validated against (the job's tokenizer loads on first need)."""
    return InputLimits(
        max_line_bytes=settings.max_line_bytes, prompt_tokens=PromptLength(job, lambda: job_tokenizer(job, settings))
    )
