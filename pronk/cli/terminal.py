"""What every `pronk` command shows on the terminal: a refusal or a failure the user can act on, as one line, and a
batch's progress bar while it runs."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

import typer

from pronk.errors import PronkError


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


def _draw_progress(batch_id: str | Callable[[], str], label: str, stop: threading.Event) -> None:
    """Draw a progress bar on stderr from the batch record's request counts until `stop` is set (`batch_id`: the
    batch, or a function naming it at each redraw)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pronk.batches.store import BatchStore
    from pronk.settings import get_settings

    store = BatchStore(get_settings())
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("batch", total=None)
        while not stop.wait(0.5):
            try:
                batch = store.load(batch_id if isinstance(batch_id, str) else batch_id())
            except (OSError, ValueError):
                continue
            counts = batch.request_counts
            bar.update(
                task,
                total=counts.total or None,
                completed=counts.completed + counts.failed + counts.cancelled,
                description=batch.status,
            )


@contextlib.contextmanager
def batch_progress(batch_id: str | Callable[[], str], label: str) -> Iterator[None]:
    """A progress bar for the batch while the block runs, when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=_draw_progress, args=(batch_id, label, stop), daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


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
