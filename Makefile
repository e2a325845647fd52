# Each target creates the virtual environment and installs qhlab on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qhlab-installed
DEMO_CONFIG ?= examples/default-study.toml
DEMO_OUTPUT ?= runs/demo-study
# Where `make prepare` writes the demo's preparation records (default-study.toml names these).
PREPARATION ?= examples/preparation
# The offline CUDA node's Python (make device-wheels; docs/guide/hardware.md, "Check the GPU lane").
DEVICE_PYTHON ?= 3.12

.PHONY: venv demo prepare test test-fast lint bench clean-demo device-wheels

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: the pre-registered demo study on generated default populations.
demo: $(STAMP)
	$(VENV)/bin/qhlab study run $(DEMO_CONFIG) --output $(DEMO_OUTPUT)

# Re-derive the demo's preparation on its tuning population: the recipe's tuning (by planned MDE:
# every arm, six seeds, three trials: 90 fits), the pilot (75 fits on five TRAIN draws), the power
# plan (no fits) and the E0 check (the gate on 10 fresh TRAIN draws, 20 canaries; it gates the
# tuned recipe, so it runs after the tuning). Finished fits under PREPARATION/*/fits and finished
# gates under PREPARATION/*/studies are adopted, so an interrupted run resumes; the records are
# recomputed from them. The committed records are what `make demo` freezes against.
prepare: $(STAMP)
	rm -f $(PREPARATION)/demo-tune/tuning.json $(PREPARATION)/demo-tune/tuning.receipt.json \
		$(PREPARATION)/demo-tune/config.toml $(PREPARATION)/demo-pilot/config.toml \
		$(PREPARATION)/demo-tune/recipe.toml $(PREPARATION)/demo-pilot/pilot.json \
		$(PREPARATION)/demo-pilot/pilot.receipt.json $(PREPARATION)/demo-plan/config.toml \
		$(PREPARATION)/demo-plan/plan.json $(PREPARATION)/demo-plan/plan.md \
		$(PREPARATION)/demo-plan/plan.receipt.json $(PREPARATION)/demo-e0/config.toml \
		$(PREPARATION)/demo-e0/e0.json $(PREPARATION)/demo-e0/e0.receipt.json \
		$(PREPARATION)/tiny-e0/config.toml $(PREPARATION)/tiny-e0/e0.json $(PREPARATION)/tiny-e0/e0.receipt.json
	$(VENV)/bin/qhlab tune examples/demo-tune.toml --output $(PREPARATION)/demo-tune
	$(VENV)/bin/qhlab pilot examples/demo-pilot.toml --output $(PREPARATION)/demo-pilot
	$(VENV)/bin/qhlab plan examples/demo-plan.toml --output $(PREPARATION)/demo-plan || test $$? -eq 1
	$(VENV)/bin/qhlab e0-check examples/demo-e0.toml --output $(PREPARATION)/demo-e0
	$(VENV)/bin/qhlab e0-check examples/tiny-e0.toml --output $(PREPARATION)/tiny-e0

# The whole suite: the linters (ruff: lint and format; import-linter: the layers of pyproject.toml),
# then the fast unit tests, end-to-end (slow) runs and the reliability suite, on every core
# (pytest-xdist: each test file, and the reliability suite, runs on one worker; tests/conftest.py).
test: lint
	$(PY) -m pytest -m "" -q -p no:cacheprovider --timeout=1800 -n auto --dist loadfile

# Fast CPU unit tests only (the default selection).
test-fast: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	for script in bench/*.py; do $(PY) $$script || exit 1; done

clean-demo:
	rm -rf $(DEMO_OUTPUT)

# On a connected machine: the wheels an offline CUDA node lacks (pymunk, pydantic, wandb, pytest and
# their requirements) for Python $(DEVICE_PYTHON), pinned by constraints.txt, into device-wheels/
# (<= 60 MiB, MANIFEST.json). Copy the tree with it and run `python3 scripts/device-check` there.
device-wheels:
	$(PYTHON) scripts/prepare-device-wheels --python-version $(DEVICE_PYTHON) --output device-wheels
