# The two commands of the README: `make demo` (install + run the sample batch and the sample enrichment end to end)
# and `make test`.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test unit lint typecheck down bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh

demo: install
	$(BIN)/pronk stack up
	$(BIN)/pronk batch run data/sample_batch.jsonl --job tiny-cpu --out out/sample
	$(BIN)/pronk enrich run companies

# Lint and type checks first, then the whole suite (CI's .ci/run calls this).
test: install lint typecheck
	$(BIN)/python -m pytest

# The tests that need no server (seconds).
unit: install
	$(BIN)/python -m pytest -m "not e2e"

# ruff (lint and format) and the import layers (import-linter contracts in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

down:
	$(BIN)/pronk stack down

# pronk vs N stock vLLM servers, the Herd's ablations and the offline limit on both agent profiles (3 rounds each,
# traces >= 3x the concurrency), plus the single-step file; records bench/RESULTS.md and bench/results/results.json.
bench: install
	$(BIN)/pronk bench --record --job agent-long --profile agent-long --rounds 3 --single-step-requests 0
	$(BIN)/pronk bench --record --job tiny-cpu-herd --profile cpu --rounds 3 --traces 96
