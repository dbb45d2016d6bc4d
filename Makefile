# Everything a fresh clone needs: `make demo` runs the main job, `make test` the tests.
# Both create .venv, install the pinned dependencies and build the C++ extension first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned together: the extension is compiled against this exact torch, and torchvision
# (the tests' oracle and benchmark peer) must be the release built for it.
PINS   := torch==2.14.1 torchvision==0.29.1
TOOLS  := pytest==9.2.0 hypothesis==6.170.15 matplotlib==3.11.2 numpy==2.4.6 mypy==2.4.1 onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2

# A second environment, only for tests/test_ptx.py under Triton 3.6.0, the Triton of
# torch 2.11 (the oldest torch the GPU path supports). Triton releases compile the same
# kernels to different PTX (3.6 turns tl.fdiv(..., ieee_rounding=True) into an
# approximate division, 3.8 does not), and that test proves the PTX exact without a GPU,
# so it must run under both. torch is there only for meta tensors: the small CPU build.
# roiops runs from the checkout (the test sets PYTHONPATH); compiling never loads the
# C++ extension, which is built for the pinned torch.
VENV_T36 := .venv-triton36
PINS_T36 := torch==2.13.0 triton==3.6.0 pytest==9.2.0

# A third environment with the oldest torch the package supports (pyproject.toml), where
# the whole suite runs again against roiops installed from a copy of the sources (the
# checkout's in-place build belongs to .venv), from outside the checkout so that Python
# finds that install. torchvision: the release built for that torch.
VENV_OLD := .venv-oldest
PINS_OLD := torch==2.6.0 torchvision==0.21.0

.PHONY: demo test test-triton36 test-oldest build bench bench-report gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: $(BIN)/python Makefile
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel ninja
	$(BIN)/python -m pip install -q $(PINS) $(TOOLS)
	touch $@

$(VENV)/.built: $(VENV)/.deps setup.py pyproject.toml $(wildcard roiops/csrc/*)
	$(BIN)/python -m pip install -q --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.built

demo: build
	$(BIN)/roiops demo

test: build $(VENV_T36)/.deps $(VENV_OLD)/.built
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory test-triton36
	$(MAKE) --no-print-directory test-oldest

$(VENV_T36)/bin/python:
	$(PYTHON) -m venv $(VENV_T36)

$(VENV_T36)/.deps: $(VENV_T36)/bin/python Makefile
	$(VENV_T36)/bin/python -m pip install -q $(PINS_T36)
	touch $@

test-triton36: $(VENV_T36)/.deps
	$(VENV_T36)/bin/python -m pytest -q tests/test_ptx.py

$(VENV_OLD)/bin/python:
	$(PYTHON) -m venv $(VENV_OLD)

$(VENV_OLD)/.deps: $(VENV_OLD)/bin/python Makefile
	$(VENV_OLD)/bin/python -m pip install -q --upgrade pip setuptools wheel ninja
	$(VENV_OLD)/bin/python -m pip install -q $(PINS_OLD) $(TOOLS)
	touch $@

$(VENV_OLD)/.built: $(VENV_OLD)/.deps setup.py pyproject.toml build_backend.py $(wildcard roiops/*.py roiops/*/*.py roiops/csrc/*)
	rm -rf $(VENV_OLD)/src && mkdir -p $(VENV_OLD)/src
	git ls-files -co --exclude-standard roiops setup.py pyproject.toml build_backend.py MANIFEST.in README.md \
		| tar --ignore-failed-read -cf - -T - 2>/dev/null | tar -xf - -C $(VENV_OLD)/src
	cd $(VENV_OLD)/src && ../bin/python -m pip install -q --no-build-isolation --no-deps .
	touch $@

test-oldest: $(VENV_OLD)/.built
	cd $(VENV_OLD) && bin/python -m pytest -q -p no:cacheprovider --rootdir=$(CURDIR) $(CURDIR)/tests

bench: build
	$(BIN)/roiops bench

# BENCHMARKS.md's tables and docs/bench_*.png from benchmarks/results/*.json
bench-report: build
	$(BIN)/python benchmarks/report.py

# On a GPU machine: its own torch, Triton and torchvision, nothing installed (see README).
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build *.egg-info roiops/_C*.so roiops/_build_info.py $(VENV)/.built $(VENV_OLD)/.built
