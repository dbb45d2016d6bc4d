# Everything a fresh clone needs: `make demo` runs the main job, `make test` the tests.
# Both create .venv, install the pinned dependencies and build roiops' wheel first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The environment that builds the wheel and runs the main suite. torchvision (the tests'
# oracle and benchmark peer) must be the release built for its torch.
PINS   := torch==2.14.1 torchvision==0.29.1 numpy==2.4.6
TOOLS  := pytest==9.2.0 hypothesis==6.170.15 matplotlib==3.11.2 mypy==2.4.1 onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2

# One wheel, built once in .venv: its C++ kernels use LibTorch's stable ABI, so the same
# file runs under every torch from the oldest one pyproject.toml admits. `make test` runs
# the whole suite with it installed under two other torch releases, from outside the
# checkout so that Python imports the installed wheel: the oldest supported torch
# (.venv-oldest, whose Triton 3.6 is also the oldest the GPU path supports, so the PTX
# checks of tests/test_ptx.py run there too) and one between (.venv-middle). The checkout
# itself runs with the wheel's compiled library copied beside its sources: the same binary
# everywhere.
WHEEL_DIR := dist
VENV_OLD  := .venv-oldest
# numpy before 2.4 there: the Triton interpreter of torch 2.11 (Triton 3.6) converts
# one-element arrays to scalars, which numpy 2.4 refuses.
PINS_OLD  := torch==2.11.0 torchvision==0.26.0 triton==3.6.0
NUMPY_OLD := numpy==2.3.5
VENV_MID  := .venv-middle
PINS_MID  := torch==2.12.1 torchvision==0.27.1 triton==3.7.1
NUMPY_MID := numpy==2.4.6
# What those torch releases require besides the CUDA libraries (their METADATA).
TORCH_DEPS := filelock typing-extensions sympy networkx jinja2 fsspec pillow "cuda-bindings>=13.0.3,<14"

SOURCES := setup.py pyproject.toml README.md $(wildcard roiops/*.py roiops/*/*.py roiops/csrc/*)

.PHONY: demo test test-oldest test-other-torch build build-oldest bench bench-report gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: $(BIN)/python Makefile
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel ninja
	$(BIN)/python -m pip install -q $(PINS) $(TOOLS)
	touch $@

# The wheel, installed in .venv (the `roiops` command), its library copied into the checkout.
$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	rm -rf $(WHEEL_DIR) roiops/_C*.so
	$(BIN)/python -m pip wheel -q --no-build-isolation --no-deps --wheel-dir $(WHEEL_DIR) .
	$(BIN)/python -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/roiops-*.whl
	$(BIN)/python -c "import glob, zipfile; w = zipfile.ZipFile(glob.glob('$(WHEEL_DIR)/roiops-*.whl')[0]); \
		[w.extract(n, '.') for n in w.namelist() if n.startswith('roiops/_C')]"
	touch $@

build: $(VENV)/.built

demo: build
	$(BIN)/roiops demo

test: build $(VENV_OLD)/.built $(VENV_MID)/.built
	$(BIN)/python -m pytest -q
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_OLD) PYTEST_ARGS=$(CURDIR)/tests/test_ptx.py
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_MID)
	$(MAKE) --no-print-directory build-oldest

# The sources also compile against the oldest supported torch's own headers, as a source
# install there (or the GPU machine's build) does.
build-oldest: $(VENV_OLD)/.deps
	rm -rf $(VENV_OLD)/src && mkdir -p $(VENV_OLD)/src
	git ls-files -co --exclude-standard roiops setup.py pyproject.toml README.md | tar -cf - -T - | tar -xf - -C $(VENV_OLD)/src
	cd $(VENV_OLD)/src && ../bin/python -m pip wheel -q --no-build-isolation --no-deps --wheel-dir dist .

# Another torch release with the wheel built in .venv, installed as is.
%/bin/python:
	$(PYTHON) -m venv $*

$(VENV_OLD)/.deps: PINS_ENV := $(PINS_OLD) $(NUMPY_OLD)
$(VENV_MID)/.deps: PINS_ENV := $(PINS_MID) $(NUMPY_MID)
# setuptools 81: new enough for pyproject.toml's license field (77), as old as torch 2.11
# and 2.12 require (< 82). The CUDA libraries these torch builds load at import (4 GB,
# CUDA 13 for every supported torch on PyPI) are .venv's, linked rather than copied,
# so that a CI machine's disk holds the three environments: torch, torchvision and Triton
# go in without their dependencies, which come from TORCH_DEPS.
$(VENV_OLD)/.deps $(VENV_MID)/.deps: %/.deps: %/bin/python Makefile $(VENV)/.deps
	$*/bin/python -m pip install -q --upgrade pip wheel ninja setuptools==81.0.0
	$*/bin/python -m pip install -q $(filter numpy%,$(PINS_ENV)) $(TORCH_DEPS) $(TOOLS)
	$*/bin/python -m pip install -q --no-deps $(filter-out numpy%,$(PINS_ENV))
	ln -sfn "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nvidia" \
		"$$($*/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/nvidia"
	touch $@

$(VENV_OLD)/.built $(VENV_MID)/.built: %/.built: %/.deps $(VENV)/.built
	$*/bin/python -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/roiops-*.whl
	touch $@

test-oldest: $(VENV_OLD)/.built
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_OLD) PYTEST_ARGS=$(CURDIR)/tests/test_ptx.py

# The other torch releases run the same library and kernels, whose numbers the whole suite
# checks under the pinned torch; they run what depends on the release: loading the wheel
# and its C++ ABI, the op registration with fake kernels and autograd (the kernel contract
# on every backend, Triton's interpreter included), torch.compile, export, ONNX, TorchScript
# and fx, autocast and DDP, the Modules and drop-ins, and torchvision's peers.
# tests/test_ptx.py runs under the pinned Triton and under 3.6 (.venv-oldest), the pair it
# is written for; under torch 2.12's Triton 3.7.1 one of its variants does not compile
# (README, "Supported"), so .venv-middle leaves it out.
OTHER_TORCH_TESTS := install declare api contract compile export onnx script_fx autocast distributed modules \
	compat_peers multi_scale triton
test-other-torch:
	cd $(ENV) && bin/python -m pytest -q -p no:cacheprovider --rootdir=$(CURDIR) \
		$(foreach t,$(OTHER_TORCH_TESTS),$(CURDIR)/tests/test_$(t).py) $(PYTEST_ARGS)

bench: build
	$(BIN)/roiops bench

# BENCHMARKS.md's tables and docs/bench_*.png from benchmarks/results/*.json
bench-report: build
	$(BIN)/python benchmarks/report.py

# On a GPU machine: its own torch, Triton and torchvision, nothing installed (see README).
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build $(WHEEL_DIR) *.egg-info roiops/_C*.so $(VENV)/.built $(VENV_OLD)/.built $(VENV_MID)/.built
