"""Chaos: the faults an operator's ordinary day brings, each injected into an API batch mid-run.

    python -m bench.experiments.chaos [--faults drainer-kill,stack-restart,postgres-restart,prefect-restart,api-kill]
                                      [--lines 300] [--job tiny-cpu] [--record]

It starts its own embedded stack under a scratch data dir (own ports, auth on, Prefect on PostgreSQL where the
machine has it, the tiny job by default) and, for each fault in turn, creates a `--lines`-line API batch with the
official `openai` client. Its lines are replay traces whose tool gaps are waits (at least 3 s each, little compute),
so the batch is still running when, once its first lines are out, the fault lands:

- `drainer-kill`: SIGKILL the batch queue's drainer, the flow-run process running the API's batches;
- `stack-restart`: `pronk stack down`, then `pronk stack up` (the operator's restart of issue 65);
- `postgres-restart`: PostgreSQL stopped fast (SIGINT, what `pg_ctl restart -m fast` sends) and started again by
  `pronk stack up`, which keeps the stack's own record of its pid;
- `prefect-restart`: the Prefect server stopped (SIGTERM) and started again by `pronk stack up`;
- `api-kill`: the API process SIGKILLed while a create is in flight, started again by `pronk stack up`, and the
  create sent again with the same `Idempotency-Key`.

After the stack is back it creates a 1-line batch (behind any dead drainer's slot), then checks, for every batch of
the fault:
- it reaches a terminal state within `--within-s` (3 minutes) of the stack being back, `completed`;
- every input line ends as exactly one output or error line, and no line ends `engine_unavailable`;
- 60 s after the stack is back, no flow run of pronk's flows is unended while its process is gone
  (`pronk.control.dead_runs`, judged on this host);
- for `api-kill`, the retried create answers the batch of the first (one batch for the key).

It prints a table (one row per fault) and exits 1 when any check failed; `--record` writes it into
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from bench.experiments import scratch_stack_for
from bench.experiments.api_burst import flow_run_pids
from bench.harness.results_md import record_section

BENCH_DIR = Path(__file__).resolve().parent.parent
FAULTS = ("drainer-kill", "stack-restart", "postgres-restart", "prefect-restart", "api-kill")
TERMINAL = {"completed", "failed", "expired", "cancelled"}
REPLAY_URL = "/v1/pronk/replay"
ZOMBIE_CHECK_S = 60.0


def slow_line(custom_id: str, model: str) -> str:
    """A replay trace of three steps with two 1.5 s tool gaps: it takes at least 3 s however fast the machine."""
    gapped = [{"new_prompt_tokens": 8, "output_tokens": 8, "tool_gap_s": 1.5} for _ in range(2)]
    shape = {
        "trace_id": custom_id,
        "system_prompt_tokens": 32,
        "steps": [*gapped, {"new_prompt_tokens": 8, "output_tokens": 8}],
    }
    body = {"model": model, "shape": shape}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": REPLAY_URL, "body": body})


@dataclass
class Outcome:
    fault: str
    batches: dict[str, int] = field(default_factory=dict)
    """Batch id -> its lines."""
    statuses: dict[str, str] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    error_codes: Counter = field(default_factory=Counter)
    back_s: float = 0.0
    """From the fault to the stack being back."""
    terminal_after_back_s: float = 0.0
    zombies: list[str] = field(default_factory=list)
    one_batch_for_the_key: bool | None = None
    notes: list[str] = field(default_factory=list)

    def failures(self, within_s: float) -> list[str]:
        found = [f"{b} ended {s}" for b, s in self.statuses.items() if s != "completed"]
        if self.terminal_after_back_s > within_s:
            found.append(f"terminal {self.terminal_after_back_s:.0f}s after the stack was back (> {within_s:.0f}s)")
        if self.lost or self.duplicated:
            found.append(f"{self.lost} lines lost, {self.duplicated} duplicated")
        if self.error_codes.get("engine_unavailable"):
            found.append(f"{self.error_codes['engine_unavailable']} lines ended engine_unavailable")
        if self.zombies:
            found.append(f"flow runs unended without a process: {self.zombies}")
        if self.one_batch_for_the_key is False:
            found.append("the retried create made a second batch")
        return found


class Chaos:
    def __init__(self, settings, job, key: str, lines: int):
        from pronk.stack import embedded as stack

        self.stack = stack
        self.settings = settings
        self.job = job
        self.key = key
        self.lines = lines
        self.client = openai.OpenAI(
            api_key=key, base_url=f"http://127.0.0.1:{settings.api_port}/v1", max_retries=5, timeout=60
        )

    def upload(self, lines: int, name: str) -> str:
        data = "\n".join(slow_line(f"{name}-{i}", self.job.served_model_name) for i in range(lines)).encode()
        return self.client.files.create(file=(f"{name}.jsonl", data), purpose="batch").id

    def create(self, file_id: str) -> str:
        return self.client.batches.create(input_file_id=file_id, endpoint=REPLAY_URL, completion_window="24h").id  # type: ignore[arg-type]

    def wait(self, batch_id: str, done, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                batch = self.client.batches.retrieve(batch_id)
                if done(batch) or time.monotonic() > deadline:
                    return batch
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def restart_missing(self) -> None:
        """`pronk stack up`: the parts that are not running start again; the running ones are left alone."""
        self.stack.up(self.settings, mlflow_ui=False)

    def inject(self, fault: str) -> None:
        state = self.stack.read_state(self.settings)
        if fault == "drainer-kill":
            for pid in flow_run_pids(self.settings.data_dir):
                os.kill(pid, signal.SIGKILL)
        elif fault == "stack-restart":
            self.stack.down(self.settings)
            self.restart_missing()
        elif fault == "postgres-restart":
            from pronk.stack.postgres import POSTGRES
            from pronk.stack.processes import alive

            if POSTGRES not in state:
                raise SystemExit("postgres-restart needs Prefect on PostgreSQL (this stack runs it on SQLite)")
            os.kill(state[POSTGRES], signal.SIGINT)
            deadline = time.monotonic() + 60
            while alive(state[POSTGRES]) and time.monotonic() < deadline:
                time.sleep(0.2)
            self.restart_missing()
        elif fault == "prefect-restart":
            from pronk.stack.processes import stop

            stop(state["prefect-server"])
            self.restart_missing()
        else:
            raise ValueError(fault)

    def api_kill(self, outcome: Outcome) -> list[str]:
        """SIGKILL the API while a create is in flight, start it again, send the create again with the same key."""
        file_id = self.upload(self.lines, "api-kill")
        headers = {"Authorization": f"Bearer {self.key}", "Idempotency-Key": "chaos-api-kill"}
        body = {"input_file_id": file_id, "endpoint": REPLAY_URL, "completion_window": "24h"}
        url = f"http://127.0.0.1:{self.settings.api_port}/v1/batches"
        first: dict = {}

        def send() -> None:
            try:
                first["answer"] = httpx.post(url, json=body, headers=headers, timeout=60).json()
            except httpx.HTTPError as exc:
                first["error"] = f"{type(exc).__name__}"

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.02)
        os.kill(self.stack.read_state(self.settings)["api"], signal.SIGKILL)
        sender.join()
        started = time.monotonic()
        self.restart_missing()
        outcome.back_s = time.monotonic() - started
        again = httpx.post(url, json=body, headers=headers, timeout=60)
        again.raise_for_status()
        batch_id = again.json()["id"]
        listed = [b.id for b in self.client.batches.list(limit=100) if b.input_file_id == file_id]
        outcome.one_batch_for_the_key = listed == [batch_id] and first.get("answer", {}).get("id", batch_id) == batch_id
        outcome.notes.append(f"first create: {first.get('error') or 'answered'}")
        return [batch_id]

    def run(self, fault: str, within_s: float) -> Outcome:
        outcome = Outcome(fault)
        if fault == "api-kill":
            ids = self.api_kill(outcome)
            back = time.monotonic()
            outcome.batches = {ids[0]: self.lines}
        else:
            batch_id = self.create(self.upload(self.lines, fault))
            self.wait(batch_id, lambda b: b.status in TERMINAL or b.request_counts.completed > 0, 600)
            started = time.monotonic()
            self.inject(fault)
            back = time.monotonic()
            outcome.back_s = back - started
            after = self.create(self.upload(1, f"{fault}-after"))
            outcome.batches = {batch_id: self.lines, after: 1}
        zombies_at = back + ZOMBIE_CHECK_S
        for batch_id in outcome.batches:
            left = max(1.0, within_s - (time.monotonic() - back)) + 600  # keep waiting past the bound, to report it
            batch = self.wait(batch_id, lambda b: b.status in TERMINAL, left)
            outcome.statuses[batch_id] = batch.status
            self.count_lines(batch, outcome)
        outcome.terminal_after_back_s = time.monotonic() - back
        time.sleep(max(0.0, zombies_at - time.monotonic()))
        outcome.zombies = zombie_runs()
        return outcome

    def count_lines(self, batch, outcome: Outcome) -> None:
        seen: Counter = Counter()
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            for line in self.client.files.content(file_id).text.splitlines():
                row = json.loads(line)
                seen[row["custom_id"]] += 1
                if row.get("error"):
                    outcome.error_codes[row["error"]["code"]] += 1
        expected = outcome.batches[batch.id]
        outcome.lost += max(0, expected - len(seen))
        outcome.duplicated += sum(n - 1 for n in seen.values() if n > 1)


def zombie_runs() -> list[str]:
    """Unended runs of pronk's flows whose process is gone, judged on this host."""
    from pronk.control.dead_runs import find_dead

    return [f"{run.name} ({run.why})" for run in asyncio.run(find_dead(judge_remote=False))]


def markdown(outcomes: list[Outcome], command: str, within_s: float, database: str) -> str:
    rows = [
        "## Chaos: faults mid-batch (#65)",
        "",
        f"`{command}` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Prefect on "
        f"{database}. Each fault lands once the batch's first lines are out; a 1-line batch is created once the "
        f"stack is back. A fault passes when every batch completes within {within_s:.0f} s of the stack being back, "
        "each input line ends as one output or error line, none `engine_unavailable`, and no flow run of pronk's "
        f"flows is unended without its process {ZOMBIE_CHECK_S:.0f} s after.",
        "",
        "| fault | batches | back after | terminal after back | lost / duplicated | error lines | unended dead runs "
        "| passed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        errors = ", ".join(f"{n} × {code}" for code, n in sorted(o.error_codes.items())) or "none"
        statuses = ", ".join(f"{n} × {s}" for s, n in sorted(Counter(o.statuses.values()).items()))
        failures = o.failures(within_s)
        rows.append(
            f"| {o.fault} | {statuses} | {o.back_s:.0f} s | {o.terminal_after_back_s:.0f} s | {o.lost} / "
            f"{o.duplicated} | {errors} | {len(o.zombies)} | {'yes' if not failures else '; '.join(failures)} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default=",".join(FAULTS), help="Faults to inject, in order, comma-separated.")
    parser.add_argument("--lines", type=int, default=300, help="Lines of each fault's batch.")
    parser.add_argument("--job", default="tiny-cpu", help="The job (name or id) the stack runs and the batches go to.")
    parser.add_argument("--within-s", type=float, default=180.0, help="Bound on terminal after the stack is back.")
    parser.add_argument("--record", action="store_true", help="Write the section into bench/RESULTS.md.")
    args = parser.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    if unknown := sorted(set(faults) - set(FAULTS)):
        parser.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")

    work, settings, job = scratch_stack_for("chaos", args.job, PRONK_API_AUTH="true", PRONK_RECONCILE_INTERVAL_S="5")
    from pronk.api.keys import ApiKeyStore
    from pronk.stack import embedded as stack

    outcomes = []
    try:
        stack.up(settings, mlflow_ui=False)
        key, _ = ApiKeyStore(settings).create(name="chaos")
        chaos = Chaos(settings, job, key, args.lines)
        for fault in faults:
            print(f"{time.strftime('%H:%M:%S')} {fault} ...", file=sys.stderr)
            outcome = chaos.run(fault, args.within_s)
            print(
                f"{time.strftime('%H:%M:%S')} {fault}: {outcome.failures(args.within_s) or 'passed'}", file=sys.stderr
            )
            outcomes.append(outcome)
        database = stack.prefect_database(settings)
    finally:
        stack.down(settings)
    command = "python -m bench.experiments.chaos " + " ".join(argv if argv is not None else sys.argv[1:])
    section = markdown(outcomes, command.strip(), args.within_s, database)
    print(section)
    if args.record:
        record_section(BENCH_DIR / "RESULTS.md", section)
    print(f"scratch dir: {work}", file=sys.stderr)
    if any(o.failures(args.within_s) for o in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
