# Common loops. `make run` and `make test` bootstrap .venv with pip when it is absent.
VENV ?= .venv
PY := $(VENV)/bin/python
TI := $(VENV)/bin/torchinferno
# torch 2.13.0 is the CPU wheel this machine kind installs from its local disk; any torch >= 2.11 works.
TORCH_SPEC ?= torch==2.13.0
MODEL ?= smollm2-135m-instruct
# Two pytest-xdist workers (the `test` extra): run serially the suite keeps ~1 of CI's 2 cores busy. worksteal
# because test times range from ms to ~60 s. PYTEST_ARGS= runs it serially.
PYTEST_ARGS ?= -n 2 --dist worksteal

PORT ?= 8000

.PHONY: setup run chat test test-fast bench audit clean

$(VENV)/.torchinferno-setup: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.torchinferno-setup

run: setup
	$(TI) serve $(MODEL) --port $(PORT)

chat: setup
	$(TI) chat $(MODEL) "What is the capital of France?"

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: setup
	$(TI) bench-generate $(MODEL) --batch-sizes 1 8 --new-tokens 64 --dtype bfloat16 --compare-hf

audit: setup
	$(TI) audit

clean:
	rm -rf $(VENV) .pytest_cache
