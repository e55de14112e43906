"""API burst: many clients create batches at once against the embedded stack's `pronk api`, some of them twice.

    python -m bench.experiments.api_burst [--creates 200] [--owners 4] [--retried 0.25] [--record]

It starts its own embedded stack under a scratch data dir (own ports, auth on, the default tiny job), makes one
API key per owner and uploads one two-line file per owner. Then every create goes out at once, each with its
own `Idempotency-Key`, and a share of them a second time with the same key (a client that timed out and
retried). It waits until every batch is terminal and prints the create latency (median, p99, max), how the
batches ended, and any duplicate: an owner with more batches than keys, or two answers to one key with
different batch ids. The probe of issue 28 sent 50 creates at the stack of that day: 36 clients timed out after
120 s and 26 batches failed with Prefect's 503.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

from bench.experiments import scratch_stack
from bench.harness.figures import percentile
from bench.harness.report import record_section

BENCH_DIR = Path(__file__).resolve().parent.parent
LINE = {"method": "POST", "url": "/v1/chat/completions"}
TERMINAL = {"completed", "failed", "expired", "cancelled"}


def input_file(lines: int) -> bytes:
    body = {"model": "pronk-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return "\n".join(json.dumps({"custom_id": f"r{i}", **LINE, "body": body}) for i in range(lines)).encode()


async def create(client: httpx.AsyncClient, key: str, file_id: str, idempotency_key: str) -> tuple[float, dict]:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": idempotency_key}
    started = time.monotonic()
    answer = await client.post("/v1/batches", json=body, headers=headers)
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


async def burst(base_url: str, keys: list[str], creates: int, retried: float, wait_s: float) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        files = []
        for key in keys:
            upload = await client.post(
                "/v1/files",
                headers={"Authorization": f"Bearer {key}"},
                files={"file": ("burst.jsonl", input_file(2))},
                data={"purpose": "batch"},
            )
            upload.raise_for_status()
            files.append(upload.json()["id"])
        sends = [(i % len(keys), f"burst-{i}") for i in range(creates)]
        sends += sends[: int(creates * retried)]
        started = time.monotonic()
        answers = await asyncio.gather(*(create(client, keys[o], files[o], k) for o, k in sends))
        created_s = time.monotonic() - started
        by_key: dict[str, set[str]] = collections.defaultdict(set)
        for (_, idempotency_key), (_, answer) in zip(sends, answers, strict=True):
            by_key[idempotency_key].add(answer.get("id", "?"))
        deadline = time.monotonic() + wait_s
        while True:
            listed = [await owner_batches(client, key) for key in keys]
            if all(b["status"] in TERMINAL for batches in listed for b in batches) or time.monotonic() > deadline:
                break
            await asyncio.sleep(5)
        ended_s = time.monotonic() - started
    latencies = [seconds for seconds, _ in answers]
    return {
        "creates": creates,
        "sent": len(sends),
        "owners": len(keys),
        "answers": dict(collections.Counter(answer["status_code"] for _, answer in answers)),
        "latency_s": {
            "median": statistics.median(latencies),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        },
        "all_answered_s": created_s,
        "all_terminal_s": ended_s,
        "statuses": dict(collections.Counter(b["status"] for batches in listed for b in batches)),
        "batches": sum(len(batches) for batches in listed),
        "keys_with_two_batches": sum(len(ids) > 1 for ids in by_key.values()),
    }


def counts(counted: dict) -> str:
    return ", ".join(f"{n} × {what}" for what, n in sorted(counted.items()))


def markdown(result: dict, command: str) -> str:
    latency = result["latency_s"]
    again = result["sent"] - result["creates"]
    return "\n".join(
        [
            "## API burst",
            "",
            f"`{command}` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"{result['creates']} creates from {result['owners']} owners sent at once, {again} "
            "of them a second time with the same `Idempotency-Key`; two-line batches on the default tiny job.",
            "",
            "| creates answered | create latency median / p99 / max | all answered | all terminal | batches made | "
            "ended | keys with two batches |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| {counts(result['answers'])} | "
            f"{latency['median']:.2f} / {latency['p99']:.2f} / {latency['max']:.2f} s | "
            f"{result['all_answered_s']:.1f} s | {result['all_terminal_s']:.0f} s | {result['batches']} | "
            f"{counts(result['statuses'])} | {result['keys_with_two_batches']} |",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--creates", type=int, default=200, help="Batches created at once.")
    parser.add_argument("--owners", type=int, default=4, help="API keys (owners) the creates are spread over.")
    parser.add_argument("--retried", type=float, default=0.25, help="Share of creates sent twice with one key.")
    parser.add_argument("--wait-s", type=float, default=1800, help="Longest wait for every batch to end.")
    parser.add_argument("--record", action="store_true", help="Write the section into bench/RESULTS.md.")
    args = parser.parse_args(argv)

    work = scratch_stack("burst", PRONK_API_AUTH="true")
    from pronk.api.keys import ApiKeyStore
    from pronk.settings import get_settings
    from pronk.stack import embedded as stack

    settings = get_settings()
    try:
        stack.up(settings, mlflow_ui=False)
        keys = [ApiKeyStore(settings).create(owner=f"owner-{i}")[0] for i in range(args.owners)]
        result = asyncio.run(
            burst(f"http://127.0.0.1:{settings.api_port}", keys, args.creates, args.retried, args.wait_s)
        )
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
