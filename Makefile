# Everything a fresh machine needs: `make serve` and `make test` create the venv themselves.
PYTHON ?= $(shell command -v python3.12 2>/dev/null || echo python3.12)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
DATA_DIR ?= ./data
C_EXTENSIONS := registry/_framing registry/_newevent pipeline/_luma
SANITIZE_DIR := build/sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer -g -O1

.PHONY: venv serve test bench lint sanitize clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(C_EXTENSIONS:%=%.c)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/whip-ingest serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

# The whole suite on the shared UDP port (the default), then the WHIP session files
# again with a UDP socket per session (ice.udp_mux = false): the session files only, to stay
# in the 15-minute budget (the whole suite with WHIP_TEST_ICE_UDP_MUX=0 runs by hand).
NO_MUX_TESTS := tests/test_whip.py tests/test_whip_dtls.py tests/test_whip_trickle.py \
	tests/test_peer_connections.py tests/test_reclaimer.py

# Two pytest workers (pytest-xdist), each taking whole files (module fixtures stay
# shared): most tests wait on real time (media pushes, leases, crash loops), so two run
# well side by side on two cores. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

# The 500-POST burst asserts /healthz p99 < 100 ms as an outside client sees it (issue 6):
# a figure of the server under its own burst, so that file runs alone, after the others
# (beside another worker's Chromium push it measured the host's load: 190 ms at load 4-5).
ALONE_TESTS := tests/test_load.py

test: $(STAMP)
	bash .ci/test-packages
	$(BIN)/python -m pytest $(PARALLEL) $(ALONE_TESTS:%=--ignore=%) $(PYTEST_ARGS)
	$(BIN)/python -m pytest $(ALONE_TESTS) $(PYTEST_ARGS)
	WHIP_TEST_ICE_UDP_MUX=0 $(BIN)/python -m pytest $(PARALLEL) $(NO_MUX_TESTS) $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/wal.py > bench-wal.json
	$(BIN)/python bench/crash.py > bench-crash.json
	$(BIN)/python bench/whip.py > bench-whip.json
	$(BIN)/python bench/api.py > bench-api.json
	$(BIN)/python bench/decode.py > bench-decode.json
	$(BIN)/python bench/analysis_ablation.py > bench-analysis-ablation.json
	$(BIN)/python bench/rtp_payload.py > bench-rtp-payload.json
	$(BIN)/python bench/stream_lint.py > bench-stream-lint.json
	$(BIN)/python bench/recording.py > bench-recording.json
	$(BIN)/python bench/twcc.py > bench-twcc.json
	$(BIN)/python bench/simulcast.py > bench-simulcast.json
	$(BIN)/python bench/ramp.py > bench-ramp.json
	$(BIN)/python bench/capacity.py > bench-capacity.json
	$(BIN)/python bench/soak.py > bench-soak.json
	$(BIN)/python bench/webhooks.py > bench-webhooks.json
	$(BIN)/python bench/webhook_wakeups.py > bench-webhook-wakeups.json
	$(BIN)/python bench/fsync_interference.py > bench-fsync-interference.json
	$(BIN)/python bench/dashboard.py > bench-dashboard.json
	$(BIN)/python bench/cluster.py > bench-cluster.json
	@echo "figures in bench-*.json"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(MAKE) --no-print-directory sanitize

# The C extensions built with ASan and UBSan, and their tests run against those builds:
# each sanitized module is loaded as <package>.<name> before its package is imported
# (PYTHONMALLOC=malloc: every object allocation is one ASan can see; --capture=sys: a
# sanitizer's report on fd 2 reaches the terminal).
define LOAD_SANITIZED
import importlib.util, pathlib, sys
split = sys.argv.index("--")
loaded = {}
for path in sys.argv[1:split]:
    name = pathlib.Path(path).parent.name + "." + pathlib.Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
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
	rm -rf $(SANITIZE_DIR) && mkdir -p $(SANITIZE_DIR)/registry $(SANITIZE_DIR)/pipeline
	for ext in $(C_EXTENSIONS); do \
		$(CC) -shared -fPIC -std=c99 -Wall -Wextra -Werror $(SANITIZE_FLAGS) \
			-I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("include"))')" \
			$$ext.c -o $(SANITIZE_DIR)/$$ext.so || exit 1; \
	done
	LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc \
		$(BIN)/python -c "$$LOAD_SANITIZED" $(C_EXTENSIONS:%=$(SANITIZE_DIR)/%.so) -- \
		tests/test_framing.py tests/test_newevent_fast.py tests/test_luma.py -q -p no:cacheprovider \
		--capture=sys

clean:
	rm -rf $(VENV) build *.egg-info
