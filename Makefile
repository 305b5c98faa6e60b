# Everything a fresh machine needs: `make serve` and `make test` create the venv themselves.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3.12)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
DATA_DIR ?= ./data
C_EXTENSIONS := _framing _newevent
SANITIZE_DIR := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer -g -O1

.PHONY: venv serve test bench lint sanitize clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(C_EXTENSIONS:%=registry/%.c)
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
	$(MAKE) --no-print-directory sanitize

# The C extensions built with ASan and UBSan, and their tests run against those builds:
# each sanitized module is loaded as registry.<name> before registry is imported
# (PYTHONMALLOC=malloc: every object allocation is one ASan can see; --capture=sys: a
# sanitizer's report on fd 2 reaches the terminal).
define LOAD_SANITIZED
import importlib.util, pathlib, sys
split = sys.argv.index("--")
loaded = {}
for path in sys.argv[1:split]:
    spec = importlib.util.spec_from_file_location("registry." + pathlib.Path(path).stem, path)
    loaded[spec.name] = module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
import pytest, registry.events, registry.record
assert registry.events.HAVE_C_NEW_EVENT and registry.record.HAVE_C_FRAMING
assert all(sys.modules[name] is module for name, module in loaded.items())
raise SystemExit(pytest.main(sys.argv[split + 1 :]))
endef
export LOAD_SANITIZED

sanitize: $(STAMP)
	rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)
	for ext in $(C_EXTENSIONS); do \
		$(CC) -shared -fPIC -std=c99 -Wall -Wextra -Werror $(SANITIZE_FLAGS) \
			-I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("include"))')" \
			registry/$$ext.c -o $(SANITIZE_DIR)/$$ext.so || exit 1; \
	done
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc \
		$(BIN)/python -c "$$LOAD_SANITIZED" $(C_EXTENSIONS:%=$(SANITIZE_DIR)/%.so) -- \
		tests/test_framing.py tests/test_newevent_fast.py -q -p no:cacheprovider --capture=sys

clean:
	rm -rf $(VENV) build *.egg-info
