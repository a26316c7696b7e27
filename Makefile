# Two set-up-and-go targets: `make demo` (the main job) and `make test`. Each creates the virtual
# environment it needs (.venv) with torch pinned by constraints.txt (the local CPU build).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint exactness bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,sweep]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hypergrad-run experiment=digits_schedule

test: $(STAMP)
	$(VENV)/bin/ruff check hypergrad tests experiments
	$(VENV)/bin/mypy
	$(PY) -m pytest

exactness: $(STAMP)
	$(PY) experiments/exactness.py --json exactness.json

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
