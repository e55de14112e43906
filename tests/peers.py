"""Output and error lines checked against the peers' own models: vLLM's `BatchRequestOutput`, and the official
`openai` client's `ChatCompletion` (a response body) and `BatchError` (an error)."""

from __future__ import annotations


def how_lines_ended(written: list[dict]) -> dict[str, str]:
    """Each line's custom id → `ok` or its error code, after checking the line against both peers' models."""
    from openai.types import BatchError
    from openai.types.chat import ChatCompletion
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    for line in written:
        BatchRequestOutput.model_validate(line)
        if line["error"]:
            BatchError.model_validate(line["error"])
        else:
            ChatCompletion.model_validate(line["response"]["body"])
    return {line["custom_id"]: line["error"]["code"] if line["error"] else "ok" for line in written}
