# The two set-up commands (see README):
#   make demo   create .venv, install mxfp16[cpu,notebooks], run the main job
#   make test   the same venv plus the dev tools, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
DEPS   := setup.py setup.cfg constraints.txt

.PHONY: demo test docs info clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files: re-install only when the packaging files change.
$(VENV)/.demo-installed: $(DEPS) | $(BIN)/python
	$(PIP) -e '.[cpu,notebooks]'
	touch $@

$(VENV)/.test-installed: $(DEPS) | $(BIN)/python
	$(PIP) -e '.[cpu,notebooks,dev]'
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/mxfp16 info

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest

info: $(VENV)/.demo-installed
	$(BIN)/mxfp16 info

clean:
	rm -rf $(VENV) site build *.egg-info
