# Everything a fresh machine needs: `make serve` and `make test` create .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
REPO ?= model_repository
GRPC_PORT ?= 8001
HTTP_PORT ?= 8000
METRICS_PORT ?= 8002

.PHONY: install serve test models proto bench check clean

# The server with its TorchScript backend, the client package (clients/) and what the
# README's examples import: every README example runs against `make serve` as written.
$(STAMP): pyproject.toml clients/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: this exact CPU build lies on local disk; any other spec pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[torch,examples]' -e ./clients
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e '.[torch,examples,test]' -e ./clients
	touch $@

install: $(STAMP)

models: $(STAMP)
	$(PY) -m inferd.examples.build --output $(REPO)

serve: $(STAMP) models
	$(VENV)/bin/inferd serve --model-repository $(REPO) --grpc-port $(GRPC_PORT) --http-port $(HTTP_PORT) --metrics-port $(METRICS_PORT)

check: $(STAMP) models
	$(VENV)/bin/inferd check $(REPO)

test: $(TEST_STAMP) models
	$(PY) -m pytest -q -p no:cacheprovider tests

# Regenerate inferd/_proto from proto/*.proto (the generated modules are committed).
proto: $(TEST_STAMP)
	$(PY) -m inferd._proto.generate

bench: $(TEST_STAMP) models
	$(PY) -m perf.bench

clean:
	rm -rf $(VENV) build *.egg-info
