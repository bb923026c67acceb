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
# Triton's perf_analyzer (PyPI perf-analyzer), for `make bench` and the tests that use it (skipped without it).
PERF_ANALYZER ?= perf_analyzer
export PERF_ANALYZER
TORCH_SPEC ?= torch==2.13.0

.PHONY: install serve test models proto bench check clean gpu-wheels

# The server with its TorchScript backend, the client package (clients/) and what the
# README's examples import: every README example runs against `make serve` as written.
$(STAMP): pyproject.toml clients/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned to the CPU build: unpinned, PyPI's Linux default is the multi-GB CUDA build
	# (README "Install" says how to choose; TORCH_SPEC overrides, e.g. TORCH_SPEC='torch==2.13.0+cpu').
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e '.[onnx,torch,examples]' -e ./clients
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e '.[onnx,torch,examples,test]' -e ./clients
	touch $@

install: $(STAMP)

models: $(STAMP)
	$(PY) -m inferd.examples.build --output $(REPO)

serve: $(STAMP) models
	$(VENV)/bin/inferd serve --model-repository $(REPO) --grpc-port $(GRPC_PORT) --http-port $(HTTP_PORT) --metrics-port $(METRICS_PORT)

check: $(STAMP) models
	$(VENV)/bin/inferd check $(REPO)

# The whole suite with frontend workers (two: serve's default from three cores up), then the
# server-level modules again in one process (--frontend-workers 0, serve's default on one or two
# cores): both modes pass, each behind the gRPC front (Envoy; the modules that test grpc.aio's own
# port pin --grpc-front grpcio). The second
# half runs even when the first failed (a failure in one mode says nothing about the other), and
# make fails at the end if either did. Any non-zero pytest status fails, 5 too: a half that
# collected no tests proved nothing.
# Each half runs its test files on TEST_WORKERS pytest-xdist processes, a file's tests together
# in one (--dist loadfile: a module's server fixture is started once). One stream of tests keeps
# 2 cores 40-60% idle (servers starting, clients waiting on them): two streams finish both
# halves in ~600 s here against ~960 s one after the other. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
test: $(TEST_STAMP) models
	@default=0; single=0; \
	echo "== make test 1/2: frontend workers: INFERD_TEST_FRONTEND_WORKERS=2 $(PYTEST) tests"; \
	INFERD_TEST_FRONTEND_WORKERS=2 $(PYTEST) tests || default=$$?; \
	echo "== make test 2/2: one process: INFERD_TEST_FRONTEND_WORKERS=0 $(PYTEST) -m 'server and not fixed_mode' tests"; \
	INFERD_TEST_FRONTEND_WORKERS=0 $(PYTEST) -m "server and not fixed_mode" tests || single=$$?; \
	for half in "frontend workers:$$default" "one process:$$single"; do \
	  code=$${half##*:}; what=""; [ "$$code" = 5 ] && what=" (no tests collected)"; \
	  echo "== make test: $${half%:*}: pytest exit $$code$$what"; \
	done; \
	[ "$$default" = 0 ] && [ "$$single" = 0 ]

# Regenerate inferd/_proto from proto/*.proto (the generated modules are committed).
proto: $(TEST_STAMP)
	$(PY) -m inferd._proto.generate

bench: $(TEST_STAMP) models
	$(PY) -m bench

# The wheels bench/gpu_check.sh installs on the GPU machine (Python 3.12, x86-64, no network),
# and perf_analyzer's libraries for a host older than its glibc 2.38, when the shared tool fetched them.
GPU_WHEELS := bench/gpu_wheels
PA_LIBS := $(or $(PERF_ANALYZER_HOME),$(HOME)/.cache/perf_analyzer)/libs/usr/lib/x86_64-linux-gnu
gpu-wheels:
	mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_38_x86_64 \
	  -d $(GPU_WHEELS) -r bench/gpu_wheels.txt
	-$(PERF_ANALYZER) --version >/dev/null 2>&1
	if [ -d $(PA_LIBS) ]; then mkdir -p $(GPU_WHEELS)/palibs && cp -L $(PA_LIBS)/ld-linux-x86-64.so.2 \
	  $(PA_LIBS)/libc.so.6 $(PA_LIBS)/libm.so.6 $(PA_LIBS)/libstdc++.so.6 $(PA_LIBS)/libgcc_s.so.1 \
	  $(PA_LIBS)/libssl.so.3 $(PA_LIBS)/libcrypto.so.3 $(PA_LIBS)/libz.so.1 $(GPU_WHEELS)/palibs/; fi
	du -sh $(GPU_WHEELS)

clean:
	rm -rf $(VENV) build *.egg-info
