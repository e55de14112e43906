"""API burst: many clients create batches at once against the embedded stack's `pronk api`, some of them twice.

    python -m bench.experiments.api_burst [--creates 200] [--owners 4] [--retried 0.25] [--lines 2] [--over-s 0]
                                          [--job tiny-cpu] [--record]

It starts its own embedded stack under a scratch data dir (own ports, auth on, the job named by `--job`, the tiny
one by default), makes one API key per owner and uploads one `--lines`-line file per owner. Then every create goes
out at once (or spread evenly over `--over-s` seconds), each with its own `Idempotency-Key`, and a share of them a
second time with the same key (a client that timed out and retried). It waits until every batch is terminal and
prints the create latency (median, p99, max), how the batches ended, each batch's completion time (created to
ended, p50 and p100), any duplicate (an owner with more batches than keys, or two answers to one key with different
batch ids), any batch lost (a key answered without a batch), the flow runs that crashed, the most flow-run processes
seen at once, and the "database is locked" lines in the Prefect server's log. The probe of issue 28 sent 50 creates
at the stack of that day: 36 clients timed out after 120 s and 26 batches failed with Prefect's 503; issue 40's
75 one-line batches took 1,241 s, with 50 flow-run processes at once and 12 crashed runs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

from bench.experiments import scratch_stack_for
from bench.harness.figures import percentile
from bench.harness.results_md import record_section

BENCH_DIR = Path(__file__).resolve().parent.parent
LINE = {"method": "POST", "url": "/v1/chat/completions"}
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def input_file(lines: int, model: str) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return "\n".join(json.dumps({"custom_id": f"r{i}", **LINE, "body": body}) for i in range(lines)).encode()


def flow_run_pids(data_dir: Path) -> list[int]:
    """Flow-run processes (`python -m prefect.engine`, as the process work pool starts them) of the stack whose
    data dir is `data_dir`; other stacks on the machine are not counted."""
    mark = f"PRONK_DATA_DIR={data_dir}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if b"prefect.engine" in (proc / "cmdline").read_bytes() and mark in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except (OSError, ValueError):  # not a process, gone, or another user's
            continue
    return pids


class PeakProcesses:
    """The most flow-run processes seen at once, sampled every half second on a thread of its own."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.peak = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stopped.wait(0.5):
            self.peak = max(self.peak, len(flow_run_pids(self.data_dir)))

    def __enter__(self) -> PeakProcesses:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


async def create(
    client: httpx.AsyncClient, key: str, file_id: str, idempotency_key: str, job_id: str, at: float
) -> tuple[float, dict]:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", "job_id": job_id}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idempotency_key}
    started = time.monotonic()
    try:
        answer = await client.post("/v1/batches", json=body, headers=headers)
    except httpx.HTTPError as exc:  # a create the API did not answer counts as such; the burst goes on
        return time.monotonic() - started, {"status_code": type(exc).__name__}
    return time.monotonic() - started, {"status_code": answer.status_code, **answer.json()}


async def owner_batches(client: httpx.AsyncClient, key: str) -> list[dict]:
    batches, after = [], None
    while True:
        page = (
            await client.get(
                "/v1/batches",
                params={"limit": 100, **({"after": after} if after else {})},
                headers={"Authorization": f"Bearer {key}"},
            )
        ).json()
        batches += page["data"]
        if not page["has_more"]:
            return batches
        after = page["last_id"]


async def burst(
    base_url: str, keys: list[str], job_id: str, model: str, args: argparse.Namespace
) -> tuple[dict, list[float]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        files = []
        for key in keys:
            upload = await client.post(
                "/v1/files",
                headers={"Authorization": f"Bearer {key}"},
                files={"file": ("burst.jsonl", input_file(args.lines, model))},
                data={"purpose": "batch"},
            )
            upload.raise_for_status()
            files.append(upload.json()["id"])
        sends = [(i % len(keys), f"burst-{i}") for i in range(args.creates)]
        sends += sends[: int(args.creates * args.retried)]
        started = time.monotonic()
        pace = args.over_s / max(1, args.creates)
        at = [started + pace * (i % args.creates) for i in range(len(sends))]
        answers = await asyncio.gather(
            *(create(client, keys[o], files[o], k, job_id, t) for (o, k), t in zip(sends, at, strict=True))
        )
        created_s = time.monotonic() - started
        by_key: dict[str, set[str]] = collections.defaultdict(set)
        for (_, idempotency_key), (_, answer) in zip(sends, answers, strict=True):
            by_key[idempotency_key].add(answer.get("id", "?"))
        deadline = time.monotonic() + args.wait_s
        while True:
            listed = [await owner_batches(client, key) for key in keys]
            if all(b["status"] in TERMINAL for batches in listed for b in batches) or time.monotonic() > deadline:
                break
            await asyncio.sleep(5)
        ended_s = time.monotonic() - started
    latencies = [seconds for seconds, _ in answers]
    batches = [b for owned in listed for b in owned]
    ended_at = {b["id"]: max(b.get(f"{s}_at") or 0 for s in TERMINAL) for b in batches}
    completion = [float(ended_at[b["id"]] - b["created_at"]) for b in batches if b["status"] in TERMINAL]
    made = {batch_id for ids in by_key.values() for batch_id in ids}
    result = {
        "creates": args.creates,
        "sent": len(sends),
        "owners": len(keys),
        "lines": args.lines,
        "over_s": args.over_s,
        "answers": dict(collections.Counter(answer["status_code"] for _, answer in answers)),
        "latency_s": {
            "median": statistics.median(latencies),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        },
        "all_answered_s": created_s,
        "all_terminal_s": ended_s,
        "statuses": dict(collections.Counter(b["status"] for b in batches)),
        "batches": len(batches),
        "keys_with_two_batches": sum(len(ids) > 1 for ids in by_key.values()),
        "keys_without_a_batch": sum(not any(i.startswith("batch_") for i in ids) for ids in by_key.values()),
        "batches_not_answered_to_any_key": len({b["id"] for b in batches} - made),
        "completion_s": {"p50": percentile(completion, 50), "p100": max(completion)} if completion else None,
    }
    return result, completion


async def crashed_flow_runs() -> int:
    """Flow runs of the stack's Prefect server that crashed (at submission or later)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    crashed = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CRASHED]))
    async with get_client() as client:
        return await client.count_flow_runs(flow_run_filter=FlowRunFilter(state=crashed))


def database_locked_lines(log: Path) -> int:
    """Lines of the Prefect server's log saying its database was locked (SQLite under concurrent writers)."""
    if not log.exists():
        return 0
    with log.open(errors="replace") as lines:
        return sum("database is locked" in line for line in lines)


def counts(counted: dict) -> str:
    return ", ".join(f"{n} × {what}" for what, n in sorted(counted.items()))


def markdown(result: dict, command: str) -> str:
    latency = result["latency_s"]
    again = result["sent"] - result["creates"]
    completion = result["completion_s"] or {"p50": float("nan"), "p100": float("nan")}
    sent = f"spread over {result['over_s']:.0f} s" if result["over_s"] else "sent at once"
    return "\n".join(
        [
            "## API burst",
            "",
            f"`{command}` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"{result['creates']} creates from {result['owners']} owners {sent}, {again} "
            f"of them a second time with the same `Idempotency-Key`; {result['lines']}-line batches on job "
            f"{result['job']}, Prefect on {result['prefect_database']}.",
            "",
            "| creates answered | create latency median / p99 / max | all answered | all terminal | batches made | "
            "ended | completion p50 / p100 | keys with two batches / none | crashed flow runs | most flow-run "
            'processes at once | "database is locked" |',
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| {counts(result['answers'])} | "
            f"{latency['median']:.2f} / {latency['p99']:.2f} / {latency['max']:.2f} s | "
            f"{result['all_answered_s']:.1f} s | {result['all_terminal_s']:.0f} s | {result['batches']} | "
            f"{counts(result['statuses'])} | {completion['p50']:.0f} / {completion['p100']:.0f} s | "
            f"{result['keys_with_two_batches']} / {result['keys_without_a_batch']} | {result['crashed_flow_runs']} | "
            f"{result['peak_flow_run_processes']} | {result['database_locked']} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=200, help="Batches created.")
    parser.add_argument("--owners", type=int, default=4, help="API keys (owners) the creates are spread over.")
    parser.add_argument("--retried", type=float, default=0.25, help="Share of creates sent twice with one key.")
    parser.add_argument("--lines", type=int, default=2, help="Lines of each batch.")
    parser.add_argument("--over-s", type=float, default=0.0, help="Spread the creates evenly over this many seconds.")
    parser.add_argument("--job", default="tiny-cpu", help="The job (name or id) the batches go to and the stack runs.")
    parser.add_argument(
        "--prefect-database",
        choices=["auto", "sqlite", "postgres"],
        default="auto",
        help="The Prefect server's database (`auto`: the stack's choice, PostgreSQL where the machine has it).",
    )
    parser.add_argument("--wait-s", type=float, default=1800, help="Longest wait for every batch to end.")
    parser.add_argument("--record", action="store_true", help="Write the section into bench/RESULTS.md.")
    args = parser.parse_args(argv)

    work, settings, job = scratch_stack_for(
        "burst", args.job, PRONK_API_AUTH="true", PRONK_PREFECT_DATABASE=args.prefect_database
    )
    from pronk.api.keys import ApiKeyStore
    from pronk.stack import embedded as stack
    from pronk.stack.embedded import prefect_database

    try:
        stack.up(settings, mlflow_ui=False)
        keys = [ApiKeyStore(settings).create(owner=f"owner-{i}")[0] for i in range(args.owners)]
        with PeakProcesses(settings.data_dir) as peak:
            result, _ = asyncio.run(
                burst(f"http://127.0.0.1:{settings.api_port}", keys, job.job_id, job.served_model_name, args)
            )
        result |= {
            "job": job.job_id,
            "prefect_database": prefect_database(settings),
            "crashed_flow_runs": asyncio.run(crashed_flow_runs()),
            "peak_flow_run_processes": peak.peak,
            "database_locked": database_locked_lines(settings.logs_dir / "prefect-server.log"),
        }
    finally:
        stack.down(settings)
    command = "python -m bench.experiments.api_burst " + " ".join(argv if argv is not None else sys.argv[1:])
    section = markdown(result, command.strip())
    print(json.dumps(result, indent=2))
    print(section)
    if args.record:
        record_section(BENCH_DIR / "RESULTS.md", section)
    print(f"scratch dir: {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
