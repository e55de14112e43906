"""Checking a line's answer against its `check` (`pronk.protocol.checks`): passed, failed, or unchecked.

A check never raises: a predicate that crashes, a pattern that runs too long or an answer that is not JSON is a
`failed` result with the reason; a line with no check, or a Python check where no sandbox can run it, is
`unchecked`. Predicates are user code and run in the python tool's sandbox, never in pronk's process.
"""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
import unicodedata
from pathlib import Path

import regex
from jsonschema import Draft202012Validator

from pronk.agents.tools.base import ToolContext, ToolError
from pronk.agents.tools.python_exec import PythonTool
from pronk.agents.tools.sandbox import sandbox_unavailable
from pronk.protocol.checks import (
    Check,
    CheckResult,
    ExactCheck,
    JsonCheck,
    NumberCheck,
    PythonCheck,
    RegexCheck,
)

REGEX_TIMEOUT_S = 0.5
MAX_ANSWER_CHARS = 100_000
_NUMBER = regex.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_ARTICLES = regex.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = regex.compile(r"[\p{P}\p{S}]+")


def normalized(text: str) -> str:
    """Case-folded, NFKC, without punctuation, articles or repeated spaces (the usual normalised match)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _ARTICLES.sub(" ", _PUNCTUATION.sub(" ", text))
    return " ".join(text.split())


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands separators allowed), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def json_answer(text: str) -> object:
    """The answer parsed as JSON, a Markdown code fence around it allowed; ValueError if it is not JSON."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return json.loads(stripped)


async def run_check(check: Check | None, answer: str | None, python: PythonTool | None = None) -> CheckResult:
    """Check `answer` (None: the line produced none). `python` runs predicates (None: Python checks stay unchecked)."""
    if check is None:
        return CheckResult(status="unchecked")
    if answer is None:
        return CheckResult(status="failed", reason="no answer")
    answer = answer[:MAX_ANSWER_CHARS]
    if isinstance(check, PythonCheck):
        return await _predicate(check, answer, python)
    return _check_text(check, answer)


def _check_text(check: ExactCheck | NumberCheck | JsonCheck | RegexCheck, answer: str) -> CheckResult:
    if isinstance(check, ExactCheck):
        got, want = (
            (normalized(answer), normalized(check.expected))
            if check.normalize
            else (answer.strip(), check.expected.strip())
        )
        return _verdict(got == want, f"expected {check.expected!r}, got {answer[:200]!r}")
    if isinstance(check, NumberCheck):
        number = last_number(answer)
        if number is None:
            return CheckResult(status="failed", reason="the answer holds no number")
        allowed = check.tolerance * abs(check.expected) if check.relative else check.tolerance
        within = math.isfinite(number) and abs(number - check.expected) <= allowed
        return _verdict(within, f"expected {check.expected:g} ± {allowed:g}, got {number:g}")
    if isinstance(check, JsonCheck):
        return _check_json(check, answer)
    try:
        found = regex.search(
            check.pattern, answer, regex.IGNORECASE if check.ignore_case else 0, timeout=REGEX_TIMEOUT_S
        )
    except TimeoutError:
        return CheckResult(status="failed", reason=f"the pattern ran longer than {REGEX_TIMEOUT_S}s")
    return _verdict(found is not None, f"pattern {check.pattern!r} not found")


def _check_json(check: JsonCheck, answer: str) -> CheckResult:
    try:
        value = json_answer(answer)
    except ValueError as exc:
        return CheckResult(status="failed", reason=f"the answer is not JSON: {exc}")
    if check.json_schema is not None:
        error = next(iter(Draft202012Validator(check.json_schema).iter_errors(value)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "<root>"
            return CheckResult(status="failed", reason=f"schema: at {where}: {error.message}")
    if check.fields:
        if not isinstance(value, dict):
            return CheckResult(status="failed", reason=f"expected an object with {sorted(check.fields)}")
        wrong = {k: value.get(k) for k, v in check.fields.items() if value.get(k) != v}
        if wrong:
            return CheckResult(status="failed", reason=f"fields differ: {wrong} (expected {check.fields})")
    return CheckResult(status="passed")


async def _predicate(check: PythonCheck, answer: str, python: PythonTool | None) -> CheckResult:
    if python is None:
        return CheckResult(status="unchecked", reason="no python sandbox for the predicate")
    why = await asyncio.to_thread(sandbox_unavailable, python.sandbox.bwrap)
    if why:
        return CheckResult(status="unchecked", reason=f"no OS sandbox to run the predicate in ({why})")
    # The answer goes in as a JSON string literal, which is also a valid Python one: nothing in it is code.
    code = f"{check.predicate}\n\nprint('PRONK-CHECK', bool(check({json.dumps(answer)})))\n"
    with tempfile.TemporaryDirectory(prefix="pronk-check-") as scratch:
        try:
            output = await python.run({"code": code}, ToolContext(trace_id="check", scratch_dir=Path(scratch)))
        except ToolError as exc:
            return CheckResult(status="failed", reason=f"the predicate failed: {str(exc)[-300:]}")
    verdict = [line for line in output.splitlines() if line.startswith("PRONK-CHECK ")]
    if not verdict:
        return CheckResult(status="failed", reason="the predicate printed no verdict")
    return _verdict(verdict[-1] == "PRONK-CHECK True", "check(answer) returned false")


def _verdict(ok: bool, why: str) -> CheckResult:
    return CheckResult(status="passed") if ok else CheckResult(status="failed", reason=why)
