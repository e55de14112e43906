"""Transcripts as training examples on the tiny model's chat template: the assistant's tokens labelled, the rest not.

Nothing here asserts what a model writes: only token spans and labels.
"""

from __future__ import annotations

import copy

import pytest

from pronk.improve.training_examples import TemplateMismatch, encode_example
from pronk.models.training import IGNORE

CALL = '{"tool": "python", "arguments": {"code": "2 * 3"}}'
FINAL = '{"final": "6"}'
MESSAGES = [
    {"role": "system", "content": "You are an agent. Tools: python."},
    {"role": "system", "content": "Call the tool once, then answer."},
    {"role": "user", "content": "Use python to compute 2 * 3."},
    {"role": "assistant", "content": CALL},
    {"role": "tool", "content": "[python ok] 6"},
    {"role": "assistant", "content": FINAL},
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def trained_spans(encoded, tok) -> list[str]:
    spans, current = [], []
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        if label != IGNORE:
            assert label == token
            current.append(token)
        elif current:
            spans.append(tok.decode(current))
            current = []
    return [*spans, tok.decode(current)] if current else spans


def test_only_the_assistant_outputs_and_their_end_of_turn_are_trained_on(tok):
    encoded = encode_example(tok, MESSAGES)
    assert trained_spans(encoded, tok) == [CALL + "<|end|>", FINAL + "<|end|>"]
    # The whole text is the worker's rendering; each step's prompt, as the worker sent it, is a prefix of it.
    text = tok.apply_chat_template(MESSAGES, tokenize=False)
    assert encoded.input_ids == tok.encode(text, add_special_tokens=False)
    prompt = tok.apply_chat_template(MESSAGES[:5], add_generation_prompt=True, tokenize=False)
    assert text.startswith(prompt) and encoded.trained_tokens == sum(1 for x in encoded.labels if x != IGNORE)


def test_a_template_that_does_not_extend_the_prompt_is_refused(tok):
    tok = copy.deepcopy(tok)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    with pytest.raises(TemplateMismatch, match="message 3"):
        encode_example(tok, MESSAGES)
