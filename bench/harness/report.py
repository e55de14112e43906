"""The benchmark's outputs: the printed table, `bench/results/results.json`, a profile's record in `bench/RESULTS.md`
(its text here, its place there: `bench.harness.results_md`), the plot; `record` writes a profile's three, with
`run_meta` (the run they came from). `results.json` holds one entry per profile; recording one profile leaves the
others as they were.
"""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.harness.config import BenchConfig
from bench.harness.figures import AgentRun, Comparison, limit_defects, percentile, record_key
from bench.harness.results_md import write_results_md
from pronk.jobs.schema import JobConfig
from pronk.settings import PROJECT_ROOT

BENCH_DIR = PROJECT_ROOT / "bench"


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
        verdict = "" if ratio is None else "even" if ratio == 1.0 else "pronk loses" if c.pronk_loses else "pronk wins"
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


def write_json(
    path: Path, comparisons: list[Comparison], meta: dict, setups: dict | None = None, goals: list | None = None
) -> Path:
    """This profile's entry of results.json: meta, every setup's figures per round, the goals, every ratio to a limit
    that is a defect (`figures.limit_defects`), the comparisons."""
    data = json.loads(path.read_text()) if path.exists() else {}
    profiles = data.get("profiles", {}) if isinstance(data, dict) else {}
    if isinstance(data, dict) and "meta" in data and "comparisons" in data:  # the one-profile file of the first bench
        profiles.setdefault(data["meta"].get("profile", "cpu"), data)
    profiles[meta.get("record", meta["profile"])] = {
        "meta": meta,
        "goals": goals or [],
        "defects": limit_defects(setups or {}),
        "setups": setups or {},
        "comparisons": [c.as_json() for c in comparisons],
    }
    path.write_text(json.dumps({"profiles": profiles}, indent=2) + "\n")
    return path


def _spread(values: dict | None) -> str:
    if not values or values.get("median") is None:
        return "—"
    flag = " **defect**" if values.get("defect") else ""
    return f"{_fmt(values['median'])} ({_fmt(values['min'])}–{_fmt(values['max'])}){flag}"


SETUP_COLUMNS = (
    ("traces/s steady", "traces_per_s_steady"),
    ("/ stock RR", "over_baseline"),
    ("/ best peer", "over_best_peer"),
    ("/ capacity limit", "over_limit"),
    ("/ compute limit", "over_compute_limit"),
    ("traces/s all / wall", "traces_per_s_wall"),
    ("cached ratio", "cached_ratio"),
    ("/ ideal", "cached_ratio_of_ideal"),
    ("recomputed prompt tokens", "recomputed_prompt_tokens"),
    ("preemptions", "preemptions"),
    ("p90 trace s", "p90_trace_s"),
    ("steps moved", "moved_steps"),
    ("recomputed on moved steps", "moved_recomputed_tokens"),
    ("/ stock RR, no tier", "over_untiered"),
    ("recomputed / capacity limit's", "recomputed_over_limit"),
    ("tokens loaded from the tier", "tier_loaded_tokens"),
    ("tier copy s", "tier_copy_s"),
    ("engine busy share", "busy_share"),
    ("busy share, steady window", "busy_share_steady"),
    ("engine runnable share", "runnable_share"),
    ("running / engine", "running_per_worker"),
    ("running / engine, steady window", "running_per_worker_steady"),
)
"""The agent profiles' columns; one that no setup has a value for is left out (the tier's, without a tier)."""


LIMITS_TEXT = (
    "the capacity-matched limit has pronk's KV capacity (the same KV bytes, and the job's host tier as stock vLLM "
    "gets it), traces admitted while they fit 90% of what device and tier hold together; the compute-only limit "
    "admits `max_num_seqs` traces at once on a KV cache sized to hold them whole, so every step's prefix is cached "
    "and the engine's batch is as full as it allows: nothing can beat it. Both admit the next trace the moment one "
    "ends and send a trace's next step the moment its last ends. `/ capacity limit` and `/ compute limit` "
    "divide a setup's traces over its wall time by the limit's (both sides count their start and tail: a steady "
    "rate would favour a setup whose traces finish in a bunch); a ratio above 1 in every round is flagged "
    "**defect**: the limit is wrong."
)
"""How the records describe the two limits (`figures.LIMITS`)."""


def peers_text(meta: dict) -> list[str]:
    """How the records describe the peers, with each one's command line as the run started it (`meta`'s
    `peer_commands`; none in a record from before the peers)."""
    commands = meta.get("peer_commands") or {}
    if not commands:
        return []
    return [
        "The peers: the same stock servers (started with `--enable-scale-out`, and each with its own name as its "
        "responses' `system_fingerprint`, so every step's server is known) behind vllm-router, the vLLM project's "
        "router (`bench/harness/peer.py`, pinned by the `bench` extra), one setup per policy: `cache_aware` (its "
        "default, its balance threshold set to this fleet's traces in flight) and `sticky_least_loaded` with "
        "`X-Session-ID` set to each trace's id; both retry a step 3 tries in all and keep the circuit breaker's "
        "defaults. `/ best peer` divides, round by round, by the peer with the higher median (steady traces/s; "
        "checked successes per dollar on agent-real); a goal over it asks no more than 0.95 of what the "
        "compute-only limit makes over it. Started as:",
        "",
        *(f"- {name}: `{command}`" for name, command in commands.items()),
        "",
    ]


CHECKED_COLUMNS = (
    ("checked successes/$", "successes_per_dollar"),
    ("/ stock RR", "over_baseline"),
    ("/ best peer", "over_best_peer"),
    ("checked successes/s", "successes_per_s"),
    ("success rate", "success_rate"),
    ("passed", "passed"),
    ("failed", "failed"),
    ("tool-call validity", "tool_call_validity"),
    ("traces/s steady", "traces_per_s_steady"),
    ("traces/s all / wall", "traces_per_s_wall"),
    ("/ capacity limit", "over_limit"),
    ("/ compute limit", "over_compute_limit"),
    ("wall s", "wall_s"),
    ("prompt tokens", "prompt_tokens"),
    ("cached ratio", "cached_ratio"),
    ("recomputed prompt tokens", "recomputed_prompt_tokens"),
    ("steps moved", "moved_steps"),
    ("engine busy share", "busy_share"),
    ("preemptions", "preemptions"),
)
"""The agent-real profile's columns (`bench.harness.figures.checked_table`)."""


def setups_table(setups: dict[str, dict[str, dict]], columns: tuple[tuple[str, str], ...] = SETUP_COLUMNS) -> str:
    """One row per setup: the median over rounds (min–max); a column no setup has a value for is left out."""
    columns = tuple(
        (title, key)
        for title, key in columns
        if any((figures.get(key) or {}).get("median") is not None for figures in setups.values())
    )
    header = ["setup", *(title for title, _ in columns)]
    rows = [header, ["---"] * len(header)]
    for name, figures in setups.items():
        rows.append([name, *(_spread(figures.get(key)) for _, key in columns)])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def rounds_lines(setups: dict[str, dict[str, dict]]) -> str:
    """Every round's steady traces/s and cached ratio per setup (round order as drawn, seed + round)."""
    lines = []
    for name, figures in setups.items():
        rate = ", ".join(_fmt(v) for v in figures["traces_per_s_steady"]["rounds"])
        cached = ", ".join(_fmt(v) for v in figures["cached_ratio"]["rounds"])
        lines.append(f"- {name}: traces/s {rate}; cached ratio {cached}")
    return "\n".join(lines)


def _target(goal: dict) -> str:
    if goal["goal"] is None:
        return "reported"
    if isinstance(goal["goal"], str):
        return goal["goal"]
    capped = f" ({goal['capped']})" if goal.get("capped") else ""
    return f"{'≤' if goal.get('ceiling') else '≥'} {goal['goal']}{capped}"


def _met(goal: dict) -> str:
    if goal.get("defect"):
        return "**defect**: above the limit in every round"
    return {True: "yes", False: "**no**", None: "—"}[goal["met"]]


def goals_table(goals: list[dict]) -> str:
    """One row per goal: the figure, the setup, what it is measured against, the target (and why a goal over the best
    peer was cut to what the compute-only limit allows), every round, and for a goal against a serving setup the most
    any setup could reach (the compute-only limit over that setup)."""
    header = ["goal", "setup", "against", "target", "median (min–max)", "rounds", "met", "most reachable"]
    rows = [header, ["---"] * len(header)]
    for g in goals:
        rows.append(
            [
                g["figure"],
                g["setup"],
                g.get("against", "—"),
                _target(g),
                _spread(g),
                ", ".join(_fmt(v) for v in g["rounds"]),
                _met(g),
                _spread(g.get("reachable")),
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def defect_lines(setups: dict[str, dict[str, dict]]) -> str:
    """A line for every setup that exceeds a limit beyond noise (`figures.limit_defects`), or an empty string."""
    return "\n".join(
        f"**Defect**: `{d['setup']}` ran at {_fmt(d['median'])} ({_fmt(d['min'])}–{_fmt(d['max'])}) of "
        f"`{d['limit']}`, above 1 in every round. A limit exceeded bounds nothing: the limit is wrong, not pronk "
        "ahead of it."
        for d in limit_defects(setups)
    )


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


def section_head(title: str, meta: dict) -> tuple[list[str], str]:
    """A profile section's heading and run line, and what a record cut short says after its rounds."""
    asked = meta.get("rounds_asked", meta["rounds"])
    partial = f" (**partial record**: {asked} asked, the run was cut short)" if asked > meta["rounds"] else ""
    run = (
        f"Run {meta['date']} on {meta['machine']}, with `{meta['command']}`; the whole bench took "
        f"{meta.get('bench_wall_s', '?')} s."
    )
    return [f"## {title}: profile `{meta['profile']}`", "", run, ""], partial


def checked_section(
    meta: dict, comparisons: list[Comparison], plot_name: str, setups: dict | None = None, goals: list | None = None
) -> str:
    """The agent-real profile's section: real agent traces checked, pronk against stock vLLM, beside the limits."""
    kv = meta["kv"]
    head, partial = section_head("pronk vs stock vLLM on checked agent tasks", meta)
    lines = [
        *head,
        f"Both setups: job `{meta['job']}` (`{meta['model']}`), {meta['workers']} engine processes each pinned to its "
        f"own core, the same engine args, prefix caching on, `max_model_len` {meta['max_model_len']}, a KV cache of "
        f"{meta['kv_cache_memory_bytes'] / 2**20:.0f} MiB = {kv['tokens_per_worker']:,} tokens per process, and "
        f"{meta['concurrency']} traces in flight. The traces' mean final context was {kv['mean_trace_context']:,} "
        f"tokens (longest {kv['longest_trace_context']:,}), so the working set is "
        f"~{kv['working_set_tokens_per_worker']:,} tokens per process and the cache holds "
        f"{kv['cache_share_of_working_set']:.0%} of it.",
        "",
        f"Workload: {meta['traces_per_round']} traces per round "
        f"({meta['traces_per_round'] / max(meta['concurrency'], 1):.1f}x the concurrency) × {meta['rounds']} "
        f"round(s){partial}, drawn from the job's labelled set "
        f"(`{meta['labelled_set']}`, seed {meta['seed']} + round), each trace's system message led by a document of "
        f"{meta['document_tokens'][0]:,}–{meta['document_tokens'][1]:,} tokens of its own (the corpus and the "
        "tables in an order of the trace's), the task and its check unchanged. Every serving setup runs pronk's agent "
        "harness (the line's tools, real python, sql and search calls, each step's output held to the tool-call "
        "JSON schema) and checks every answer; only what answers a step differs: pronk's workers through the job's "
        "router, or N stock `python -m vllm.entrypoints.openai.api_server` (vLLM's fcfs, the same structured-outputs "
        f"config) behind round-robin or behind vllm-router, sent chat completions (they took "
        f"{meta['vllm_server_startup_s']} s to start, not counted). The order of the setups is rotated each round. "
        "The two offline limits "
        "(`bench/harness/offline_limit.py`) replay the shapes pronk's step records give (each step's prompt and "
        "output lengths, `pronk.herd.shapes`) with no tool gaps: " + LIMITS_TEXT + " Checked successes per dollar: "
        f"passed lines over ${meta['price_per_worker_hour']} a worker-hour × workers × wall time. "
        "Cells: median over rounds (min–max).",
        "",
        *peers_text(meta),
    ]
    if setups:
        lines += [setups_table(setups, CHECKED_COLUMNS), ""]
        if defects := defect_lines(setups):
            lines += [defects, ""]
    if goals:
        lines += ["Goals (issues 26 and 63):", "", goals_table(goals), ""]
        lines += [f"Success rate: {g['reason']}." for g in goals if g.get("reason")] + [""]
    lines += [
        "Medians over rounds (pronk = the harness over pronk's router, baseline = stock round-robin):",
        "",
        markdown_table(comparisons),
        "",
        f"![trace completion times]({plot_name})",
    ]
    if meta.get("errors"):
        lines += ["", f"Errors seen: `{json.dumps(meta['errors'])[:800]}`"]
    return "\n".join(lines)


def markdown_section(
    meta: dict, comparisons: list[Comparison], plot_name: str, setups: dict | None = None, goals: list | None = None
) -> str:
    losses = [c.name for c in comparisons if c.pronk_loses]
    kv = meta["kv"]
    tier = meta.get("kv_host_tier_bytes") or 0
    head, partial = section_head(
        "pronk vs stock vLLM on agent traces" + (", with a KV host tier" if tier else ""), meta
    )
    lines = [
        *head,
        f"Every setup: job `{meta['job']}` (the tiny local model `models:/pronk-tiny@live`), {meta['workers']} engine "
        "processes each pinned to its own core, the same engine args, prefix caching on, `max_model_len` "
        f"{meta['max_model_len']}, and a KV cache of {meta['kv_cache_memory_bytes'] / 2**20:.0f} MiB = "
        f"{kv['tokens_per_worker']:,} tokens per process. The workload's working set is "
        f"~{kv['working_set_tokens_per_worker']:,} tokens per process ({meta['concurrency']} traces in flight, mean "
        f"final context {kv['mean_trace_context']:,} tokens), "
        f"{kv['working_set_tokens_per_worker'] / max(kv['tokens_per_worker'], 1):.1f}x the cache. With no eviction "
        f"at all the cached-token ratio would be {kv['ideal_cached_ratio']:.3f} (the ideal; `/ ideal` below).",
        "",
        f"Workload: profile `{meta['profile']}`, {meta['traces_per_round']} root traces per round "
        f"({meta['traces_per_round'] / max(meta['concurrency'], 1):.1f}x the concurrency) × {meta['rounds']} "
        f"round(s){partial} "
        f"(seed {meta['seed']} + round, the order of setups rotated by one each round), {meta['steps_per_round']} "
        f"steps in round 0, {meta['steps_cut_by_context_cap']} steps cut by the context cap. Setups: the stock "
        "baseline (N `python -m vllm.entrypoints.openai.api_server`, vLLM's fcfs, behind round-robin; they took "
        f"{meta['vllm_server_startup_s']} s to start, not counted); the peers, the same servers behind vllm-router "
        "(below); pronk's workers through the same bare asyncio "
        "replay loop over pronk's router, the Herd's mechanisms switched on one by one (affinity only: pins off, "
        "admission none, one priority for all; + pins: the job's pin TTL; + admission: `kv_budget`; + priority: "
        "each step carries its trace's start); pronk's batch flow (Prefect) with the job as configured; the "
        "two offline limits (`bench/harness/offline_limit.py`: vLLM's offline engine per core with the same engine "
        "args, zero tool gaps, each trace's steps in order): " + LIMITS_TEXT + " traces/s steady = "
        "completions over the window between the first and the last of the middle 80%. "
        "Preemptions: the baseline's from vLLM's /metrics, pronk's "
        "from its workers' /stats. Engine busy share: the CPU time of each engine's core process (where a CPU "
        "engine runs its model, on both sides) over the setup's wall time, per core it is pinned to; runnable share "
        "adds the time its main thread was ready to run while another process held its core (Linux's schedstat), "
        "so runnable less busy is what the rest of the machine took from the engines. Running "
        "requests: each engine's running-requests gauge (the same vLLM gauge on both sides), sampled every second "
        "of the setup's run. Recomputed on moved steps: the prompt tokens recomputed by steps that ran on another "
        "engine than their trace's previous step. Cells: median over rounds (min–max).",
        "",
        *peers_text(meta),
    ]
    if tier:
        lines += [
            f"The job has a KV host tier of {tier / 2**20:.0f} MiB per process (`scheduling.kv_host_tier_bytes`), "
            "and every setup runs with it but one: `stock vLLM: round-robin` has the same tier behind vLLM's own LRU "
            "(what `--kv-offloading-size` gives a user), pronk's evicts by trace state, and `stock vLLM: "
            "round-robin, no host tier` is the same job without it. With the tier a pin TTL pins nothing on the "
            "device: it only ranks the tier's eviction (`+ pins`), and affinity keeps a trace on its engine however "
            "full that engine's cache is, since the prefix waits on its host tier. Tokens loaded from the tier are "
            "vLLM's `external_kv_transfer` prompt tokens; its copy time is the engines' loads and stores together "
            "(pronk's workers' /stats, the stock servers' /metrics).",
            "",
        ]
    if setups:
        lines += [setups_table(setups), "", "Every round:", "", rounds_lines(setups), ""]
        if defects := defect_lines(setups):
            lines += [defects, ""]
    if goals:
        lines += [f"Goals (issues {'27 and 63' if tier else '11 and 63'}):", "", goals_table(goals), ""]
    lines += [
        "The classic comparison (pronk = batch flow, bare loop = every mechanism on, baseline = stock round-robin; "
        "medians over rounds):",
        "",
        markdown_table(comparisons),
        "",
        f"![trace completion times]({plot_name})",
        "",
        "pronk loses on: " + (", ".join(losses) if losses else "nothing in this run") + ".",
    ]
    if meta.get("errors"):
        lines += ["", f"Errors seen: `{json.dumps(meta['errors'])[:800]}`"]
    return "\n".join(lines)


def run_meta(config: BenchConfig, job: JobConfig, rounds: int) -> dict:
    """What every profile's record says of the run: when, where, the command, the job and the rounds."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": (
            f"{platform.node()}: {platform.machine()}, {len(os.sched_getaffinity(0))} cores, {platform.platform()}"
        ),
        "command": config.command,
        "job": job.job_id,
        "workers": job.workers,
        "price_per_worker_hour": job.price_per_worker_hour,
        "kv_cache_memory_bytes": job.engine.kv_cache_memory_bytes,
        "max_model_len": job.engine.max_model_len,
        "profile": config.profile,
        "record": record_key(config.profile, bool(job.scheduling.kv_host_tier_bytes)),
        "kv_host_tier_bytes": job.scheduling.kv_host_tier_bytes,
        "rounds": rounds,
        "rounds_asked": config.rounds,
        "seed": config.seed,
        "concurrency": job.scheduling.max_concurrency,
    }


def record(
    config: BenchConfig,
    outcome: dict,
    info: dict,
    out_dir: Path = BENCH_DIR,
    section: Callable[..., str] = markdown_section,
) -> list[Path]:
    """Write results/results.json, the plot under results/ and the profile's record in RESULTS.md, the one it
    replaces going to the dated notes (`section` writes its text from the meta, the comparisons, the plot's link,
    the setups and the goals)."""
    comparisons: list[Comparison] = outcome["comparisons"]
    key = info.get("record", config.profile)
    suffix = "" if key == "cpu" else f"_{key}"
    results = out_dir / "results"
    results.mkdir(parents=True, exist_ok=True)
    plot = plot_completion_times(results / f"completion_times{suffix}.png", outcome["runs"])
    data = write_json(results / "results.json", comparisons, info, outcome["setups"], outcome["goals"])
    plot_link = f"{results.name}/{plot.name}"
    text = section(info, comparisons, plot_link, outcome["setups"], outcome["goals"])
    md = write_results_md(out_dir / "RESULTS.md", text, key)
    return [md, data, plot]
