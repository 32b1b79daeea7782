# The two set-up commands (see README):
#   make demo   create .venv, install mxfp16[cpu,notebooks], run the main job
#   make test   the same venv plus the dev tools, then the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
DEPS   := setup.py setup.cfg constraints.txt

.PHONY: demo test docs info clean

# Each `make demo` writes new run folders: the trainer refuses to overwrite a run.
DEMO_RUNS := runs/demo-$(shell date +%Y%m%d-%H%M%S)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Stamp files: re-install only when the packaging files change.
$(VENV)/.demo-installed: $(DEPS) | $(BIN)/python
	$(PIP) -e '.[cpu,notebooks]'
	touch $@

$(VENV)/.test-installed: $(DEPS) | $(BIN)/python
	$(PIP) -e '.[cpu,notebooks,dev]'
	touch $@

# The main job: the reference trainer on the demo set (generated on first use
# under data/), float32 against `auto` (amp-bfloat16 on a CPU with bfloat16,
# float16 on a GPU), then the side-by-side comparison.
demo: $(VENV)/.demo-installed
	$(BIN)/mxfp16 info
	$(BIN)/mxfp16 train --precision float32 --out $(DEMO_RUNS)/float32
	$(BIN)/mxfp16 train --precision auto --out $(DEMO_RUNS)/auto
	$(BIN)/mxfp16 compare $(DEMO_RUNS)/float32 $(DEMO_RUNS)/auto --out $(DEMO_RUNS)/compare

test: $(VENV)/.test-installed
	$(BIN)/python -m pytest

# The documentation site (notebooks rendered, CLI and API reference) into site/.
docs: $(VENV)/.test-installed
	$(BIN)/python -m mkdocs build --strict --site-dir site

info: $(VENV)/.demo-installed
	$(BIN)/mxfp16 info

clean:
	rm -rf $(VENV) site build *.egg-info
