# The two commands of the README: `make demo` (install + run the sample batch end to end) and `make test`.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test down bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh

demo: install
	$(BIN)/pronk stack up
	$(BIN)/pronk batch run data/sample_batch.jsonl --job tiny-cpu --out out/sample

test: install
	$(BIN)/python -m pytest

down:
	$(BIN)/pronk stack down

# pronk vs N stock vLLM servers on the same agent traces and single-step file; records bench/RESULTS.md.
bench: install
	$(BIN)/pronk bench --record --rounds 3 --traces 32
