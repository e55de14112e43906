"""The benchmark's outputs: the printed table, `bench/results.json`, the main section of `bench/RESULTS.md`, the plot.

`RESULTS.md` is shared with other sections (`## Gap KV`, `## Leap`): this module only rewrites the
text between its two markers, and puts that block first when it writes it for the first time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.figures import AgentRun, Comparison, percentile

START, END = "<!-- bench:main:start -->", "<!-- bench:main:end -->"
TITLE = "# Benchmark results"


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def table_rows(comparisons: list[Comparison]) -> list[list[str]]:
    rows = []
    for c in comparisons:
        ratio = c.ratio
        verdict = "" if ratio is None else ("pronk loses" if c.pronk_loses else "pronk wins")
        rows.append(
            [
                c.name,
                c.unit,
                _fmt(c.pronk),
                _fmt(c.pronk_bare),
                _fmt(c.baseline),
                _fmt(ratio) + ("×" if ratio else ""),
                verdict,
            ]
        )
    return rows


HEADER = ["figure", "unit", "pronk", "pronk bare loop", "baseline", "pronk / baseline", ""]


def text_table(comparisons: list[Comparison]) -> str:
    rows = [HEADER, *table_rows(comparisons)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(comparisons: list[Comparison]) -> str:
    rows = [HEADER, ["---"] * len(HEADER), *table_rows(comparisons)]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def write_json(path: Path, comparisons: list[Comparison], meta: dict) -> Path:
    path.write_text(json.dumps({"meta": meta, "comparisons": [c.as_json() for c in comparisons]}, indent=2) + "\n")
    return path


def plot_completion_times(path: Path, runs: list[AgentRun]) -> Path:
    """Empirical CDFs of trace completion time, one line per setup."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in runs:
        values = sorted(run.trace_seconds)
        if not values:
            continue
        ax.step(
            values,
            [(i + 1) / len(values) for i in range(len(values))],
            where="post",
            label=f"{run.name} (p50 {percentile(values, 50):.1f}s, p90 {percentile(values, 90):.1f}s)",
        )
    ax.set_xlabel("trace completion time (s), from the trace's start to its last step")
    ax.set_ylabel("share of traces done")
    ax.set_title("Agent traces: completion-time distribution")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_results_md(path: Path, section: str) -> Path:
    """Replace the main section between the markers, or put it first under the title."""
    block = f"{START}\n{section.strip()}\n{END}"
    text = path.read_text() if path.exists() else f"{TITLE}\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        title, _, body = text.partition("\n")
        text = f"{title}\n\n{block}\n\n{body.lstrip()}"
    path.write_text(text.rstrip() + "\n")
    return path


def markdown_section(meta: dict, comparisons: list[Comparison], plot_name: str) -> str:
    losses = [c.name for c in comparisons if c.pronk_loses]
    kv = meta["kv"]
    lines = [
        "## pronk vs stock vLLM on agent traces (main comparison)",
        "",
        f"Run {meta['date']} on {meta['machine']}, with `{meta['command']}`.",
        "",
        f"Both sides: job `{meta['job']}` (the tiny local model `models:/pronk-tiny@live`), {meta['workers']} engine "
        "processes each pinned to its own core, the same engine args, prefix caching on, `max_model_len` "
        f"{meta['max_model_len']}, and a KV cache of {meta['kv_cache_memory_bytes'] / 2**20:.0f} MiB = "
        f"{kv['tokens_per_worker']:,} tokens per process. The workload's working set is "
        f"~{kv['working_set_tokens_per_worker']:,} tokens per process ({meta['concurrency']} traces in flight, mean "
        f"final context {kv['mean_trace_context']:,} tokens), so the cache cannot hold every live trace and "
        "**eviction happens**: with no eviction at all the cached-token ratio would be "
        f"{kv['ideal_cached_ratio']:.3f}.",
        "",
        f"Workload: profile `{meta['profile']}`, {meta['traces_per_round']} root traces per round × {meta['rounds']} "
        f"round(s) (seed {meta['seed']}), {meta['steps_per_round']} steps per round, "
        f"{meta['steps_cut_by_context_cap']} steps cut by the context cap; single-step file of "
        f"{meta['single_step_requests']} lines. Ranges and their sources: `bench/workload.py`. pronk = its batch flow "
        "(Prefect) on its workers; pronk bare loop = the same plain asyncio loop as the baseline, through pronk's "
        "router and workers; baseline = N `python -m vllm.entrypoints.openai.api_server` round-robin (agent; they "
        f"took {meta['vllm_server_startup_s']} s to start, not counted) and `python -m "
        "vllm.entrypoints.openai.run_batch` (single-step; its own engine start-up is counted end to end, and left "
        "out in the row that says so, from its progress bar's rate). Ratios are pronk / baseline; times are medians "
        "(p50) and p90 over traces.",
        "",
        markdown_table(comparisons),
        "",
        f"![trace completion times]({plot_name})",
        "",
        "pronk loses on: " + (", ".join(losses) if losses else "nothing in this run") + " (see below for why).",
    ]
    if meta.get("errors"):
        lines += ["", f"Errors seen: `{json.dumps(meta['errors'])[:800]}`"]
    return "\n".join(lines)
