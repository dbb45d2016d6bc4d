# Everything a fresh clone needs: `make demo` runs the main job, `make test` the tests.
# Both create .venv, install the pinned dependencies and build the C++ extension first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Pinned together: the extension is compiled against this exact torch, and torchvision
# (the tests' oracle and benchmark peer) must be the release built for it.
PINS   := torch==2.14.1 torchvision==0.29.1
TOOLS  := pytest==9.2.0 matplotlib==3.11.2 numpy==2.4.6 mypy==2.4.1 onnx==1.23.2 onnxruntime==1.32.0 onnxscript==0.7.2

.PHONY: demo test build bench clean

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

test: build
	$(BIN)/python -m pytest -q

bench: build
	$(BIN)/roiops bench

clean:
	rm -rf build *.egg-info roiops/_C*.so $(VENV)/.built
