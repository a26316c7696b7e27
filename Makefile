# Two set-up-and-go targets: `make demo` (the main job) and `make test`. Each creates the virtual
# environment it needs (.venv) with torch pinned by constraints.txt (the local CPU build).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# hydra-optuna-sweeper pins optuna<3 (and SQLAlchemy<2): it cannot share .venv with the optuna 4+
# of the `compare` extra. Its pure-Python packages go to a folder of their own that one test puts
# first on PYTHONPATH for one subprocess (tests/test_sweep_optuna.py): a few MB in seconds,
# instead of a second venv with its own torch.
SWEEPER := $(VENV)/sweep-optuna
SWEEPER_PINS := "hydra-optuna-sweeper==1.3.0" "optuna==2.10.1" "sqlalchemy>=1.4,<2" \
	"alembic>=1.7,<1.14" "cmaes>=0.8.2,<0.11"
# hydra-submitit-launcher (SLURM, and submitit_local for a test): pure Python, its own folder too
# (tests/test_launchers.py), so .venv's packages stay as they are
SUBMITIT := $(VENV)/sweep-submitit
SUBMITIT_PINS := "hydra-submitit-launcher==1.2.0" "submitit==1.5.4"

.PHONY: demo test lint exactness bench clean vs-optuna

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,sweep,compare,tensorboard,peers,lm]"
	touch $(STAMP)

$(SWEEPER)/.installed: $(STAMP)
	rm -rf $(SWEEPER)
	$(PY) -m pip install -q --no-deps --target $(SWEEPER) $(SWEEPER_PINS)
	touch $(SWEEPER)/.installed

$(SUBMITIT)/.installed: $(STAMP)
	rm -rf $(SUBMITIT)
	$(PY) -m pip install -q --no-deps --target $(SUBMITIT) $(SUBMITIT_PINS)
	touch $(SUBMITIT)/.installed

demo: $(STAMP)
	$(VENV)/bin/hypergrad-run experiment=digits_schedule

# pytest runs one worker per core (pytest-xdist); tests/conftest.py gives each worker one thread
test: $(STAMP) $(SWEEPER)/.installed $(SUBMITIT)/.installed
	$(VENV)/bin/ruff check hypergrad tests experiments
	$(VENV)/bin/mypy
	$(PY) -m pytest -n auto

exactness: $(STAMP)
	$(PY) experiments/exactness.py --json exactness.json

vs-optuna: $(STAMP)
	$(PY) experiments/vs_optuna.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
