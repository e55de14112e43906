# The two commands of the README: `make demo` (install + run the sample batch and the sample enrichment end to end)
# and `make test`.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test unit lint typecheck down bench bench-smoke

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh

# The default job is SmolLM2-135M-Instruct on CPU: each batch prints its answers and how each one checked.
demo: install
	$(BIN)/pronk stack up
	$(BIN)/pronk batch run data/sample_batch.jsonl --out out/sample --answers 8
	$(BIN)/pronk batch run data/agent_batch.jsonl --out out/agents --answers 9
	$(BIN)/pronk enrich run companies

# The whole suite (CI's .ci/run calls this): lint; then the type check beside the unit tests (one core each);
# then the end-to-end tests. The benchmark's own smoke runs (bench_smoke, ~6 minutes) guard the benchmark rather
# than pronk: `make bench-smoke`, and `make bench` first.
test: install lint
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & typing=$$!; \
	$(BIN)/python -m pytest -m "not e2e"; units=$$?; \
	wait $$typing; typed=$$?; cat $(VENV)/mypy.log; \
	[ $$units -eq 0 ] && [ $$typed -eq 0 ]
	$(BIN)/python -m pytest -m "e2e and not bench_smoke" --durations=25

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

# `python -m bench` and `python -m bench.experiments.herd` end to end on a tiny workload: every setup and figure exists.
bench-smoke: install
	$(BIN)/python -m pytest -m bench_smoke

# pronk vs N stock vLLM servers behind round-robin and behind vllm-router (the peers: cache_aware and
# sticky_least_loaded, from the bench extra that `install` puts in .venv), the Herd's ablations and the two offline
# limits on both replay profiles (3 rounds each, traces >= 3x the concurrency), plus the single-step file, then the
# labelled set's checked agent tasks on SmolLM2 (agent-real); records bench/RESULTS.md and bench/results/results.json.
# agent-long runs twice: as is, and with a KV host tier on every side beside stock vLLM without one (the
# agent-long-tiered record).
bench: install bench-smoke
	$(BIN)/python -m bench --record --job agent-long --profile agent-long --rounds 3 --single-step-requests 0
	$(BIN)/python -m bench --record --job agent-long-tiered --profile agent-long --rounds 3 --single-step-requests 0
	$(BIN)/python -m bench --record --job tiny-cpu-herd --profile cpu --rounds 3 --traces 96
	$(BIN)/python -m bench --record --job agent-real --profile agent-real --rounds 3
