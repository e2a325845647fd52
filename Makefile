# Each target creates the virtual environment and installs qhlab on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.qhlab-installed
DEMO_CONFIG ?= examples/default-study.toml
DEMO_OUTPUT ?= runs/demo-study

.PHONY: venv demo test test-fast bench clean-demo

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: the pre-registered demo study on generated default populations.
demo: $(STAMP)
	$(VENV)/bin/qhlab study run $(DEMO_CONFIG) --output $(DEMO_OUTPUT)

# The whole suite: fast unit tests, end-to-end (slow) runs and the reliability suite.
test: $(STAMP)
	$(PY) -m pytest -m "" -q -p no:cacheprovider --timeout=1800

# Fast CPU unit tests only (the default selection).
test-fast: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	for script in bench/*.py; do $(PY) $$script || exit 1; done

clean-demo:
	rm -rf $(DEMO_OUTPUT)
