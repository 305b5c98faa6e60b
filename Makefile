# Everything a fresh machine needs: `make serve` and `make test` create the venv themselves.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3.12)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
DATA_DIR ?= ./data

.PHONY: venv serve test bench lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml registry/_newevent.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/whip-ingest serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/wal.py > bench-wal.json
	$(BIN)/python bench/crash.py > bench-crash.json
	$(BIN)/python bench/whip.py > bench-whip.json
	$(BIN)/python bench/api.py > bench-api.json
	$(BIN)/python bench/decode.py > bench-decode.json
	$(BIN)/python bench/capacity.py > bench-capacity.json
	$(BIN)/python bench/soak.py > bench-soak.json
	@echo "figures in bench-*.json"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
