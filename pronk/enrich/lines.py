"""Rows made into agent lines: the OpenAI batch lines `run_batch` takes, with the answer constrained to the outputs.

The table's values are hostile text: they only ever fill the user message; the system message (what
to fill and how) comes from the spec alone.
"""

from __future__ import annotations

import json
from typing import Any

from pronk.enrich.spec import EnrichSpec
from pronk.jobs.schema import JobConfig

MAX_VALUE_CHARS = 4000
"""A longer cell is cut in the prompt (the fingerprint still sees all of it)."""


def system_message(spec: EnrichSpec) -> str:
    columns = "\n".join(
        f"- {name} ({column.type}{', one of ' + ', '.join(column.enum) if column.enum else ''}): {column.description}"
        for name, column in spec.outputs.items()
    )
    return (
        "You fill in columns of one row of a table. Look things up with the tools when they help, then answer "
        f"with one JSON object that has exactly these keys:\n{columns}"
    )


def render(spec: EnrichSpec, row: dict[str, Any]) -> str:
    values = {name: _text(row.get(name)) for name in spec.template_columns}
    return spec.prompt.format(**values)


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text[:MAX_VALUE_CHARS]


def agent_line(
    custom_id: str,
    spec: EnrichSpec,
    job: JobConfig,
    row: dict[str, Any],
    system: str,
    expected: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One batch line: an agent task with the spec's tools and `max_steps`, or a plain chat when it has no tools.

    A labelled row (`expected`: some output columns' right values) carries a check that its answer has them."""
    body: dict[str, Any] = {
        "model": job.served_model_name,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": render(spec, row)}],
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": spec.name.replace("-", "_"), "schema": spec.output_schema(), "strict": True},
        },
    }
    if spec.seed is not None:
        body["seed"] = spec.seed
    if spec.tools:
        body["tools"] = [{"type": "function", "function": {"name": name}} for name in spec.tools]
        body["tool_choice"] = "auto"
        body["harness"] = {"max_steps": spec.max_steps}
    line: dict[str, Any] = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    if expected:
        line["check"] = {"type": "json", "fields": expected}
    return line


def input_file(spec: EnrichSpec, job: JobConfig, rows: list[tuple[str, dict[str, Any], dict | None]]) -> bytes:
    """The batch input: one line per `(custom id, row, expected values or None)`."""
    system = system_message(spec)
    return b"".join(
        json.dumps(agent_line(cid, spec, job, row, system, expected), ensure_ascii=False, default=str).encode() + b"\n"
        for cid, row, expected in rows
    )


def check_job(spec: EnrichSpec, job: JobConfig) -> list[str]:
    """What of the spec the job cannot run: tools it lacks, more steps or tokens than it allows."""
    from pronk.agents.tools import tool_names

    problems = []
    known = sorted(tool_names(job))
    missing = [t for t in spec.tools if t not in known]
    if missing:
        problems.append(f"tools {missing} are not tools of job {job.job_id} (it has {known})")
    if spec.max_steps > job.harness.max_steps:
        problems.append(f"max_steps {spec.max_steps} is beyond job {job.job_id}'s cap {job.harness.max_steps}")
    if spec.max_tokens > job.output_token_cap:
        problems.append(f"max_tokens {spec.max_tokens} is beyond job {job.job_id}'s cap {job.output_token_cap}")
    return problems
