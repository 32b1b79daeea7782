# The two set-up commands (see README):
#   make demo   create .venv, install mxfp16[cpu,notebooks], run the main job
#   make test   the same venv plus the dev tools, then the whole test suite
# and one that is part of neither (it downloads about 2.3 GB):
#   make gpu-check   install mxfp16[gpu] into .venv-gpu and prove it loads (docs/gpu.md)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt
DEPS   := setup.py setup.cfg constraints.txt

.PHONY: demo test docs info gpu-check clean

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

# The GPU install in its own venv, on any Linux machine, GPU or not: every
# library libmxnet.so needs resolves, `import mxnet` works without
# LD_LIBRARY_PATH, `mxfp16 info` reports the GPUs (0 where there are none).
# pip's log (download sizes) and the install time go to $(GPU_VENV)/install.log.
GPU_VENV ?= .venv-gpu

$(GPU_VENV)/.gpu-installed: $(DEPS)
	$(PYTHON) -m venv $(GPU_VENV)
	@echo "installing mxfp16[gpu] into $(GPU_VENV) (about 2.3 GB of wheels; log: $(GPU_VENV)/install.log)"
	@start=$$(date +%s); \
	$(GPU_VENV)/bin/python -m pip install --disable-pip-version-check -c constraints.txt -e '.[gpu]' \
		> $(GPU_VENV)/install.log 2>&1 || { tail -30 $(GPU_VENV)/install.log; exit 1; }; \
	echo "install_seconds=$$(( $$(date +%s) - start ))" >> $(GPU_VENV)/install.log
	touch $@

gpu-check: $(GPU_VENV)/.gpu-installed
	env -u LD_LIBRARY_PATH $(GPU_VENV)/bin/python mxfp16/gpu/check.py --install-log $(GPU_VENV)/install.log \
		--json $(GPU_VENV)/gpu-check.json

clean:
	rm -rf $(VENV) $(GPU_VENV) site build *.egg-info
