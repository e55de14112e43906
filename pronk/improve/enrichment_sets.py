"""An enrichment's labelled sets for the improve loop: its held-out rows, and generated rows to learn from.

    pronk improve enrichment-sets [--spec companies] [--rows 96] [--seed 0]

writes, for the spec (default `deployments/enrichments/companies.yaml`):

- `data/labelled/<spec>-held-out.jsonl`: the rows of the spec's labelled sample (`labels:`) as the enrichment
  itself asks them (`pronk.enrich.run.lines_file`: the same system message, prompt, tools, answer schema and
  check), for Leap's canary;
- `data/labelled/<spec>-train.jsonl`: `rows` made-up companies of the same template, none of them in the table,
  each labelled with the sector its industry belongs to (`SECTOR_OF`, the grouping the labelled sample follows),
  asked the same way.

`pronk improve --job J --training-set data/labelled/companies-train.jsonl --held-out
data/labelled/companies-held-out.jsonl` then runs the loop over the enrichment: rollouts on the made-up rows,
the passes trained on, and a Leap only when the canary holds on the labelled rows.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import polars as pl

from pronk.enrich.lines import input_file
from pronk.enrich.run import lines_file
from pronk.enrich.spec import EnrichSpec
from pronk.enrich.table import plan, read_labels, scan
from pronk.jobs.schema import JobConfig
from pronk.settings import PROJECT_ROOT, Settings

LABELLED = PROJECT_ROOT / "data" / "labelled"

SECTOR_OF = {
    "aerospace": "industrials",
    "automotive": "industrials",
    "construction": "industrials",
    "logistics": "industrials",
    "manufacturing": "industrials",
    "robotics": "industrials",
    "food": "consumer",
    "retail": "consumer",
    "textiles": "consumer",
    "apparel": "consumer",
    "software": "technology",
    "semiconductors": "technology",
    "cloud": "technology",
    "biotech": "health",
    "healthcare": "health",
    "pharma": "health",
    "medical devices": "health",
    "energy": "energy",
    "oil and gas": "energy",
    "solar": "energy",
    "utilities": "energy",
    "fintech": "financials",
    "insurance": "financials",
    "banking": "financials",
    "education": "services",
    "media": "services",
    "consulting": "services",
    "agriculture": "consumer",
}
"""An industry as a source lists it, and its sector (the spec's `sector` enum)."""

WHAT_THEY_DO = {
    "industrials": ["builds {industry} systems for industrial customers", "runs {industry} operations across Europe"],
    "consumer": ["sells {industry} products to households", "makes {industry} goods for shops and supermarkets"],
    "technology": ["develops {industry} products for companies", "sells {industry} platforms by subscription"],
    "health": ["develops {industry} treatments for hospitals", "researches {industry} therapies with clinics"],
    "energy": ["produces {industry} for grid operators", "runs {industry} assets in several countries"],
    "financials": ["offers {industry} services to small businesses", "provides {industry} products to consumers"],
    "services": ["provides {industry} services to organisations", "runs {industry} programmes for clients"],
}
NAME_PARTS = (
    ["Alder", "Brightwater", "Cinder", "Delmar", "Ember", "Fjord", "Granite", "Harbor", "Iris", "Juniper", "Kelvin"],
    ["Labs", "Works", "Group", "Systems", "Holdings", "Partners", "Industries", "Co", "Solutions", "Collective"],
)
COUNTRIES = ["US", "DE", "FR", "NL", "SE", "JP", "GB", "CA", "ES", "IT", "CH", "AU"]


def made_up_rows(count: int, taken: set[str], seed: int) -> list[tuple[dict[str, Any], str]]:
    """`count` companies of the table's columns with names the table does not use, and each one's sector."""
    rng = random.Random(seed)
    industries = sorted(SECTOR_OF)
    rows: list[tuple[dict[str, Any], str]] = []
    names: set[str] = set(taken)
    while len(rows) < count:
        name = f"{rng.choice(NAME_PARTS[0])} {rng.choice(NAME_PARTS[1])}"
        if name in names:
            continue
        names.add(name)
        industry = industries[len(rows) % len(industries)]
        sector = SECTOR_OF[industry]
        row = {
            "company_id": 100_000 + len(rows),
            "name": name,
            "industry": industry,
            "country": rng.choice(COUNTRIES),
            "founded": rng.randint(1950, 2020),
            "employees": rng.randint(50, 20_000),
            "domain": name.lower().replace(" ", "") + ".example",
            "description": f"{name} {rng.choice(WHAT_THEY_DO[sector]).format(industry=industry)}.",
        }
        rows.append((row, sector))
    return rows


def training_file(spec: EnrichSpec, job: JobConfig, table: pl.DataFrame, count: int, seed: int) -> bytes:
    """The made-up rows as the enrichment asks them, each checked against its sector."""
    rows = made_up_rows(count, set(table["name"].to_list()), seed)
    return input_file(spec, job, [(f"made-up-{i}", row, {"sector": sector}) for i, (row, sector) in enumerate(rows)])


def held_out_file(spec: EnrichSpec, job: JobConfig, table: pl.DataFrame, settings: Settings) -> bytes:
    """The rows of the spec's labelled sample, as a run of the enrichment asks them."""
    labels = read_labels(spec, settings)
    labelled = table.filter(pl.Series([key in labels for key in table.select(spec.key).rows()]))
    return lines_file(spec, job, plan(spec, labelled, None, labels=labels))


def write_sets(spec: EnrichSpec, job: JobConfig, rows: int, seed: int, out: Path, settings: Settings) -> list[Path]:
    """Write the spec's training set (`rows` made-up rows from `seed`) and held-out set under `out`; their paths.
    `job`: the spec's job, resolved by the caller."""
    table = scan(spec, settings).collect()
    training, held_out = out / f"{spec.name}-train.jsonl", out / f"{spec.name}-held-out.jsonl"
    training.write_bytes(training_file(spec, job, table, rows, seed))
    held_out.write_bytes(held_out_file(spec, job, table, settings))
    return [training, held_out]
