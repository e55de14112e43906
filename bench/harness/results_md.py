"""`bench/RESULTS.md`, the page a reader opens, and `bench/notes/<date>.md`, where whatever it no longer shows goes.

RESULTS.md holds each profile's current record with its reading (written by hand) and the standing result of each
experiment. A profile's record sits between its two markers (`markers`); the text after its end marker, up to the
next marker or `## ` heading, is its reading. An experiment's section is a `## ` heading and what follows it, up to
the next. Writing a record or a section replaces the current one, and the one replaced (a record with its reading)
is appended to the notes of its own date, the first date it names (else the day it was replaced), so no figure is
ever lost: a reader finds what stands on one page and every earlier figure by date.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

TITLE = "# Benchmark results"
START, END = "<!-- bench:main:start -->", "<!-- bench:main:end -->"
MARKER = "<!-- bench:"
NEXT_SECTION = re.compile(rf"^(?:## |{re.escape(MARKER)})", re.MULTILINE)
DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")
PLOT = re.compile(r"!\[([^\]]*)\]\(results/([^)]*)\)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NOTES_HEAD = (
    "Dated probes, the full write-ups [RESULTS.md](../RESULTS.md) sums up, and the records and sections it no longer "
    "shows since newer ones replaced them, as they were written."
)


def markers(profile: str) -> tuple[str, str]:
    """The markers around a profile's record (the `cpu` profile keeps the original main section's)."""
    return (START, END) if profile == "cpu" else (f"{MARKER}{profile}:start -->", f"{MARKER}{profile}:end -->")


def _section_end(text: str, after: int) -> int:
    """Where the section under way at `after` ends: at the next marker or `## ` heading, else at the end."""
    found = NEXT_SECTION.search(text, after)
    return found.start() if found else len(text)


def write_results_md(path: Path, section: str, profile: str = "cpu") -> Path:
    """Put the profile's record in RESULTS.md: in place of its current one, which goes to the dated notes with its
    reading, or, the first time, before the first record or `## ` section (with neither, at the end)."""
    start, end = markers(profile)
    block = f"{start}\n{section.strip()}\n{end}\n\n"
    text = path.read_text() if path.exists() else f"{TITLE}\n"
    at = text.find(start)
    if at >= 0 and text.find(end, at) >= 0:
        stop = _section_end(text, text.index(end, at) + len(end))
        retire(path, text[at:stop])
        text = text[:at] + block + text[stop:]
    else:
        first = NEXT_SECTION.search(text)
        at = first.start() if first else len(text)
        text = text[:at].rstrip("\n") + "\n\n" + block + text[at:]
    path.write_text(text.rstrip() + "\n")
    return path


def record_section(path: Path, section: str) -> None:
    """Replace the `## ` section of RESULTS.md whose heading is `section`'s first line (the current one goes to the
    dated notes), or add it at the end; the other sections stay as they are."""
    heading = section.split("\n", 1)[0]
    text = path.read_text() if path.exists() else f"{TITLE}\n"
    found = re.search(rf"^{re.escape(heading)}$", text, re.MULTILINE)
    if found is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        stop = _section_end(text, found.end())
        retire(path, text[found.start() : stop])
        text = text[: found.start()] + section.rstrip("\n") + "\n\n" + text[stop:]
    path.write_text(text.rstrip() + "\n")


def _from_notes(target: str) -> str:
    """A link of RESULTS.md as it reads from `notes/`."""
    if "://" in target or target.startswith("mailto:"):
        return target
    if target.startswith("#"):
        return f"../RESULTS.md{target}"
    return target.removeprefix("notes/") if target.startswith("notes/") else f"../{target}"


def retire(results: Path, old: str, today: str | None = None) -> Path:
    """Append `old`, a record (with its reading) or a section RESULTS.md no longer shows, to `notes/<date>.md` beside
    `results`: the first date it names, else `today` (default: today). Its links are made to resolve from `notes/`,
    and its plot, which the newer record wrote over, is named instead of shown."""
    today = today or datetime.now(UTC).date().isoformat()
    text = re.sub(rf"^{re.escape(MARKER)}.*-->\n?", "", old, flags=re.MULTILINE).strip()
    text = PLOT.sub(r"(\1: `results/\2`, since written over by a newer record)", text)
    text = LINK.sub(lambda link: f"]({_from_notes(link.group(1))})", text)
    found = DATE.search(text)
    day = found.group(1) if found else today
    heading, _, rest = text.partition("\n")
    moved = f"{heading}\n\n*Moved here from RESULTS.md on {today}, when a newer one replaced it.*\n{rest}"
    notes = results.parent / "notes" / f"{day}.md"
    notes.parent.mkdir(parents=True, exist_ok=True)
    head = notes.read_text().rstrip("\n") if notes.exists() else f"# Benchmark notes of {day}\n\n{NOTES_HEAD}"
    notes.write_text(f"{head}\n\n{moved.rstrip()}\n")
    return notes
