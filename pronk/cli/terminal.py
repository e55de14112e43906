"""What every `pronk` command shares on the terminal: the `--job` option they all take alike, a refusal or a failure
the user can act on, as one line, and a progress bar while a long run goes (a batch's lines, an improve round's
phases), read from the run's record."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, NoReturn

import typer

from pronk.pronk_error import PronkError
from pronk.settings import Settings, get_settings

JobOption = Annotated[str | None, typer.Option("--job", help="Job id or name (default: the settings' default job).")]


def fail(message: str) -> NoReturn:
    """Say what is wrong on stderr and exit 1."""
    typer.echo(f"pronk: {message}", err=True)
    raise typer.Exit(1)


def expected_failure(exc: BaseException) -> str | None:
    """The one-line message of a failure the user can act on, or None for anything else (a bug, whose traceback is
    wanted): a `PronkError` (a refusal, a job that does not exist) says what is wrong itself; a server the command
    needs that does not answer (the stack's Prefect, a worker, the API) is named by its address, whether it is the
    error itself or what caused it (`raise ... from`); a bug raised while handling one keeps its traceback."""
    if isinstance(exc, PronkError):
        return str(exc)
    import httpx

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, (httpx.ConnectError, httpx.ConnectTimeout)):
        cause = cause.__cause__
    if cause is None:
        return None
    try:
        address = str(cause.request.url.copy_with(path="/", query=None)).rstrip("/")
    except RuntimeError:  # an httpx error raised without its request
        address = "a server this command needs"
    return f"cannot reach {address} ({str(cause) or type(cause).__name__}): is the stack up? `pronk stack up` starts it"


Reading = tuple[str, int, int | None]
"""What a progress bar shows: what is under way, how far it has got, and of how much (None: not known yet)."""


def _draw_progress(read: Callable[[], Reading | None], label: str, stop: threading.Event) -> None:
    """Draw a progress bar on stderr from `read` (None: nothing to show yet) about twice a second until `stop` is
    set; a record that cannot be read at one redraw is read again at the next."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("", total=None)
        while not stop.wait(0.5):
            try:
                reading = read()
            except (OSError, ValueError):
                continue
            if reading is not None:
                description, done, total = reading
                bar.update(task, description=description, completed=done, total=total)


@contextlib.contextmanager
def progress_bar(read: Callable[[], Reading | None], label: str) -> Iterator[None]:
    """A progress bar drawn from `read` while the block runs, when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=_draw_progress, args=(read, label, stop), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


def batch_progress(batch_id: str | Callable[[], str], label: str) -> contextlib.AbstractContextManager[None]:
    """A progress bar of the batch's lines while the block runs, from its record's request counts (`batch_id`: the
    batch, or a function naming it at each redraw)."""
    from pronk.batches.store import BatchStore

    store = BatchStore(get_settings())

    def read() -> Reading:
        batch = store.load(batch_id if isinstance(batch_id, str) else batch_id())
        counts = batch.request_counts
        return batch.status, counts.completed + counts.failed + counts.cancelled, counts.total or None

    return progress_bar(read, label)


def improve_reading(job_id: str, since: float, settings: Settings) -> Callable[[], Reading | None]:
    """How far the job's improve round begun after `since` has got, from its record: the rollouts checked, the
    training steps with their loss, then the lines its Leap's canary has checked (None: no such round yet)."""
    from pronk.improve.rounds import RoundStore
    from pronk.leap.records import LeapStore

    rounds, leaps = RoundStore(settings), LeapStore(settings)

    def read() -> Reading | None:
        record = rounds.latest(job_id)
        if record is None or record.started_at < since:
            return None
        leap = leaps.latest(job_id) if record.status == "leaping" else None
        if leap is None or leap.canary is None or leap.to_version != record.version:
            return record.shown()
        return record.shown(leap.canary.checked)

    return read


ANSWER_CHARS = 100


def answers_table(lines: list[dict], count: int) -> str:
    """Output and error lines as `custom_id  check  answer` rows, by custom id: the first `count` of them, each
    answer on one line and cut to ANSWER_CHARS (an error line shows its error)."""
    rows = []
    for line in sorted(lines, key=lambda line: str(line.get("custom_id")))[:count]:
        error = line.get("error")
        if error:
            check, text = "failed", f"error {error.get('code')}: {error.get('message')}"
        else:
            body = line["response"]["body"]
            check = body.get("pronk", {}).get("check", {}).get("status", "unchecked")
            text = body["choices"][0]["message"]["content"] or ""
        text = " ".join(str(text).split())
        rows.append(
            (str(line.get("custom_id")), check, text[:ANSWER_CHARS] + ("…" if len(text) > ANSWER_CHARS else ""))
        )
    width = max((len(row[0]) for row in rows), default=9)
    return "\n".join(f"{cid:<{width}}  {check:<9}  {text}" for cid, check, text in rows)
