"""RESULTS.md and the dated notes: a new record or section replaces the current one, which moves to the notes of
its date, reading included; nothing else on the page moves and no figure is lost."""

from __future__ import annotations

from bench.harness.results_md import END, START, markers, record_section, write_results_md

PAGE = """# Benchmark results

What stands; dated probes are in notes/.

<!-- bench:agent-long:start -->
## pronk vs stock vLLM on agent traces: profile `agent-long`

Run 2026-12-07 13:47 UTC on vm, traces/s 0.263.

![trace completion times](results/completion_times_agent-long.png)
<!-- bench:agent-long:end -->

### Reading the agent-long record (written by hand, 2026-12-07 13:55 UTC)

pronk made 2.64x stock; see [the plot's data](results/results.json), [the probes](notes/2026-12-06.md), [the
ceilings](#the-two-ceilings-41) and [the docs](../docs/benchmarks.md).

<!-- bench:main:start -->
## pronk vs stock vLLM on agent traces: profile `cpu`

Run 2026-12-07 12:32 UTC, traces/s 0.770.
<!-- bench:main:end -->

### Reading the cpu record

1.62x stock.

## Leap

A switch took 93 ms.

## API burst

Run on 2026-12-03 12:40 UTC: 62 creates answered.
"""


def test_the_first_record_goes_before_the_first_section_and_the_cpu_profile_keeps_the_main_markers(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\nAn intro.\n\n## Gap KV\n\nkept\n")
    write_results_md(path, "## main\n\nfirst")
    text = path.read_text()
    assert text.index("An intro.") < text.index(START) < text.index(END) < text.index("## Gap KV")
    assert markers("cpu") == (START, END) and "kept" in text and not (tmp_path / "notes").exists()


def test_a_new_record_replaces_the_profiles_and_its_reading_moves_to_the_notes_of_its_date(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(PAGE)
    record = "## pronk vs stock vLLM on agent traces: profile `agent-long`\n\nRun 2026-12-09, 0.3."
    write_results_md(path, record, "agent-long")
    text = path.read_text()
    assert "Run 2026-12-09, 0.3." in text and "0.263" not in text and "Reading the agent-long record" not in text
    assert text.index("Run 2026-12-09") < text.index(START) and "1.62x stock" in text and "## Leap" in text
    assert text.count("<!-- bench:agent-long:") == 2

    notes = (tmp_path / "notes" / "2026-12-07.md").read_text()
    assert notes.startswith("# Benchmark notes of 2026-12-07\n") and "bench:" not in notes
    assert "Run 2026-12-07 13:47 UTC on vm, traces/s 0.263." in notes and "pronk made 2.64x stock" in notes
    assert notes.index("profile `agent-long`") < notes.index("Moved here from RESULTS.md") < notes.index("0.263")
    assert "](results/" not in notes and "[the plot's data](../results/results.json)" in notes
    assert "[the probes](2026-12-06.md)" in notes and "(../RESULTS.md#the-two-ceilings-41)" in notes
    assert "[the docs](../../docs/benchmarks.md)" in notes
    assert "trace completion times: `results/completion_times_agent-long.png`, since written over" in notes


def test_a_new_section_replaces_the_experiments_and_the_old_one_joins_the_notes_of_its_date_or_today(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(PAGE)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "2026-12-03.md").write_text("# Benchmark notes of 2026-12-03\n\n## A probe\n\nkept.\n")
    record_section(path, "## API burst\n\n50 creates, all answered.\n")
    record_section(path, "## Leap\n\nA switch took 80 ms.\n")
    record_section(path, "## Enrichment overhead\n\n1.03x.\n")
    text = path.read_text()
    assert "50 creates" in text and "62 creates" not in text and "80 ms" in text and "93 ms" not in text
    assert text.index("## Leap") < text.index("## API burst") < text.index("## Enrichment overhead")
    assert text.count("<!-- bench:") == 4 and "1.62x stock" in text

    burst = (tmp_path / "notes" / "2026-12-03.md").read_text()
    assert burst.index("kept.") < burst.index("## API burst") < burst.index("62 creates answered")
    (today,) = [p for p in (tmp_path / "notes").iterdir() if p.name != "2026-12-03.md"]
    assert "A switch took 93 ms." in today.read_text()  # it names no date: the notes of the day it was replaced
