# The two set-up commands (see README):
#   make demo   create .venv, install mxfp16[cpu,notebooks,onnx], run the main job
#   make test   the same venv plus the dev tools, then lint (ruff), the whole test suite,
#               then the newest-Python leg (test-newest) in a venv of its own
# Both take the interpreter from PYTHON (default python3): `make demo
# PYTHON=python3.13` works with any Python from 3.8 to 3.13 (a pyenv version
# that is installed but not selected is found too; tools/find-python).
# And one that is part of neither (it downloads about 2.3 GB):
#   make gpu-check   install mxfp16[gpu] into .venv-gpu and prove it loads (docs/gpu.md)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Wheels only: nothing is ever built from source (numpy 1.23.5 has no wheels
# for Python 3.12+, and its source build fails there).
PIP    := $(BIN)/python -m pip install --disable-pip-version-check -q --only-binary=:all: -c constraints.txt
DEPS   := setup.py setup.cfg constraints.txt

PYTHON_EXE := $(shell sh tools/find-python $(PYTHON))
PY_TAG     := $(if $(PYTHON_EXE),$(shell $(PYTHON_EXE) -c 'import sys; print("%d.%d" % sys.version_info[:2])'))

# MXNet 1.9.1's metadata asks for numpy<2, which has no wheels for Python
# 3.13: there its wheel goes in without its dependency list (the cpu extra
# brings the other two it declares), after everything else, and the import
# check below proves the stack loads.
install_mxnet = if $(1)/python -c 'import sys; sys.exit(sys.version_info < (3, 13))'; then \
	echo "Python $(PY_TAG): installing $(2) without its numpy<2 requirement (mxfp16 supplies what numpy 2 removed)"; \
	$(1)/python -m pip install --disable-pip-version-check -q --only-binary=:all: --no-deps $(2); fi
INSTALL_MXNET = $(call install_mxnet,$(BIN),mxnet==1.9.1)
CHECK_STACK   = $(BIN)/python -c 'import mxfp16.machine.stack as c; c.check_stack()'

.PHONY: demo test test-newest newest-leg docs info measure gpu-check clean

# Each `make demo` writes new run folders: the trainer refuses to overwrite a run.
DEMO_RUNS := runs/demo-$(shell date +%Y%m%d-%H%M%S)

# The venv remembers its Python: asking for another one rebuilds it.
$(VENV)/.python-$(PY_TAG):
	@test -n "$(PYTHON_EXE)" || { echo "error: no Python named '$(PYTHON)' runs here; name one, e.g. make $(or $(MAKECMDGOALS),demo) PYTHON=python3.12" >&2; exit 2; }
	@if [ -d $(VENV) ] && [ "$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$(PY_TAG)" ]; then \
		echo "$(VENV) holds another Python; rebuilding it with $(PYTHON_EXE)"; rm -rf $(VENV); fi
	@test -x $(BIN)/python || $(PYTHON_EXE) -m venv $(VENV)
	@# The pip a Python ships can be years old (3.8: pip 23.0), and its resolver then backtracks for many
	@# minutes through the notebook stack's wheels; the newest pip for that Python resolves it in seconds.
	$(BIN)/python -m pip install --disable-pip-version-check -q --only-binary=:all: --upgrade pip
	touch $@

# Stamp files: re-install only when the packaging files change.
$(VENV)/.demo-installed: $(DEPS) $(VENV)/.python-$(PY_TAG)
	$(PIP) -e '.[cpu,notebooks,onnx]'
	@$(INSTALL_MXNET)
	$(CHECK_STACK)
	touch $@

# d2l 1.0.3, a real client of numpy-mode Gluon (tests/test_d2l_models.py), goes in as a reader of the
# book installs it, without its pins (d2l asks for exact old versions of numpy, pandas, matplotlib ...,
# none of them with wheels for new Pythons); what its mxnet module imports is already there.
INSTALL_D2L = $(BIN)/python -m pip install --disable-pip-version-check -q --only-binary=:all: --no-deps d2l==1.0.3

$(VENV)/.test-installed: $(DEPS) $(VENV)/.python-$(PY_TAG)
	$(PIP) -e '.[cpu,notebooks,dev,onnx]'
	@$(INSTALL_MXNET)
	$(INSTALL_D2L)
	$(CHECK_STACK)
	touch $@

$(VENV)/.newest-installed: $(DEPS) $(VENV)/.python-$(PY_TAG)
	$(PIP) -e '.[cpu,notebooks,test,onnx]'
	@$(INSTALL_MXNET)
	$(INSTALL_D2L)
	$(CHECK_STACK)
	touch $@

# The main job (`mxfp16 demo`): the reference trainer on the demo set (generated
# on first use under data/). Its first line says what `auto` trains in here and
# why; then float32 against that precision, then the side-by-side comparison.
# Where auto is float32 (no bfloat16 on this CPU) it trains float32 once.
demo: $(VENV)/.demo-installed
	$(BIN)/mxfp16 demo --out $(DEMO_RUNS)

# Two pytest-xdist workers (the machine CI runs on has 2 cores), each file on one worker so a module's fixtures
# (the zoo's build, the docs site) are made once, in the order tests/conftest.py sets (longest files first, the
# notebooks last; xdist would otherwise reorder files by their number of tests); `make test PYTEST_WORKERS=0`
# runs in one process.
PYTEST_WORKERS ?= 2
PYTEST_XDIST   := $(if $(filter 0,$(PYTEST_WORKERS)),-n 0,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_XDIST)
	@$(MAKE) --no-print-directory test-newest

# The newest Python with numpy 2, in its own venv, on what differs on that stack
# (the main leg covers the rest): the names numpy 2 removed, what mxfp16 keeps out of MXNet's load (it
# reads the import machinery's frames) and MXNet's operator functions kept compiled (marshal's format and
# code objects are the Python's), the numpy scalars
# MXNet refuses (numpy compat, the training step, TensorBoard's histograms), the
# install (packaging), onnx and onnxruntime's builds for that Python (ONNX export
# and predict, also in a venv without MXNet), a short training run that learns,
# and one notebook in SMOKE mode.
# Skipped, with a line that says so, where that Python is absent or is the
# one the full suite just ran on. NEWEST_NUMPY puts another numpy 2 into the
# leg's venv before it runs (`make test-newest NEWEST_NUMPY=2.3.5`; numpy 2.3
# and 2.4 were checked that way); by default the one constraints.txt pins
# for Python 3.13, the newest numpy mxfp16 knows (a test keeps the two equal).
NEWEST        ?= 3.13
NEWEST_NUMPY  ?= 2.5.5
NEWEST_PYTHON := $(shell sh tools/find-python python$(NEWEST))
NEWEST_VENV   ?= .venv-newest
NEWEST_TESTS  := tests/test_numpy_compat.py tests/test_mxnet_import.py tests/test_packaging.py tests/test_step.py tests/test_tensorboard.py \
	tests/test_inference_onnx.py tests/test_train_learning.py \
	"tests/test_notebooks.py::test_notebook_runs_in_smoke_mode[01_float16_bfloat16_numbers]" \
	tests/test_operator_cache.py::test_the_next_import_compiles_nothing_and_gets_mxnets_own_functions_with_its_own_handles \
	tests/test_operator_cache.py::test_a_kept_function_takes_the_handle_of_the_process_that_uses_it

test-newest:
	@if [ -z "$(NEWEST_PYTHON)" ]; then \
		echo "newest-Python leg skipped: no Python $(NEWEST) on this machine"; \
	elif [ "$$($(NEWEST_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$(PY_TAG)" ]; then \
		echo "newest-Python leg skipped: the full suite above ran on Python $(PY_TAG)"; \
	else \
		echo "newest-Python leg: Python $(NEWEST) ($(NEWEST_PYTHON)) in $(NEWEST_VENV)"; \
		$(MAKE) --no-print-directory PYTHON=$(NEWEST_PYTHON) VENV=$(NEWEST_VENV) NEWEST_NUMPY=$(NEWEST_NUMPY) newest-leg; \
	fi

# The numpy goes in on every run (pip does nothing when it is already there), without the constraints file
# (which pins the default) and without touching the rest of the venv; the import check then proves MXNet loads.
newest-leg: $(VENV)/.newest-installed
	$(BIN)/python -m pip install --disable-pip-version-check -q --only-binary=:all: --no-deps 'numpy==$(NEWEST_NUMPY)'
	$(CHECK_STACK)
	@echo "newest-Python leg: numpy $$($(BIN)/python -c 'import numpy; print(numpy.__version__)')"
	$(BIN)/python -m pytest $(NEWEST_TESTS)

# The documentation site (notebooks rendered, CLI and API reference) into site/.
docs: $(VENV)/.test-installed
	$(BIN)/python -m mkdocs build --strict --site-dir site

info: $(VENV)/.demo-installed
	$(BIN)/mxfp16 info

# The whole benchmark table on this CPU within MEASURE_BUDGET minutes (default: tools/measure.py's), into
# docs/results/measure-<class>-<cpu>/ (docs/benchmarks.md, "One command for the whole table"). No install step: it
# runs with the venv's Python where there is one, else with PYTHON and this checkout, so a machine without network
# needs only MXNet's wheel.
MEASURE_BUDGET ?=
MEASURE_ARGS   ?=
MEASURE_PYTHON  = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON_EXE))

measure:
	@test -n "$(MEASURE_PYTHON)" || { echo "error: no Python named '$(PYTHON)' runs here; e.g. make measure PYTHON=python3.12" >&2; exit 2; }
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} $(MEASURE_PYTHON) tools/measure.py $(if $(MEASURE_BUDGET),--budget $(MEASURE_BUDGET)) $(MEASURE_ARGS)

# The GPU install in its own venv, on any Linux machine, GPU or not: every
# library libmxnet.so needs resolves, `import mxnet` works without
# LD_LIBRARY_PATH, `mxfp16 info` reports the GPUs (0 where there are none).
# pip's log (download sizes) and the install time go to $(GPU_VENV)/install.log.
GPU_VENV ?= .venv-gpu

$(GPU_VENV)/.gpu-installed: $(DEPS)
	$(PYTHON_EXE) -m venv $(GPU_VENV)
	@echo "installing mxfp16[gpu] into $(GPU_VENV) (about 2.3 GB of wheels; log: $(GPU_VENV)/install.log)"
	@start=$$(date +%s); \
	$(GPU_VENV)/bin/python -m pip install --disable-pip-version-check --only-binary=:all: -c constraints.txt -e '.[gpu]' \
		> $(GPU_VENV)/install.log 2>&1 || { tail -30 $(GPU_VENV)/install.log; exit 1; }; \
	$(call install_mxnet,$(GPU_VENV)/bin,mxnet-cu112==1.9.1); \
	echo "install_seconds=$$(( $$(date +%s) - start ))" >> $(GPU_VENV)/install.log
	touch $@

gpu-check: $(GPU_VENV)/.gpu-installed
	env -u LD_LIBRARY_PATH $(GPU_VENV)/bin/python tools/gpu/check.py --install-log $(GPU_VENV)/install.log \
		--json $(GPU_VENV)/gpu-check.json

clean:
	rm -rf $(VENV) $(GPU_VENV) $(NEWEST_VENV) site build *.egg-info
