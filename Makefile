# The project's commands. `make help` lists them. Everything runs in ./.venv, created on demand.
PYTHON ?= python3
VENV ?= .venv
PRESET ?= small
SET ?=
PY := $(VENV)/bin/python
AIAYN := $(VENV)/bin/aiayn
STAMP := $(VENV)/.installed
# pytest-xdist workers for `make test`: the suite is mostly fresh processes (TFX, servers,
# training subprocesses) that leave a core idle; one file stays on one worker (--dist loadfile),
# so a module's fixtures are built once.
TEST_WORKERS ?= 2
SETS := $(foreach s,$(SET),--set $(s))
# When make began (before the set-up): train.deadline_minutes counts the whole `make train`.
JOB_START := $(shell date +%s)
ARGS := --preset $(PRESET) $(SETS)

.DEFAULT_GOAL := help
.PHONY: help install system-deps train data vocab fit evaluate export serve translate test test-fast lint bench clean tfx

help: ## List the targets, one line each.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  Variables: PRESET=tiny|small|base|big (default small), SET='train.steps=100 decode.beam_size=1 decode.n_best=1'"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# setuptools' notice about mapped editable installs is not a problem here (the test
	@# tests/test_packaging.py checks the wheel); silence only that message.
	PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its test dependencies.

system-deps: ## Install the Debian packages: the default corpus (SWORD Bibles, mod2imp), a CJK font for plots.
	@bash pipeline/scripts/install_system_deps.sh

train: $(STAMP) system-deps ## The main job: data -> vocab -> train -> evaluate -> export (PRESET=small).
	$(AIAYN) run $(ARGS) --started-at $(JOB_START)

data: $(STAMP) system-deps ## Build train/dev/test TSVs and the data report from the default corpus.
	$(AIAYN) data $(ARGS)

vocab: $(STAMP) ## Train the joint SentencePiece vocabulary on the training split.
	$(AIAYN) vocab $(ARGS)

fit: $(STAMP) ## Train only (resumes an interrupted run).
	$(AIAYN) train $(ARGS)

evaluate: $(STAMP) ## Score the run on the test books with sacreBLEU.
	$(AIAYN) evaluate $(ARGS) --split test

export: $(STAMP) ## Write the versioned serving SavedModel.
	$(AIAYN) export $(ARGS)

serve: $(STAMP) ## Serve the export (TF Serving if installed, else the development server).
	$(AIAYN) serve $(ARGS)

tfx: $(STAMP) system-deps ## TFX pipeline locally (ExampleGen..Trainer, BLEU evaluation, infra check, Pusher: pushes only a blessed model, verified; Debian 13 root if needed).
	$(AIAYN) tfx-data $(ARGS)
	bash pipeline/scripts/tfx_env.sh run python -m aiayn.pipeline.cli tfx-run $(ARGS)

test: $(STAMP) ## Run the whole test suite (unit + slow integration tests, TEST_WORKERS=2 processes); lists the 30 slowest.
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=30 tests

test-fast: $(STAMP) ## Run the fast unit tests only.
	$(PY) -m pytest -q -m "not slow" tests

lint: $(STAMP) ## Lint the sources with ruff (config in pyproject.toml; `ruff check --fix .` fixes most).
	$(VENV)/bin/ruff check .

bench: $(STAMP) ## Run the bench/ scripts (each ends with one JSON line).
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean: ## Remove build outputs (keeps .venv, data and runs).
	rm -rf build dist *.egg-info .pytest_cache
